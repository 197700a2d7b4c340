# Keras' guide "Multi-GPU distributed training with TensorFlow" (keras.io/guides/
# distributed_training_with_tensorflow), in its own idiom: the guide's calls in the guide's order
# -- its own tf.distribute.MirroredStrategy(), model and compile() in strategy.scope(), fit()
# and evaluate() on tf.data, then its section "Using callbacks to ensure fault tolerance"
# (ModelCheckpoint every epoch, make_or_restore_model(), run_training() twice, the second
# resuming from the latest checkpoint). Written for this corpus, not copied; what differs from
# the guide is listed in tests/corpus/__init__.py (CORPUS), each with its reason.
import os

os.environ["KERAS_BACKEND"] = "tensorflow"

import tensorflow as tf
import keras

import mnist_local  # corpus: MNIST's shapes, made locally (no network)


def get_compiled_model():
    # two dense hidden layers over the flattened image, ten logits
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 512  # corpus: of 2048 local images (the guide keeps 10000 of MNIST's 60000)

    (x_train, y_train), (x_test, y_test) = mnist_local.load_data()  # corpus: local data
    x_train = x_train.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255
    y_train = y_train.astype("float32")
    y_test = y_test.astype("float32")

    # the last num_val_samples training images validate
    x_val, y_val = x_train[-num_val_samples:], y_train[-num_val_samples:]
    x_train, y_train = x_train[:-num_val_samples], y_train[:-num_val_samples]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
    )


# One replica per device the strategy finds.
strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

with strategy.scope():
    # whatever creates variables is created in the scope
    model = get_compiled_model()

    train_dataset, val_dataset, test_dataset = get_dataset()
    model.fit(train_dataset, epochs=2, validation_data=val_dataset)

    model.evaluate(test_dataset)


# -- fault tolerance: a checkpoint every epoch, and training that resumes from the latest
checkpoint_dir = "./ckpt"
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)


def make_or_restore_model():
    # the newest checkpoint if there is one, else a new model
    checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    return get_compiled_model()


def run_training(epochs=1):
    strategy = tf.distribute.MirroredStrategy()

    with strategy.scope():
        model = make_or_restore_model()

        callbacks = [
            # one .keras file per epoch, the epoch in its name
            keras.callbacks.ModelCheckpoint(
                filepath=checkpoint_dir + "/ckpt-{epoch}.keras",
                save_freq="epoch",
            )
        ]
        model.fit(
            train_dataset,
            epochs=epochs,
            callbacks=callbacks,
            validation_data=val_dataset,
            verbose=2,
        )


# The first call creates the model ...
run_training(epochs=1)

# ... the second goes on from the checkpoint the first one left.
run_training(epochs=1)
