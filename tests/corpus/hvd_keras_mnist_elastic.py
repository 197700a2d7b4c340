# Horovod's example "tensorflow2_keras_mnist_elastic.py" (github.com/horovod/horovod,
# examples/elastic/tensorflow2; Apache-2.0), in its own idiom: argparse at the top, hvd.init(),
# GPUs pinned by local rank, a per-rank MNIST file, a Keras Sequential convnet, Adam scaled by
# hvd.size() inside hvd.DistributedOptimizer, one warm-up fit() to create the optimizer's state,
# hvd.elastic.KerasState with a reset callback, the three elastic callbacks, checkpoints from
# rank 0, and training under @hvd.elastic.run. Written for this corpus, not copied; what
# differs (Keras 3, the data, CI's time) is listed in tests/corpus/__init__.py (CORPUS).
import argparse

import tensorflow as tf
import horovod.tensorflow.keras as hvd

import mnist_local  # corpus: MNIST's shapes, made locally (no network)

parser = argparse.ArgumentParser(description="Tensorflow 2.0 Keras MNIST Example")
parser.add_argument("--use-mixed-precision", action="store_true", default=False,
                    help="use mixed precision for training")
args = parser.parse_args()

if args.use_mixed_precision:
    tf.keras.mixed_precision.set_global_policy("mixed_float16")

# Horovod: initialize Horovod.
hvd.init()

# Horovod: one GPU per process, by local rank
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

(mnist_images, mnist_labels), _ = mnist_local.load_data(path="mnist-%d.npz" % hvd.rank())  # corpus: local data

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(128)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
    tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation="softmax"),
])

# Horovod: the learning rate grows with the number of workers
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: the distributed optimizer averages the gradients
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

# corpus: Keras 3's compile() has no experimental_run_tf_function argument
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

# Horovod: one step creates the optimizer's state, so that it can be synchronised
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    # corpus: Keras 3 has no optimizer.lr nor backend.set_value: learning_rate.assign()
    state.model.optimizer.learning_rate.assign(0.001 * hvd.size())
    # one step again, with the ranks there are now
    state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)


state.register_reset_callbacks([on_state_reset])

callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
]

# Horovod: checkpoints from worker 0 only
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint("./checkpoint-{epoch}.keras"))  # corpus: Keras 3 saves .keras


# Horovod: fewer steps per worker as workers are added
@hvd.elastic.run
def train(state):
    # corpus: 16 steps' worth of data and 3 epochs (example: 500 and 24), CI's time
    state.model.fit(dataset, steps_per_epoch=16 // hvd.size(), epochs=3 - state.epoch,
                    callbacks=callbacks, verbose=1)


train(state)
