"""A tiny LightningModule trained by lightning.Trainer with DDP on CPU (gloo), 2 processes,
with torchtriage's callback. Usage: python lightning_ddp.py ROOT_DIR [MAX_STEPS]."""

import logging
import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchtriage.integrations.lightning import LOGGER, TorchtriageCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    torch.set_num_threads(1)
    logging.getLogger(LOGGER).addHandler(logging.FileHandler(f"{sys.argv[1]}/verdict.log"))
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 32), torch.randn(1024, 1))
    trainer = pl.Trainer(
        default_root_dir=sys.argv[1], max_steps=int(sys.argv[2]) if len(sys.argv) > 2 else 16,
        accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[TorchtriageCallback()])
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
