"""cnn.py — examples/torch/cnn_ddp.py written for deadpool.torch (DDP removed; docs/PYTORCH.md).

    deadpool run --workers 3 --spares 1 --steps 100 -- /usr/bin/python3 examples/torch/cnn.py
"""
import argparse
import os
import sys

import deadpool.torch as dpt
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_batch(seed, step, rank, batch=32, classes=10):
    """Images of 16x16: a class's fixed pattern plus noise; a pure function of (seed, step, rank)."""
    patterns = torch.randn(classes, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank + 1)
    labels = torch.randint(0, classes, (batch,), generator=g)
    return patterns[labels] + 0.8 * torch.randn(batch, 3, 16, 16, generator=g), labels


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    ft = dpt.FaultTolerant()
    a.seed, a.out = ft.seed, ft.out_dir
    torch.manual_seed(a.seed)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if not ft.join(model, opt):
        sys.exit(ft.finish())
    for step in ft.steps():
        x, y = make_batch(a.seed, step, ft.rank)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if not ft.reduce_gradients(loss):
            continue
        opt.step()
        ft.commit()
    sys.exit(ft.finish(lambda: torch.save(model.state_dict(), os.path.join(a.out, "cnn.pt"))))


if __name__ == "__main__":
    main()
