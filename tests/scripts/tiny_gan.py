"""A tiny GAN with two optimizers per iteration, in the style of pytorch/examples dcgan: the
discriminator steps on a real and a fake batch (two backward calls), then the generator steps
(one backward call); one DataLoader batch per iteration.

    --steps N   iterations (default 12)
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
NZ, FEATURES, BATCH = 16, 64, 32
data = TensorDataset(torch.randn(BATCH * args.steps, FEATURES))
loader = DataLoader(data, batch_size=BATCH, shuffle=True)
netG = torch.nn.Sequential(torch.nn.Linear(NZ, 128), torch.nn.ReLU(),
                           torch.nn.Linear(128, FEATURES), torch.nn.Tanh())
netD = torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.LeakyReLU(0.2),
                           torch.nn.Linear(128, 1), torch.nn.Sigmoid())
criterion = torch.nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
real_label, fake_label = 1.0, 0.0

for i, (real,) in enumerate(loader):
    # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
    netD.zero_grad()
    label = torch.full((real.size(0),), real_label)
    errD_real = criterion(netD(real).view(-1), label)
    errD_real.backward()
    noise = torch.randn(real.size(0), NZ)
    fake = netG(noise)
    label.fill_(fake_label)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    errD = errD_real + errD_fake
    optimizerD.step()
    # (2) Update G: maximize log(D(G(z)))
    netG.zero_grad()
    label.fill_(real_label)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optimizerG.step()
    print(f"[{i}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f}")
