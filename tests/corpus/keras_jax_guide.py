# Keras' guide "Multi-GPU distributed training with JAX" (keras.io/guides/
# distributed_training_with_jax), in its own idiom: the guide's calls in the guide's order -- a
# device mesh from mesh_utils over jax.local_devices(), the model, optimizer and loss, build(),
# a jitted train step over model.stateless_call and optimizer.stateless_apply, variables
# replicated with jax.device_put(NamedSharding(mesh, P())), every batch split over the devices
# along "batch", and the trained state written back into the model. Written for this corpus,
# not copied; what differs from the guide is listed in tests/corpus/__init__.py (CORPUS).
import os

os.environ["KERAS_BACKEND"] = "jax"

import jax
import numpy as np
import tensorflow as tf
import keras

from jax.experimental import mesh_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import mnist_local  # corpus: MNIST's shapes, made locally (no network)


def get_model():
    # a small convnet: rescaling, three convolutions with batch normalization, pooling,
    # a dense layer with dropout, ten logits
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Rescaling(1.0 / 255.0)(inputs)
    x = keras.layers.Conv2D(filters=12, kernel_size=3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(scale=False, center=True)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(filters=24, kernel_size=6, use_bias=False, strides=2)(x)
    x = keras.layers.BatchNormalization(scale=False, center=True)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(filters=32, kernel_size=6, padding="same", strides=2, name="large_k")(x)
    x = keras.layers.BatchNormalization(scale=False, center=True)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dropout(0.5)(x)
    outputs = keras.layers.Dense(10)(x)
    return keras.Model(inputs, outputs)


def get_datasets():
    (x_train, y_train), (x_test, y_test) = mnist_local.load_data()  # corpus: local data

    # float images of shape (28, 28, 1)
    x_train = np.expand_dims(x_train.astype("float32"), -1)
    x_test = np.expand_dims(x_test.astype("float32"), -1)
    print("x_train shape:", x_train.shape)
    print(x_train.shape[0], "train samples")
    print(x_test.shape[0], "test samples")

    train_data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    eval_data = tf.data.Dataset.from_tensor_slices((x_test, y_test))
    return train_data, eval_data


num_epochs = 2
batch_size = 64

train_data, eval_data = get_datasets()
train_data = train_data.batch(batch_size, drop_remainder=True)

model = get_model()
optimizer = keras.optimizers.Adam(1e-3)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

# build() creates every variable, from one batch
(one_batch, one_batch_labels) = next(iter(train_data))
model.build(one_batch)
optimizer.build(model.trainable_variables)


def compute_loss(trainable_variables, non_trainable_variables, x, y):
    # the pure forward pass Keras offers
    y_pred, updated_non_trainable_variables = model.stateless_call(
        trainable_variables, non_trainable_variables, x
    )
    return loss(y, y_pred), updated_non_trainable_variables


compute_gradients = jax.value_and_grad(compute_loss, has_aux=True)


@jax.jit
def train_step(train_state, x, y):
    trainable_variables, non_trainable_variables, optimizer_variables = train_state
    (loss_value, non_trainable_variables), grads = compute_gradients(
        trainable_variables, non_trainable_variables, x, y
    )
    trainable_variables, optimizer_variables = optimizer.stateless_apply(
        optimizer_variables, grads, trainable_variables
    )
    return loss_value, (trainable_variables, non_trainable_variables, optimizer_variables)


def get_replicated_train_state(devices):
    # a spec that names no axis: every variable whole on every device
    var_mesh = Mesh(devices, axis_names=("_"))
    var_replication = NamedSharding(var_mesh, P())
    trainable_variables = jax.device_put(model.trainable_variables, var_replication)
    non_trainable_variables = jax.device_put(model.non_trainable_variables, var_replication)
    optimizer_variables = jax.device_put(optimizer.variables, var_replication)
    return (trainable_variables, non_trainable_variables, optimizer_variables)


num_devices = len(jax.local_devices())
print(f"Running on {num_devices} devices: {jax.local_devices()}")
devices = mesh_utils.create_device_mesh((num_devices,))

# batches are split along their first axis, "batch"
data_mesh = Mesh(devices, axis_names=("batch",))
data_sharding = NamedSharding(data_mesh, P("batch"))

# how one batch lies on the devices
x, y = next(iter(train_data))
sharded_x = jax.device_put(x.numpy(), data_sharding)
print("Data sharding")
jax.debug.visualize_array_sharding(jax.numpy.reshape(sharded_x, [-1, 28 * 28]))

train_state = get_replicated_train_state(devices)

for epoch in range(num_epochs):
    for x, y in iter(train_data):
        sharded_x = jax.device_put(x.numpy(), data_sharding)
        loss_value, train_state = train_step(train_state, sharded_x, y.numpy())
    print("Epoch", epoch, "loss:", loss_value)

# the trained state back into the model
trainable_variables, non_trainable_variables, optimizer_variables = train_state
for variable, value in zip(model.trainable_variables, trainable_variables):
    variable.assign(value)
for variable, value in zip(model.non_trainable_variables, non_trainable_variables):
    variable.assign(value)
