# Keras' guide "Multi-GPU distributed training with PyTorch" (keras.io/guides/
# distributed_training_with_torch), in its own idiom: the guide's calls in the guide's order --
# a torch training loop, setup_device() with MASTER_ADDR/MASTER_PORT and
# torch.distributed.init_process_group(init_method="env://", world_size, rank), a
# DistributedSampler and DataLoader, the Keras model in DistributedDataParallel, cleanup() with
# destroy_process_group(), and one process per device from
# torch.multiprocessing.start_processes(..., start_method="fork") under __main__. Written for
# this corpus, not copied; what differs from the guide (the CPU in place of CUDA, the data) is
# listed in tests/corpus/__init__.py (CORPUS), each with its reason.
import os

os.environ["KERAS_BACKEND"] = "torch"

import torch
import numpy as np
import keras

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


def get_dataset():
    (x_train, y_train), (x_test, y_test) = mnist_local.load_data()  # corpus: local data

    # float images of shape (28, 28, 1)
    x_train = np.expand_dims(x_train.astype("float32"), -1)
    x_test = np.expand_dims(x_test.astype("float32"), -1)
    print("x_train shape:", x_train.shape)

    return torch.utils.data.TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))


def train_model(model, dataloader, num_epochs, optimizer, loss_fn):
    for epoch in range(num_epochs):
        running_loss = 0.0
        running_loss_count = 0
        for batch_idx, (inputs, targets) in enumerate(dataloader):
            inputs = inputs.to(device, non_blocking=True)  # corpus: the CPU (guide: .cuda())
            targets = targets.to(device, non_blocking=True)

            outputs = model(inputs)
            loss = loss_fn(outputs, targets)

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            running_loss += loss.item()
            running_loss_count += 1

        print(f"Epoch {epoch + 1}/{num_epochs}, Loss: {running_loss / running_loss_count}")


num_gpu = 2  # corpus: two CPU processes (guide: torch.cuda.device_count())
num_epochs = 2
batch_size = 64
device = torch.device("cpu")  # corpus: the CPU (guide: cuda:<index> in setup_device)
print(f"Running on {num_gpu} GPUs")


def setup_device(current_gpu_index, num_gpus):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "56492"
    torch.distributed.init_process_group(
        backend="gloo",  # corpus: gloo on the CPU (guide: nccl, and torch.cuda.set_device)
        init_method="env://",
        world_size=num_gpus,
        rank=current_gpu_index,
    )


def cleanup():
    torch.distributed.destroy_process_group()


def prepare_dataloader(dataset, current_gpu_index, num_gpus, batch_size):
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=num_gpus, rank=current_gpu_index, shuffle=False
    )
    return torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=batch_size, shuffle=False)


def per_device_launch_fn(current_gpu_index, num_gpu):
    setup_device(current_gpu_index, num_gpu)

    dataset = get_dataset()
    model = get_model()

    dataloader = prepare_dataloader(dataset, current_gpu_index, num_gpu, batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()

    model = model.to(device)  # corpus: the CPU, so DDP without device_ids
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)

    train_model(ddp_model, dataloader, num_epochs, optimizer, loss_fn)

    cleanup()


if __name__ == "__main__":
    # "fork", not "spawn", so that it works from a notebook
    torch.multiprocessing.start_processes(
        per_device_launch_fn,
        args=(num_gpu,),
        nprocs=num_gpu,
        join=True,
        start_method="fork",
    )
