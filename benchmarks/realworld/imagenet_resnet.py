"""ImageNet-style ResNet-18 training on FakeData, in the style of pytorch/examples' main.py.

torchvision is not required: ``resnet18`` is written out below (BasicBlock, [2, 2, 2, 2])
and ``FakeImageNet`` makes a random uint8 image per index and applies the usual training
transform per sample in torch: random-resized crop, horizontal flip, scale to [0, 1] and
normalise with the ImageNet mean/std. The loader uses ``-j 4`` workers and pinned memory, as
main.py does. ``--fixed`` is the hand fix: as many workers as cores, persistent workers,
channels_last, and bf16 autocast on CUDA.

    python imagenet_resnet.py -a resnet18 -b 256 -j 4 --steps 100
    python imagenet_resnet.py -a resnet18 -b 256 --steps 100 --fixed
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class FakeImageNet(Dataset):
    def __init__(self, size: int, image_size: int, num_classes: int, crop: int) -> None:
        self.size, self.image_size, self.num_classes, self.crop = (size, image_size,
                                                                   num_classes, crop)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        img = torch.randint(0, 256, (3, self.image_size, self.image_size), dtype=torch.uint8,
                            generator=g)
        # RandomResizedCrop(crop, scale=(0.08, 1.0))
        area = self.image_size ** 2 * float(torch.empty(1).uniform_(0.08, 1.0, generator=g))
        side = max(8, min(self.image_size, int(area ** 0.5)))
        top = int(torch.randint(0, self.image_size - side + 1, (1,), generator=g))
        left = int(torch.randint(0, self.image_size - side + 1, (1,), generator=g))
        patch = img[:, top:top + side, left:left + side].float().unsqueeze(0)
        patch = F.interpolate(patch, size=(self.crop, self.crop), mode="bilinear",
                              align_corners=False).squeeze(0)
        if torch.rand(1, generator=g) < 0.5:  # RandomHorizontalFlip
            patch = patch.flip(-1)
        patch = (patch / 255.0 - MEAN) / STD  # ToTensor + Normalize
        target = int(torch.randint(0, self.num_classes, (1,), generator=g))
        return patch, target


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers, num_classes=1000, width=64):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width * 8, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


MODELS = {"resnet18": [2, 2, 2, 2], "resnet34": [3, 4, 6, 3]}


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (FakeData)")
    parser.add_argument("-a", "--arch", default="resnet18", choices=sorted(MODELS))
    parser.add_argument("-j", "--workers", default=4, type=int, help="data loading workers")
    parser.add_argument("--epochs", default=90, type=int)
    parser.add_argument("-b", "--batch-size", default=256, type=int)
    parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", default=10, type=int)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", default=None, type=int, help="stop after this many steps")
    parser.add_argument("--image-size", default=256, type=int, help="FakeData image side")
    parser.add_argument("--crop", default=224, type=int)
    parser.add_argument("--width", default=64, type=int, help="ResNet base width")
    parser.add_argument("--num-classes", default=1000, type=int)
    parser.add_argument("--train-size", default=1_281_167, type=int)
    parser.add_argument("--fixed", action="store_true",
                        help="the hand fix: workers = cores, channels_last, bf16 autocast")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = ResNet(MODELS[args.arch], args.num_classes, args.width).to(device)
    memory_format = torch.channels_last if args.fixed else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    dataset = FakeImageNet(args.train_size, args.image_size, args.num_classes, args.crop)
    workers = (os.cpu_count() or 1) if args.fixed else args.workers
    train_loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                              num_workers=workers, pin_memory=device.type == "cuda",
                              persistent_workers=args.fixed and workers > 0)
    use_amp = args.fixed and device.type == "cuda"

    step = 0
    for epoch in range(args.epochs):
        model.train()
        end = time.time()
        for i, (images, target) in enumerate(train_loader):
            data_time = time.time() - end
            images = images.to(device, non_blocking=True, memory_format=memory_format)
            target = target.to(device, non_blocking=True)
            amp = (torch.autocast("cuda", dtype=torch.bfloat16) if use_amp
                   else contextlib.nullcontext())
            with amp:
                output = model(images)
                loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if i % args.print_freq == 0:
                print(f"Epoch: [{epoch}][{i}/{len(train_loader)}]\tTime {time.time() - end:.3f}"
                      f"\tData {data_time:.3f}\tLoss {loss.item():.4e}", flush=True)
            end = time.time()
            if args.steps is not None and step >= args.steps:
                return


if __name__ == "__main__":
    main()
