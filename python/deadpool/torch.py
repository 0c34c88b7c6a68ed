"""deadpool.torch — a PyTorch training loop under DeadPool.

    import deadpool.torch as dpt
    ft = dpt.FaultTolerant()                     # joins the job: rank, world, seed, steps
    torch.manual_seed(ft.seed)
    model, opt = Model(), torch.optim.AdamW(...)
    if not ft.join(model, opt): sys.exit(ft.finish())    # spares wait here
    for step in ft.steps():                      # the steps to run; after a failure, from the rollback
        loss = model(*batch(step, ft.rank, ft.world))
        opt.zero_grad(); loss.backward()
        if not ft.reduce_gradients(loss): continue   # a failed step: DeadPool rolls back
        opt.step()
        ft.commit()
    sys.exit(ft.finish(lambda: torch.save(model.state_dict(), ft.out_dir + "/model.pt")))

What DeadPool keeps for the loop, every step, in host memory and on a peer:
  - the module's state (parameters and buffers) and every optimizer state tensor, from the
    step it exists (AdamW makes its moments at the first step). They are moved into a few
    flat buffers that the tensors then view (as DDP's gradient buckets and FSDP's flat
    parameters do): the Parameter objects, the module and the optimizer the loop holds stay
    the same, and a restore writes into them in place;
  - the optimizer's non-tensor state and its param_groups' hyper-parameters (lr ...);
  - with rng=True the CPU generator's state, and the state_dict of each object in
    `stateful` (a data cursor, an LR scheduler): this rank's own state.

Two shapes of data parallelism:
  - plain (zero=False): every rank holds the same parameters and optimizer state
    (DP_IDENTICAL regions); gradients are averaged in a fixed order, every rank steps the
    whole optimizer;
  - ZeRO-1 (zero=True): the parameters are partitioned among the ranks as torch's
    ZeroRedundancyOptimizer does (largest first, to the rank with the least), each rank's
    optimizer steps only its own (its param_groups are filtered in place), its parameters and
    their optimizer state are its own state (DP_SHARDED), and the parameters are gathered
    after the update with one allgather.

Host memory only: a tensor on a CUDA device is refused with a clear error. The layout is made
for it (see _Flat in _ft.py): a device tensor would keep its flat buffer on the device and a
pinned host mirror of it, filled by a non-blocking copy on a side stream after the update and
waited for at commit; DeadPool snapshots and replicates the mirror.

The machinery lives in _ft.py; this module is its public face and registers the backend.
"""
from . import Error
from ._ft import FaultTolerant, partition
# torch.distributed's `deadpool` backend (registered on import) and its loop. The dependency goes one
# way: this module imports distributed.py, which builds on _ft.py's FaultTolerant and imports neither.
from .distributed import failed, finish, steps

__all__ = ["FaultTolerant", "partition", "Error", "steps", "failed", "finish"]
