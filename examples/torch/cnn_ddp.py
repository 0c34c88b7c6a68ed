"""cnn_ddp.py — a small convolutional network learns to tell ten generated image classes apart,
data-parallel with DistributedDataParallel, written the ordinary way:

    torchrun --nproc_per_node 3 examples/torch/cnn_ddp.py --steps 100 --out out

Under DeadPool, DDP kept: examples/torch/cnn_ddp_deadpool.patch (6 lines; docs/PYTORCH.md),

    patch -o /tmp/cnn_ddp_deadpool.py examples/torch/cnn_ddp.py examples/torch/cnn_ddp_deadpool.patch
    deadpool run --workers 3 --spares 1 --steps 100 -- /usr/bin/python3 /tmp/cnn_ddp_deadpool.py --steps 100

examples/torch/cnn.py is this program written for deadpool.torch instead; docs/PYTORCH.md shows both diffs.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


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
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp = DDP(model)
    for step in range(a.steps):
        x, y = make_batch(a.seed, step, rank)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print("step %d loss %.4f" % (step + 1, loss.item()), flush=True)
    if rank == 0:
        os.makedirs(a.out, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(a.out, "cnn.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
