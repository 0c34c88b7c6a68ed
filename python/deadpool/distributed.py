"""deadpool.distributed — torch.distributed's `deadpool` backend: a DistributedDataParallel
program under DeadPool, DDP kept.

    import deadpool.torch as dpt                           # registers the backend
    dist.init_process_group("deadpool", init_method="deadpool://")
    model, opt = Net(), torch.optim.SGD(...)
    ddp = DDP(model)                                       # a spare builds it too, before it has a rank
    for step in dpt.steps(ddp, opt, a.steps):              # a spare waits here until it takes a rank
        x, y = batch(step, dist.get_rank())
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()       # DDP's buckets over DeadPool's collectives
    if dist.get_rank() == 0: torch.save(model.state_dict(), "model.pt")
    sys.exit(dpt.finish())

The process group runs DDP's bucket allreduces (and dist.all_reduce, broadcast, all_gather,
barrier) as DeadPool's authenticated, deterministic collectives (dp_iallreduce ...), completed
in the order started from one thread: DDP's futures. A failure never raises through torch: the
pending collectives complete with the local bytes, the step is marked failed, the optimizer's
step is skipped, and steps() recovers (every rank rolls back to the newest generation all of
them committed) and goes on from there with the same process group, now over the new epoch's
members. The state (module, optimizer, rng and `stateful` objects) is what deadpool.torch keeps.

What a collective does depends on the phase (the process group's state machine):
  SETUP   before steps() joined (DDP's constructor, a spare that waits): broadcast, allgather
          and barrier are local (the join makes the state identical: rank 0's is broadcast to
          the initial members, a spare restores a failed rank's); an allreduce is an error;
  STEP    inside a step: DeadPool's collectives; the step's first calls dp_step_before_reduce;
  IDLE    between steps and during a recovery: any collective is an error;
  DONE    every step done: DeadPool's collectives, waited for at once; a failure raises.
"""
import queue
import sys
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.rendezvous import register_rendezvous_handler

from . import Error, Job, Op, Role, Status
from ._ft import FaultTolerant  # beneath both this module and deadpool.torch: imports neither

__all__ = ["steps", "failed", "finish", "ProcessGroupDeadPool"]

SETUP, STEP, IDLE, DONE = "setup", "step", "idle", "done"

_OPS = {dist.ReduceOp.SUM: Op.SUM, dist.ReduceOp.AVG: Op.MEAN, dist.ReduceOp.MAX: Op.MAX, dist.ReduceOp.MIN: Op.MIN}

_run = None  # this process's one _Run (a process is one rank of one job)


def _completed(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return _create_work_from_future(fut)


class _Completer:
    """One thread that waits for the started collectives in the order they were started and
    completes their futures (DDP's reducer waits on them): with the result, or with the local
    bytes and the step marked failed (a future completed with an exception crashes torch 1.13)."""

    def __init__(self, run):
        self._run, self._q, self._cv, self._pending = run, queue.Queue(), threading.Condition(), 0
        threading.Thread(target=self._loop, name="deadpool-completer", daemon=True).start()

    def put(self, req, fut, value, after):
        with self._cv:
            self._pending += 1
        self._q.put((req, fut, value, after))

    def settle(self):
        """Waits until every started collective completed."""
        with self._cv:
            self._cv.wait_for(lambda: self._pending == 0)

    def _loop(self):
        while True:
            req, fut, value, after = self._q.get()
            try:
                st = req.wait() if req is not None else Status.FAILED
                if st == Status.OK and after is not None:
                    after()
            except Exception as e:  # a wait that raised: the step cannot be trusted
                self._run.job.log("a collective failed: %s: %s" % (type(e).__name__, e))
                st = Status.FAILED
            if st != Status.OK:
                self._run.failed = True
            try:
                fut.set_result(value)
            finally:
                with self._cv:
                    self._pending -= 1
                    self._cv.notify_all()


class _Store(dist.Store):
    """The store torch's init_process_group wants: local. torch's store-based barrier after
    creating the group is answered at once (DeadPool's join is the barrier that counts)."""

    def __init__(self, world):
        super().__init__()
        self._d, self._world = {}, world

    def set(self, key, value):
        self._d[key] = value

    def get(self, key):
        if key not in self._d:
            raise Error("deadpool backend: the store holds no %r (the store is local to this process)" % key)
        return self._d[key]

    def add(self, key, value):
        if "store_based_barrier_key" in key:
            return self._world
        self._d[key] = self._d.get(key, 0) + value
        return self._d[key]

    def wait(self, keys, timeout=None):
        missing = [k for k in keys if k not in self._d]
        if missing:
            raise Error("deadpool backend: the store holds no %r (the store is local to this process)" % missing)


class ProcessGroupDeadPool(dist.ProcessGroup):
    """The job's ranks as a torch process group. rank() is -1 for a spare until it takes a
    rank; size() is the job's world (fixed: a spare takes a failed rank's exact place)."""

    def __init__(self, run):
        super().__init__(max(run.job.rank, 0), run.world)
        self._r = run

    def rank(self):
        return -1 if self._r.job.role == Role.SPARE else self._r.job.rank

    def size(self):
        return self._r.world

    def getBackendName(self):
        return "deadpool"

    def allreduce(self, tensors, opts=None):
        t = _one(tensors, "allreduce")
        op = _OPS.get(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if op is None:
            raise Error("deadpool backend: allreduce supports SUM, AVG, MAX and MIN, found %s" % opts.reduceOp)
        local = (lambda: None) if self._r.settling else None  # our own bucket pass (see _settle_buckets)
        return self._r.collective("allreduce", lambda: self._r.job.iallreduce(t, op), tensors, local=local)

    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "broadcast")
        if not t.is_contiguous():
            raise Error("deadpool backend: broadcast needs a contiguous tensor")
        root = opts.rootRank if opts is not None else 0
        return self._r.collective("broadcast", lambda: self._r.job.ibroadcast(t, root), tensors, local=lambda: None)

    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "allgather").contiguous()
        outs = _one(output_tensors, "allgather")
        if len(outs) != self._r.world or any(o.numel() != inp.numel() or o.dtype != inp.dtype for o in outs):
            raise Error("deadpool backend: allgather needs %d outputs like the input (%d x %s)"
                        % (self._r.world, inp.numel(), inp.dtype))
        flat = torch.empty(self._r.world * inp.numel(), dtype=inp.dtype)

        def copy_out():
            for r, o in enumerate(outs):
                o.copy_(flat[r * inp.numel():(r + 1) * inp.numel()].view_as(o))

        def local():
            for o in outs:
                o.copy_(inp.view_as(o))
        return self._r.collective("allgather", lambda: self._r.job.iallgather(inp, flat), output_tensors,
                                  after=copy_out, local=local)

    def _allgather_base(self, output, input, opts=None):
        def local():
            output.copy_(input.reshape(-1).repeat(self._r.world).view_as(output))
        return self._r.collective("allgather", lambda: self._r.job.iallgather(input, output), [output], local=local)

    def barrier(self, opts=None):
        one = torch.zeros(1, dtype=torch.int64)
        return self._r.collective("barrier", lambda: self._r.job.iallreduce(one, Op.SUM), [one], local=lambda: None)


def _one(tensors, what):
    if len(tensors) != 1:
        raise Error("deadpool backend: %s takes one tensor (one device per process), found %d" % (what, len(tensors)))
    return tensors[0]


class _Run:
    """This process's job, its process group and the loop's step state."""

    def __init__(self):
        try:
            self.job = Job()
        except Error as e:
            sys.stderr.write("deadpool: %s\n" % e)
            raise SystemExit(getattr(e, "exit_status", 1))
        self.world = self.job.world
        self.phase, self.settling, self.failed = SETUP, False, False
        self.step, self.began, self.updated, self.final = None, None, False, None
        self.ft, self.ddp = None, None
        self.completer = _Completer(self)

    # --- collectives, by phase ---
    def collective(self, what, start, value, after=None, local=None):
        if self.phase == SETUP:
            if local is None:
                raise Error("deadpool backend: %s before the loop: collectives run inside `for step in dpt.steps(...)` "
                            "(before it only DDP's construction, whose broadcast and allgather are local)" % what)
            local()
            return _completed(value)
        if self.phase == IDLE:
            raise Error("deadpool backend: %s outside a step (between steps or during a recovery)" % what)
        if self.phase == DONE:
            req = start()
            st = req.wait() if req is not None else Status.FAILED
            if st != Status.OK:
                raise Error("deadpool backend: %s after the last step failed (%s): a peer left" % (what, st))
            if after is not None:
                after()
            return _completed(value)
        if self.failed or not self.begin_reduce():
            return _completed(value)  # the step failed already: it is rolled back, nothing goes out
        fut = torch.futures.Future()
        self.completer.put(start(), fut, value, after)
        return _create_work_from_future(fut)

    def begin_reduce(self):
        """The step's first collective: dp_step_before_reduce (the previous generation commits)."""
        if self.began is None:
            self.began = self.job.before_reduce(self.step)
            if self.began != Status.OK:
                self.fail(self.began)
        return self.began == Status.OK

    def before_update(self):
        """Before the optimizer changes the state: every collective of the step completed and
        none failed, then dp_step_before_update. False: skip the update (the step failed)."""
        self.completer.settle()
        if self.failed or not self.begin_reduce():
            return False
        if not self.updated:
            st = self.job.before_update()
            if st != Status.OK:
                self.fail(st)
                return False
            self.updated = True
        return True

    def fail(self, st):
        if st == Status.FAILED:
            self.failed = True
        else:
            self.failed, self.final = True, st

    # --- the loop ---
    def join(self, model, optimizer, stateful, rng):
        from torch.nn.parallel import DistributedDataParallel
        if not isinstance(model, DistributedDataParallel):
            raise Error("steps: expected the DistributedDataParallel model (built over the deadpool process group), "
                        "found %s" % type(model).__name__)
        if model.process_group is not dist.distributed_c10d._get_default_group():
            raise Error("steps: the DistributedDataParallel model must use the default (deadpool) process group")
        self.ddp = model
        was_spare = self.job.role == Role.SPARE
        self.ft = FaultTolerant(job=self.job)
        if not self.ft.join_state(model.module, optimizer, stateful, rng):
            self.end(self.ft.final)
        self._wrap_optimizer()
        self.phase = IDLE
        if not was_spare:
            self._same_start()
        self._settle_buckets()

    def _same_start(self):
        """As DDP's constructor does for a group that exists already: rank 0's module state to
        every initial member (here, since DDP was built before the job's collectives were)."""
        for state in self.ft.state_buffers():
            if self.job.broadcast(state, 0) != Status.OK:
                self.failed = True
                return

    def _settle_buckets(self):
        """DDP rebuilds its buckets once, after its first backward pass, in the order the
        gradients arrived, agreed with a broadcast from rank 0. A spare's DDP would do that at
        its first step while the survivors did long ago: other buckets, another broadcast. So
        every process settles its buckets here, the same way, before its first step: one pass
        that produces every gradient in reverse parameter order (the order backward does),
        locally, then the rebuild (its broadcast is local too)."""
        red, ddp = self.ddp.reducer, self.ddp
        if ddp.find_unused_parameters or getattr(ddp, "static_graph", False) or self.world == 1:
            return  # no rebuild in these modes
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        had = [p.grad for p in params]
        self.settling, phase, self.phase = True, self.phase, SETUP
        try:
            red.prepare_for_backward([])
            total = None
            for p in params:
                t = (p * 0).sum()
                total = t if total is None else total + t
            total.backward()
            red._rebuild_buckets()
        finally:
            self.settling, self.phase = False, phase
        for p, g in zip(params, had):
            p.grad = g

    def _wrap_optimizer(self):
        """The optimizer's step runs once the step's collectives all succeeded (after
        dp_step_before_update); in a failed step it does nothing (the step is rolled back)."""
        # Still a replaced opt.step, made by FaultTolerant's public gate_optimizer_step on the
        # optimizer it joined: torch 1.13's optimizer has no step hooks (register_step_pre_hook
        # came in 2.0), and a pre-hook could not skip the step anyway.
        self.ft.gate_optimizer_step(self._may_update)

    def _may_update(self):
        """Outside a step the optimizer steps as usual; inside one, only if before_update()."""
        return self.phase != STEP or self.before_update()

    def steps(self, model, optimizer, total, stateful, rng):
        if total is not None and total != self.job.steps:
            raise Error("steps: this loop runs %d steps, the job %d: give `deadpool run --steps %d`"
                        % (total, self.job.steps, total))
        if self.ft is None:
            self.join(model, optimizer, stateful, rng)
        elif model is not self.ddp:
            raise Error("steps: called again with another model")
        while True:
            if self.failed:
                if self.final is not None:
                    self.end(self.final)
                self.phase, self.failed = IDLE, False
                st = self.job.recover()
                if st != Status.OK:
                    self.end(st)
            step = self.job.next_step
            while step < self.job.steps:
                self.phase, self.step, self.began, self.updated = STEP, step, None, False
                yield step
                self.completer.settle()
                if not self.failed:
                    self._commit(step)
                self.phase = IDLE
                if self.failed:
                    break
                step += 1
            else:
                self.phase, self.final = DONE, Status.OK
                return

    def _commit(self, step):
        if not self.updated and not self.before_update():
            return
        st = self.job.commit(step, self.ft.extra_state(), loss=None)  # the loss is the loop's: no metrics
        if st != Status.OK:
            self.fail(st)

    def end(self, st):
        """The job ended before this process finished every step: leave with its status."""
        self.final = st
        raise SystemExit(self.finish())

    def finish(self):
        self.completer.settle()
        how = self.final if self.final is not None else Status.STOPPED
        self.phase = IDLE
        return self.job.finish(how)


def _this_run(what):
    if _run is None:
        raise Error("%s: call dist.init_process_group(\"deadpool\", init_method=\"deadpool://\") first "
                    "(under `deadpool run`)" % what)
    return _run


def steps(ddp_model, optimizer, steps=None, stateful=(), rng=False):
    """The steps to run (collective), for a DistributedDataParallel model over the `deadpool`
    process group and its optimizer. The first call puts the module and the optimizer under
    DeadPool and becomes a member; a spare waits in it until it takes a failed rank's place
    (then dist.get_rank() is that rank's). After a failed step it recovers and goes on from
    the rollback point. `steps`: the loop's own count, checked against the job's. It returns
    only once every step is done; a job that ends otherwise (stopped, this process fenced, a
    spare never needed) ends the process with SystemExit(the status dp_finish gives)."""
    return _this_run("steps").steps(ddp_model, optimizer, steps, stateful, rng)


def failed():
    """True once the current step failed (a peer died, the job stopped): its remaining
    collectives return at once without communicating (a tensor holds this rank's bytes or a
    partial result), the optimizer's step does nothing, and steps() rolls every rank back.
    Code that acts on a collective's result inside a step (a check, an early stop) asks this."""
    return _this_run("failed").failed


def finish():
    """Leaves the job: the process exit status (0 once every step is done): sys.exit(finish())."""
    return _this_run("finish").finish()


def _rendezvous(url, timeout=None, **kwargs):
    global _run
    if _run is None:
        _run = _Run()
    _run.store = _Store(_run.world)  # referenced here: torch holds only its C++ half
    yield (_run.store, max(_run.job.rank, 0), _run.world)


def _create(store, rank, world, timeout):
    if _run is None or world != _run.world:
        raise Error("deadpool backend: the group spans the job's %s ranks; new_group (a subset) is not supported"
                    % (_run.world if _run else "?"))
    return ProcessGroupDeadPool(_run)


if not hasattr(dist.Backend, "DEADPOOL"):
    register_rendezvous_handler("deadpool", _rendezvous)
    dist.Backend.register_backend("deadpool", _create)
