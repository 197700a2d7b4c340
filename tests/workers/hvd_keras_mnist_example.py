# The training body of Horovod 0.28.1's examples/tensorflow2/tensorflow2_keras_mnist.py
# (Apache-2.0, Uber Technologies), run unchanged except for the lines marked
#   "Keras 3:"   what Keras 3 itself demands, and
#   "test:"      no network (a local MNIST-shaped .npz) and a few steps instead of 24 epochs.
# The preamble below the imports does what kdist's horovod strategy does on an engine
# before a cell: kdist_magics.keras_horovod.install().
#
# Usage: python hvd_keras_mnist_example.py OUTDIR   (OUTDIR holds mnist.npz; results go there)

import json
import os
import sys

import numpy as np

import kdist_magics.keras_horovod  # test: kdist's engine preamble
kdist_magics.keras_horovod.install()  # test: kdist's engine preamble

import tensorflow as tf

import horovod
import horovod.tensorflow.keras as hvd


def train():
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    # test: a local MNIST-shaped file instead of downloading MNIST
    with np.load('mnist.npz') as f:
        (mnist_images, mnist_labels) = f['x_train'], f['y_train']

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
                 tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000).batch(128)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    # Keras 3: compile() has no `experimental_run_tf_function` argument.
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'])

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),

        # Horovod: average metrics among workers at the end of every epoch.
        #
        # Note: This callback must be in the list before the ReduceLROnPlateau,
        # TensorBoard or other metrics-based callbacks.
        hvd.callbacks.MetricAverageCallback(),

        # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
        # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
        # the first three epochs. See https://arxiv.org/abs/1706.02677 for details.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]

    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        # Keras 3: checkpoints are `.keras` files.
        callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.keras'))

    # Horovod: write logs on worker 0.
    verbose = 1 if hvd.rank() == 0 else 0

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    # test: 8 samples' worth of steps and 2 epochs instead of 500 and 24.
    mnist_model.fit(dataset, steps_per_epoch=8 // hvd.size(), callbacks=callbacks, epochs=2, verbose=verbose)

    # Return the model
    return mnist_model


if __name__ == '__main__':
    # test: run in OUTDIR and record what the test checks
    os.chdir(sys.argv[1])
    model = train()
    result = {"rank": hvd.rank(), "size": hvd.size(), "hvd_module": hvd.__name__,
              "history": {k: [float(v) for v in vs] for k, vs in model.history.history.items()},
              "iterations": int(np.asarray(model.optimizer.iterations))}
    if hvd.rank() == 0:
        restored = hvd.load_model('checkpoint-2.keras')
        result["restored_optimizer"] = type(restored.optimizer).__name__
        result["restored_is_distributed"] = hasattr(restored.optimizer, "register_local_var")
        result["restored_iterations"] = int(np.asarray(restored.optimizer.iterations))
        result["restored_matches"] = all(
            np.array_equal(a, b) for a, b in zip(restored.get_weights(), model.get_weights()))
    np.savez(f"example-rank{hvd.rank()}.npz",
             **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    with open(f"example-rank{hvd.rank()}.json", "w") as f:
        json.dump(result, f)
