"""A DCGAN-shaped loop (pytorch/examples dcgan, small and on CPU): the discriminator's forward
and a BCELoss module outside it, the generator's forward, two optimizers per iteration."""

import torch
from torch import nn

torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
netD = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
real = torch.randn(64, 16)
for _ in range(14):
    # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
    netD.zero_grad()
    label = torch.full((64, 1), 1.0)
    output = netD(real)
    errD_real = criterion(output, label)
    errD_real.backward()
    noise = torch.randn(64, 8)
    fake = netG(noise)
    label.fill_(0.0)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    optimizerD.step()
    # (2) update G: maximize log(D(G(z)))
    netG.zero_grad()
    label.fill_(1.0)
    output = netD(fake)
    errG = criterion(output, label)
    errG.backward()
    optimizerG.step()
print("done")
