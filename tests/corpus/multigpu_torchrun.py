# PyTorch's example "multigpu_torchrun.py" (github.com/pytorch/examples, distributed/
# ddp-tutorial-series; BSD-3-Clause), in its own idiom: launched by torchrun, ddp_setup() with
# init_process_group(backend) from torchrun's variables, a Trainer that reads LOCAL_RANK, wraps
# the model in DDP, loads a snapshot when one exists (so a second launch resumes) and saves one
# from rank 0 every save_every epochs, a DistributedSampler, destroy_process_group() at the end,
# and argparse's total_epochs, save_every and --batch_size under __main__. Here the model is a
# Keras model (Keras on PyTorch: a torch.nn.Module). Written for this corpus, not copied; what
# differs from the example is listed in tests/corpus/__init__.py (CORPUS), each with its reason.
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import torch
from torch.utils.data import Dataset, DataLoader
from datautils import MyTrainDataset

from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group


def ddp_setup():
    init_process_group(backend="gloo")  # corpus: gloo on the CPU (example: nccl, and set_device)


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cpu")  # corpus: the CPU (example: the GPU LOCAL_RANK names)
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)  # corpus: the CPU, so no device_ids

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = torch.nn.CrossEntropyLoss()(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        for source, targets in self.train_data:
            source = source.to(self.device)
            targets = targets.to(self.device)
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, "snapshot.pt")
        print(f"Epoch {epoch} | Training snapshot saved at snapshot.pt")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = MyTrainDataset(2048)  # load your dataset
    # load your model -- corpus: a Keras model (example: torch.nn.Linear(20, 1))
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(4)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)  # corpus: lr 1e-3 -> 1e-1 (few steps)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=False,  # corpus: no GPU to pin for
                      shuffle=False, sampler=DistributedSampler(dataset))


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, help="Input batch size on each device (default: 32)")
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size)
