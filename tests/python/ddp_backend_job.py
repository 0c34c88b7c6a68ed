"""A job's program for tests/python/test_binding.py: the `deadpool` torch.distributed backend.
Every step checks dist.all_reduce (float32, float64, bfloat16, int64 x SUM, AVG, MAX, MIN, also
started with async_op=True and waited for later), broadcast, all_gather and barrier against
values computed locally (unless the step failed: dpt.failed()), then trains a small DDP model. Before the loop it checks the errors
(an allreduce before the loop, an unsupported op, a subgroup). Rank 0 writes OUT/ddp.pt and
OUT/checks.txt (how many checks passed, on which ranks and steps). A check that fails exits 3."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import deadpool.torch as dpt

out = sys.argv[1]
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
dist.init_process_group("deadpool", init_method="deadpool://")
world = dist.get_world_size()


def fail(msg):
    sys.stderr.write("ddp_backend_job: rank %d: %s\n" % (dist.get_rank(), msg))
    sys.exit(3)


def raises(fn, text):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 — any error naming the problem
        if text not in str(e):
            fail("expected an error with %r, got %r" % (text, str(e)))
        return
    fail("expected an error with %r, none raised" % text)


raises(lambda: dist.all_reduce(torch.ones(2)), "before the loop")
if dist.get_rank() in (0, 1):  # a subgroup's members create it (the others get NON_GROUP_MEMBER)
    raises(lambda: dist.new_group([0, 1]), "new_group")
if dist.get_rank() not in range(-1, world):
    fail("rank %d outside [-1, %d)" % (dist.get_rank(), world))

torch.manual_seed(11)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ddp = DDP(model)
data = torch.randn(512, 7, generator=torch.Generator().manual_seed(5))
checks = 0


def expect(name, got, want):
    global checks
    if dpt.failed():  # a peer failed in this step: its collectives ran locally, the step rolls back
        return
    if not torch.equal(got, want):
        fail("%s: got %s, expected %s" % (name, got.tolist(), want.tolist()))
    checks += 1


for step in dpt.steps(ddp, opt):
    rank = dist.get_rank()
    vals = [torch.arange(4, dtype=torch.float64) * (r + 1) + step for r in range(world)]  # every rank's input
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
        for op, want in ((dist.ReduceOp.SUM, sum(vals)), (dist.ReduceOp.MAX, torch.stack(vals).max(0).values),
                         (dist.ReduceOp.MIN, torch.stack(vals).min(0).values), (dist.ReduceOp.AVG, sum(vals) / world)):
            if op == dist.ReduceOp.AVG and dtype == torch.int64:
                continue
            t = vals[rank].to(dtype).clone()  # .to of the same dtype is the tensor itself
            dist.all_reduce(t, op=op)
            expect("all_reduce %s %s" % (dtype, op), t, want.to(dtype))
    raises(lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.PRODUCT), "SUM, AVG, MAX and MIN")
    # Started now, waited for after other work: completed in the order started.
    a, b = vals[rank].float().clone(), (vals[rank] * 2).float()
    wa, wb = dist.all_reduce(a, async_op=True), dist.all_reduce(b, async_op=True)
    root = step % world
    c = torch.full((3,), float(rank))
    dist.broadcast(c, root)
    wb.wait()
    wa.wait()
    expect("async all_reduce a", a, sum(vals).float())
    expect("async all_reduce b", b, (sum(vals) * 2).float())
    expect("broadcast", c, torch.full((3,), float(root)))
    parts = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([rank, step], dtype=torch.int64))
    expect("all_gather", torch.stack(parts), torch.tensor([[r, step] for r in range(world)], dtype=torch.int64))
    dist.barrier()
    rows = data[[(37 * step + 11 * rank + i) % 512 for i in range(16)]]
    loss = torch.nn.functional.mse_loss(ddp(rows[:, :6]), rows[:, 6:])
    opt.zero_grad()
    loss.backward()
    opt.step()

if dist.get_rank() == 0:
    torch.save(model.state_dict(), os.path.join(out, "ddp.pt"))
    with open(os.path.join(out, "checks.txt"), "w") as f:
        f.write("%d\n" % checks)
sys.exit(dpt.finish())
