"""The data of the torchrun example (its ``datautils.MyTrainDataset``, the example's "load your
dataset"), made learnable: 20 features, a class 0-3 that a linear model can tell from them.
The example's own draws random targets; here the loss can fall, and the test checks that it does."""

import torch
from torch.utils.data import Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)  # every rank holds the same samples
        self.x = torch.randn(size, 20, generator=generator)
        self.y = self.x[:, :4].argmax(dim=1)
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.x[index], self.y[index]
