"""A Lightning fit as users write one: a small CNN on an in-memory image set whose epochs are
short (a few dozen batches), DataLoaders with worker processes (not persistent), validation
after every epoch."""
import argparse

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--accelerator", default="auto")
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--train-size", type=int, default=1024)
p.add_argument("--val-size", type=int, default=256)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--image-size", type=int, default=32)
a = p.parse_args()


class Images(Dataset):
    def __init__(self, n, seed):
        g = np.random.default_rng(seed)
        self.x = g.integers(0, 255, (n, 3, a.image_size, a.image_size), dtype=np.uint8)
        self.y = g.integers(0, 10, n)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = torch.from_numpy(self.x[i]).float().div_(255)
        if np.random.rand() < 0.5:
            x = x.flip(-1)
        return (x - 0.5) / 0.25, int(self.y[i])


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.body(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.body(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


train = DataLoader(Images(a.train_size, 0), batch_size=a.batch_size, shuffle=True,
                   num_workers=a.workers)
val = DataLoader(Images(a.val_size, 1), batch_size=a.batch_size, num_workers=a.workers)
trainer = L.Trainer(max_epochs=a.epochs, accelerator=a.accelerator, devices=1, logger=False,
                    enable_checkpointing=False, enable_model_summary=False)
trainer.fit(Net(), train, val)
