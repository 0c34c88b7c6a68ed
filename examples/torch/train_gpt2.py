"""train_gpt2.py — GPT-2 in PyTorch, written the way nanoGPT is, trained data-parallel under
DeadPool with deadpool.torch, or with --ddp as an ordinary DistributedDataParallel program:
under torchrun over gloo, or under `deadpool run` over the `deadpool` backend.

    deadpool run --workers 3 --spares 1 --steps 50 --seed 1 -- /usr/bin/python3 examples/torch/train_gpt2.py
    torchrun --nproc_per_node 3 examples/torch/train_gpt2.py --ddp --steps 50 --seed 1 --out out
    deadpool run --workers 3 --spares 1 --steps 50 -- /usr/bin/python3 examples/torch/train_gpt2.py --ddp --steps 50 --out out

With no arguments it trains a small model on the built-in generated corpus; under DeadPool the
steps, the seed and the output directory are the job's, and the final weights go to
OUT/model.pt (the same bytes for the same configuration and seed, with or without failures).
It runs on the CPU and is deterministic: batches are a function of (seed, step, rank), the
threads are fixed, and the gradients are averaged in a fixed order.
"""
import argparse
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F


# --- the model ------------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("mask", mask, persistent=False)  # derived, not state

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizer(self, lr, weight_decay):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def get_lr(step, steps, lr, min_lr, warmup):
    """Linear warmup, then cosine decay to min_lr (nanoGPT's)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    ratio = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (lr - min_lr)


# --- data -----------------------------------------------------------------------------------

M64 = (1 << 64) - 1


def mix64(x):
    """splitmix64's finaliser (src/common/rng.h): batches are a pure function of their indices."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def builtin_corpus(nbytes=1 << 20):
    """The built-in corpus of the C trainer (src/gpt2/data.c): a small grammar, bytewise."""
    subjects = ["the king", "a young knight", "the old queen", "my lord", "the fool", "a wise woman",
                "the merchant", "our captain", "the shepherd", "her brother"]
    verbs = ["loves", "betrays", "follows", "remembers", "forgives", "fears", "praises", "defends", "mocks",
             "awaits"]
    objects = ["the crown", "his sword", "the northern sea", "a silver ring", "the quiet garden", "an honest heart",
               "the burning city", "her father", "the morning", "the gods"]
    endings = [".", ", and the night is long.", ", for the hour is late.", "; so it was written.", "!",
               ", as the bells ring."]
    out, n, i = [], 0, 0
    while n < nbytes:
        h = mix64(i)
        line = "%s %s %s%s\n" % (subjects[h % 10], verbs[(h >> 8) % 10], objects[(h >> 16) % 10],
                                 endings[(h >> 24) % 6])
        out.append(line)
        n += len(line)
        i += 1
    return torch.tensor(list("".join(out).encode()), dtype=torch.long), 256


SHARD_MAGIC = 20240520  # llm.c's token shards: 256 int32 of header, then uint16 tokens


def load_data(path):
    """Tokens and vocabulary size: an llm.c token shard (GPT-2's 50257), else bytes of text."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) >= 1024 and struct.unpack("<i", raw[:4])[0] == SHARD_MAGIC:
        n = struct.unpack("<i", raw[8:12])[0]
        if len(raw) != 1024 + 2 * n:
            sys.exit("%s: the header says %d tokens, the file holds %d bytes after it" % (path, n, len(raw) - 1024))
        return torch.frombuffer(bytearray(raw[1024:]), dtype=torch.int16).to(torch.long) & 0xFFFF, 50257
    if len(raw) < 2:
        sys.exit("%s: empty" % path)
    return torch.tensor(list(raw), dtype=torch.long), 256


def get_batch(tokens, seed, step, rank, batch, block):
    """Rank `rank`'s rows of step `step`'s global batch: each row's window a hash of its place."""
    windows = tokens.numel() - block - 1
    offs = [mix64(mix64(mix64(seed) ^ step) ^ (rank * batch + b)) % windows for b in range(batch)]
    x = torch.stack([tokens[o:o + block] for o in offs])
    y = torch.stack([tokens[o + 1:o + 1 + block] for o in offs])
    return x, y


# --- the loop -------------------------------------------------------------------------------

def options():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="llm.c token shard or text file (default: the built-in corpus)")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--block", type=int, default=64, help="sequence length")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (fixed: determinism)")
    p.add_argument("--zero", action="store_true", help="ZeRO-1: each rank owns a slice of the optimizer state")
    p.add_argument("--ddp", action="store_true", help="the DistributedDataParallel program: under torchrun (gloo), "
                   "or under deadpool run over the deadpool backend")
    p.add_argument("--bucket-mb", type=float, default=25, help="gradient bucket size, MiB (DeadPool's and DDP's)")
    p.add_argument("--steps", type=int, default=50, help="--ddp only (without --ddp, under DeadPool: the job's)")
    p.add_argument("--seed", type=int, default=1337, help="--ddp only (without --ddp, under DeadPool: the job's)")
    p.add_argument("--out", default="out", help="--ddp only (without --ddp, under DeadPool: the job's)")
    p.add_argument("--ckpt-every", type=int, default=0, help="--ddp only: torch.save a checkpoint every N steps "
                   "and resume from it when torchrun restarts the workers")
    return p.parse_args()


def build(a, seed):
    torch.manual_seed(seed)
    tokens, vocab = load_data(a.data) if a.data else builtin_corpus()
    if a.n_embd % a.n_head:
        sys.exit("--n-embd %d is not a multiple of --n-head %d" % (a.n_embd, a.n_head))
    model = GPT(vocab, a.block, a.n_layer, a.n_head, a.n_embd)
    return tokens, model, model.configure_optimizer(a.lr, a.weight_decay)


def train_deadpool(a):
    import deadpool.torch as dpt
    ft = dpt.FaultTolerant()
    tokens, model, opt = build(a, ft.seed)
    if not ft.join(model, opt, zero=a.zero, bucket_mb=a.bucket_mb):
        return ft.finish()
    for step in ft.steps():
        x, y = get_batch(tokens, ft.seed, step, ft.rank, a.batch, a.block)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        if not ft.reduce_gradients(loss):
            continue  # a failed step: DeadPool rolls every rank back and the steps go on
        lr = get_lr(step, ft.num_steps, a.lr, a.min_lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        ft.commit(tokens=a.batch * a.block * ft.world)
    path = os.path.join(ft.out_dir, "model.pt")
    return ft.finish(lambda: torch.save(model.state_dict(), path) or path)


def train_ddp(a):
    """The torchrun + DDP program. Under `deadpool run` the same program over the `deadpool`
    backend: the seven lines marked DeadPool are the whole difference (docs/PYTORCH.md)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dp = "DEADPOOL_JOB" in os.environ  # DeadPool
    if dp:
        import deadpool.torch as dpt  # DeadPool
    dist.init_process_group("deadpool", init_method="deadpool://") if dp else dist.init_process_group("gloo")  # DeadPool
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens, model, opt = build(a, a.seed)
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb)
    ckpt, start = os.path.join(a.out, "ckpt.pt"), 0
    if a.ckpt_every and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        if rank == 0:
            print("resumed from %s after step %d" % (ckpt, start), flush=True)
    t0 = time.time()
    for step in dpt.steps(ddp, opt, a.steps) if dp else range(start, a.steps):  # DeadPool
        rank = dist.get_rank()  # DeadPool: a spare learns its rank when it takes one
        x, y = get_batch(tokens, a.seed, step, rank, a.batch, a.block)
        loss = ddp(x, y)
        opt.zero_grad()
        loss.backward()
        lr = get_lr(step, a.steps, a.lr, a.min_lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        if rank == 0:
            now = time.time()
            print("step %d/%d loss %.4f %.1f ms t=%.3f" % (step + 1, a.steps, loss.item(), (now - t0) * 1e3, now), flush=True)
            t0 = now
        if a.ckpt_every and (step + 1) % a.ckpt_every == 0 and rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    if rank == 0:
        os.makedirs(a.out, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(a.out, "model.pt"))
    dist.destroy_process_group()
    return dpt.finish() if dp else 0  # DeadPool


def main():
    a = options()
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    return train_ddp(a) if a.ddp else train_deadpool(a)


if __name__ == "__main__":
    sys.exit(main())
