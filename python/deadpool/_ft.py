"""deadpool._ft — FaultTolerant's machinery: a module and an optimizer under DeadPool.

Beneath deadpool.torch (which re-exports FaultTolerant and partition, and documents them) and
deadpool.distributed (the `deadpool` backend, which builds on FaultTolerant's public methods);
it imports neither, so the dependency goes one way: torch -> distributed -> _ft.
"""
import ctypes
import pickle

import torch

from . import Callbacks, Error, Job, Kind, Op, Region, Status, checkpoint_read

__all__ = ["FaultTolerant", "partition"]

_ALIGN = 64  # bytes: every tensor in a flat buffer starts on a cache line
# Region ids (one generation): the module's state, the optimizer's state, its description.
_ID_MODEL, _ID_BUFFERS, _ID_OPT, _ID_META = 1, 2, 3, 4


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _nbytes(t):
    return t.numel() * t.element_size()


def _check_host(name, t):
    if t.device.type != "cpu":
        raise Error("%s is on %s: DeadPool keeps state in host memory; move the model and optimizer to the CPU "
                    "(device tensors are not supported yet)" % (name, t.device))
    if t.is_sparse:
        raise Error("%s is a sparse tensor: not supported" % name)


def partition(sizes, world):
    """Owner rank of each tensor, from their sizes: largest first, each to the rank with the
    fewest elements so far (ties: the lower rank), as ZeroRedundancyOptimizer does.
    Deterministic: the same on every rank and in every process."""
    owner = [0] * len(sizes)
    load = [0] * world
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return owner


class _Flat:
    """One contiguous host buffer that a list of tensors view, each at an aligned offset: the
    caller copies a tensor's contents into view(i) and rebinds it there (t.data = view, or the
    optimizer's state entry), so the tensor objects stay the ones the loop holds."""

    def __init__(self, entries, offsets=None, nbytes=None):
        # entries: (dtype, shape); offsets: where each starts (default: in order, aligned).
        self.entries = list(entries)
        if offsets is None:
            offsets, nbytes = [], 0
            for dtype, shape in self.entries:
                offsets.append(nbytes)
                nbytes += _aligned(_itemsize(dtype) * _numel(shape))
        self.offsets, self.nbytes = list(offsets), nbytes
        self.buf = torch.zeros(max(nbytes, 1), dtype=torch.uint8)

    def view(self, i):
        dtype, shape = self.entries[i]
        size = _itemsize(dtype) * _numel(shape)
        o = self.offsets[i]
        return self.buf[o:o + size].view(dtype).view(shape)

    def ptr(self, start=0):
        return self.buf.data_ptr() + start


def _itemsize(dtype):
    return torch.empty(0, dtype=dtype).element_size()


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


class FaultTolerant:
    """A PyTorch loop's handle on DeadPool. Local calls unless marked collective."""

    def __init__(self, job=None, **job_args):
        self.job = job if job is not None else Job(**job_args)
        self.loss = float("nan")   # the step's loss averaged over the ranks (after reduce_gradients)
        self._model = None
        self._failed = False
        self._final = None         # the status the loop ended with, once it ended
        self._step = None
        self._reduced = self._committed = False

    # --- the job ---
    rank = property(lambda self: self.job.rank)
    world = property(lambda self: self.job.world)
    seed = property(lambda self: self.job.seed)
    num_steps = property(lambda self: self.job.steps)
    out_dir = property(lambda self: self.job.out_dir)
    epoch = property(lambda self: self.job.epoch)

    @property
    def final(self):
        """The status the loop ended with (join's, steps', a failed call's), or None while it runs."""
        return self._final

    def join(self, model, optimizer, zero=False, stateful=(), rng=False, bucket_mb=25, overlap=True):
        """Puts `model` and `optimizer` under DeadPool and becomes a member (collective). A
        spare waits here, warm, until it takes a failed rank's place and restores its state.
        True to train, False if the job ended first (then leave with finish()).
        Gradients are averaged in buckets of up to `bucket_mb` MiB (DDP's 25), each started
        from a backward hook as soon as its gradients are complete; overlap=False starts them
        all in reduce_gradients (a loop with several backward passes per step needs that)."""
        if not bucket_mb > 0:
            raise Error("join: bucket_mb must be > 0, found %r" % (bucket_mb,))
        self._bucket_mb, self._overlap = float(bucket_mb), bool(overlap)
        return self._join(model, optimizer, zero, stateful, rng, self._setup_grads)

    def join_state(self, model, optimizer, stateful=(), rng=False):
        """join for a loop whose gradients something else averages (the `deadpool` backend: DDP)."""
        return self._join(model, optimizer, False, stateful, rng, None)

    def _join(self, model, optimizer, zero, stateful, rng, setup_grads):
        """join without the gradients' part (the `deadpool` backend: DDP reduces them)."""
        self._model, self._opt, self._zero = model, optimizer, bool(zero)
        self._stateful, self._rng = list(stateful), bool(rng)
        for obj in self._stateful:
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise Error("stateful: %r has no state_dict/load_state_dict" % (obj,))
        self._setup_model()
        if setup_grads:
            setup_grads()
        self._initial = {
            "model": self._model_flat.buf.clone(),
            "buffers": self._buf_flat.buf.clone() if self._buf_flat else None,
            "groups": [_hyper(g) for g in self._opt.param_groups],
            "stateful": [pickle.dumps(o.state_dict()) for o in self._stateful],
            "rng": torch.get_rng_state() if self._rng else None,
        }
        self._opt_flat, self._opt_layout, self._opt_count, self._adopted, self._value_keys = None, [], 0, [], []
        self._part_rank = None
        st = self.job.join(Callbacks(regions=self._regions, reset=self._reset, restore=self._restore,
                                     rebuild=self._rebuild, checkpoint=self._checkpoint))
        if st != Status.OK:
            self._final = st
            return False
        self._current_params()  # ZeRO: the groups filtered before the first optimizer step
        return True

    # --- the module's state in flat buffers ---
    def _setup_model(self):
        sd = self._model.state_dict(keep_vars=True)
        # One entry per tensor: tied weights (GPT-2's embedding and head) appear under two names.
        self._names, self._tensors, self._alias = [], [], {}
        first = {}
        for name, t in sd.items():
            _check_host(name, t)
            if id(t) in first:
                self._alias[name] = first[id(t)]
                continue
            first[id(t)] = len(self._tensors)
            self._names.append(name)
            self._tensors.append(t)
        self._keys = list(sd.keys())
        # The optimizer's parameters, in its order (the order of its state), before ZeRO filters them.
        self._groups_params = [list(g["params"]) for g in self._opt.param_groups]
        self._opt_params = [p for ps in self._groups_params for p in ps]
        for p in self._opt_params:
            if id(p) not in first:
                raise Error("the optimizer has a parameter that is not in the module's state_dict")
        # Parameters (the flat that ZeRO partitions and gathers) apart from buffers (the same everywhere).
        params = {id(p) for p in self._model.parameters()}
        self._pidx = [i for i, t in enumerate(self._tensors) if id(t) in params]
        self._bidx = [i for i, t in enumerate(self._tensors) if id(t) not in params]
        sizes = [_nbytes(self._tensors[i]) for i in self._pidx]
        world = self.job.world
        entries = [(self._tensors[i].dtype, tuple(self._tensors[i].shape)) for i in self._pidx]
        if self._zero:
            # Owner r's parameters lie together in segment r, and segments have one size: the
            # gather after the update is one allgather.
            self._owner = partition(sizes, world)
            used, offsets = [0] * world, []
            for k, size in enumerate(sizes):
                offsets.append(used[self._owner[k]])
                used[self._owner[k]] += _aligned(size)
            self._seg = _aligned(max(used + [4]))
            offsets = [self._owner[k] * self._seg + o for k, o in enumerate(offsets)]
            flat = _Flat(entries, offsets, self._seg * world)
        else:
            self._owner, self._seg = [0] * len(self._pidx), 0
            flat = _Flat(entries)
        self._model_flat = flat
        self._buf_flat = _Flat([(self._tensors[i].dtype, tuple(self._tensors[i].shape)) for i in self._bidx]) \
            if self._bidx else None
        with torch.no_grad():  # the tensors become views of the flats: same objects, new storage
            for k, i in enumerate(self._pidx):
                flat.view(k).copy_(self._tensors[i])
                self._tensors[i].data = flat.view(k)
            for j, i in enumerate(self._bidx):
                self._buf_flat.view(j).copy_(self._tensors[i])
                self._tensors[i].data = self._buf_flat.view(j)

    def _setup_grads(self):
        """The gradients in buckets, as DDP makes them: the parameters in reverse order (the
        order backward produces their gradients), the first bucket 1 MiB, the others up to
        bucket_mb; each bucket one float32 buffer that the gradients then view. The composition
        is a function of the model alone, so every rank and every run reduces the same bytes
        in the same collectives. The last bucket carries the loss too."""
        self._gparams = [p for p in self._model.parameters() if p.requires_grad]
        for p in self._gparams:
            if p.dtype != torch.float32:
                raise Error("gradients are averaged in float32; a parameter of %s is not supported" % p.dtype)
        cap, first = int(self._bucket_mb * 1024 * 1024), min(1 << 20, int(self._bucket_mb * 1024 * 1024))
        members, size = [[]], 0
        for k in reversed(range(len(self._gparams))):
            n = self._gparams[k].numel() * 4
            if members[-1] and size + n > (first if len(members) == 1 else cap):
                members.append([])
                size = 0
            members[-1].append(k)
            size += n
        self._buckets = []
        self._bucket_of = [0] * len(self._gparams)
        self._gviews = [None] * len(self._gparams)
        for b, ks in enumerate(members):
            n = sum(self._gparams[k].numel() for k in ks)
            flat = torch.zeros(n + (1 if b == len(members) - 1 else 0), dtype=torch.float32)
            o = 0
            for k in ks:
                p = self._gparams[k]
                self._gviews[k] = flat[o:o + p.numel()].view_as(p)
                self._bucket_of[k] = b
                o += p.numel()
            self._buckets.append((flat, ks))
        # A hook on each parameter's gradient accumulator fires once its gradient is complete
        # (the node is kept alive here: autograd holds it only while a graph needs it).
        self._accs = []
        if self._overlap and self.job.world > 1:
            for k, p in enumerate(self._gparams):
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(k))
                self._accs.append(acc)
        self._arm(None)

    def _arm(self, step):
        """A new step's buckets: none ready, none started."""
        self._hook_step = step
        self._left = [len(ks) for _, ks in self._buckets]
        self._next_bucket, self._requests, self._began = 0, [], None

    def _make_hook(self, k):
        def hook(*_):
            if self._hook_step is None or self._step != self._hook_step or self._reduced:
                return  # backward outside a step (or after it was reduced): nothing to start
            b = self._bucket_of[k]
            if b < self._next_bucket:
                raise Error("step %d: a gradient arrived after its bucket was reduced (a second backward pass in one "
                            "step?); join(..., overlap=False) for gradient accumulation" % self._step)
            self._bind_grad(k)
            self._left[b] -= 1
            # Started in bucket order, and the last one (with the loss) from reduce_gradients:
            # the same collectives in the same order on every rank, whatever the timing.
            while self._next_bucket < len(self._buckets) - 1 and self._left[self._next_bucket] == 0:
                self._start_bucket(self._next_bucket)
        return hook

    def _bind_grad(self, k):
        """Parameter k's gradient in its bucket (backward accumulates into the view from then on)."""
        p, v = self._gparams[k], self._gviews[k]
        with torch.no_grad():
            if p.grad is None:
                v.zero_()
            elif p.grad.data_ptr() != v.data_ptr():
                v.copy_(p.grad)
        p.grad = v

    def _start_bucket(self, b):
        self._next_bucket = b + 1
        if self._began is None:  # the step's first collective: the previous generation committed first
            self._began = self.job.before_reduce(self._step)
        if self._began != Status.OK:
            return
        self._requests.append(self.job.iallreduce(self._buckets[b][0], Op.MEAN))

    def _own_segment(self):
        r = self.job.rank
        return r * self._seg, self._seg

    # --- the optimizer's state: adopted into a flat buffer once it exists ---
    def _current_params(self):
        """The optimizer parameters this rank steps (ZeRO: its own), as indices into
        _opt_params; worked out once the rank is known (a spare learns it in join)."""
        if self._part_rank != self.job.rank:
            r = self.job.rank
            pos = {id(self._tensors[i]): k for k, i in enumerate(self._pidx)}
            self._mine = [j for j, p in enumerate(self._opt_params) if not self._zero or self._owner[pos[id(p)]] == r]
            self._mine_ids = {id(self._opt_params[j]) for j in self._mine}
            if self._zero:  # each param_group keeps this rank's parameters only
                for g, full in zip(self._opt.param_groups, self._groups_params):
                    g["params"] = [p for p in full if id(p) in self._mine_ids]
            self._part_rank = r
        return self._mine

    def _opt_entries(self):
        """(j, key, tensor) of every optimizer state tensor, and {(j, key): value} of the rest."""
        tensors, values = [], {}
        for j in self._current_params():
            p = self._opt_params[j]
            for key in sorted(self._opt.state.get(p, {}), key=str):
                v = self._opt.state[p][key]
                if torch.is_tensor(v):
                    _check_host("optimizer state %r" % (key,), v)
                    tensors.append((j, key, v))
                else:
                    values[(j, key)] = v
        return tensors, values

    def _adopt_opt_state(self):
        """Moves optimizer state tensors into the flat buffer when its layout changed (state
        appeared, e.g. at the first step, or the optimizer replaced a tensor); otherwise only
        checks that every entry is still the view it was given. The non-tensor state."""
        params = [self._opt_params[j] for j in self._current_params()]
        count = sum(len(self._opt.state[p]) for p in params if p in self._opt.state)
        if self._opt_flat is not None and count == self._opt_count and all(
                sd.get(k) is v for sd, k, v in self._adopted):
            return {(j, k): self._opt.state[self._opt_params[j]][k] for j, k in self._value_keys}
        tensors, values = self._opt_entries()
        layout = [(j, key, v.dtype, tuple(v.shape)) for j, key, v in tensors]
        flat = _Flat([(d, s) for _, _, d, s in layout])
        self._adopted = []
        with torch.no_grad():
            for n, (j, key, v) in enumerate(tensors):
                view = flat.view(n)
                view.copy_(v)
                self._opt.state[self._opt_params[j]][key] = view
                self._adopted.append((self._opt.state[self._opt_params[j]], key, view))
        self._opt_flat, self._opt_layout, self._opt_count = flat, layout, count
        self._value_keys = list(values)
        self._static_meta = pickle.dumps({
            "names": [(n, str(t.dtype), tuple(t.shape)) for n, t in zip(self._names, self._tensors)],
            "zero": self._zero,
            "layout": [(j, key, str(d), s) for j, key, d, s in layout],
        }, protocol=4)
        return values

    def _meta(self, values):
        """The description: its static part pickled once per layout, the rest every step."""
        return pickle.dumps((self._static_meta, {"values": values, "groups": [_hyper(g) for g in self._opt.param_groups]}),
                            protocol=4)

    def state_buffers(self):
        """The flat byte tensors the module's tensors view: parameters, then buffers (empty ones left out)."""
        flats = (self._model_flat, self._buf_flat)
        return [flat.buf[:flat.nbytes] for flat in flats if flat is not None and flat.nbytes]

    def gate_optimizer_step(self, allow):
        """Makes the joined optimizer's step() run only when allow() is True (else it does nothing, returning None)."""
        inner = self._opt.step

        def step(*args, **kwargs):
            if not allow():
                return None
            return inner(*args, **kwargs)
        self._opt.step = step

    # --- callbacks ---
    def _regions(self):
        self._current_params()
        values = self._adopt_opt_state()
        meta = bytearray(self._meta(values))
        mptr = ctypes.addressof(ctypes.c_char.from_buffer(meta))
        kind = Kind.SHARDED if self._zero else Kind.IDENTICAL
        out = []
        if self._zero:
            start, size = self._own_segment()
            out.append(Region(_ID_MODEL, Kind.SHARDED, self._model_flat.ptr(start), size, self._model_flat.buf))
        else:
            out.append(Region(_ID_MODEL, Kind.IDENTICAL, self._model_flat.ptr(), self._model_flat.nbytes,
                              self._model_flat.buf))
        if self._buf_flat:
            out.append(Region(_ID_BUFFERS, Kind.IDENTICAL, self._buf_flat.ptr(), self._buf_flat.nbytes,
                              self._buf_flat.buf))
        if self._opt_flat is not None and self._opt_flat.nbytes:
            out.append(Region(_ID_OPT, kind, self._opt_flat.ptr(), self._opt_flat.nbytes, self._opt_flat.buf))
        out.append(Region(_ID_META, kind, mptr, len(meta), meta))
        return out

    def _restore(self, g):
        self._current_params()
        if g.extra:
            self._restore_extra(g.extra)
        meta_view = g.region(_ID_META)
        if meta_view is not None:
            static, dynamic = pickle.loads(bytes(meta_view))
            self._restore_meta(dict(pickle.loads(static), **dynamic), g)
        model = g.region(_ID_MODEL)
        if model is not None:
            if self._zero:
                start, size = self._own_segment()
            else:
                start, size = 0, self._model_flat.nbytes
            if len(model) != size:
                raise Error("the generation's parameters hold %d bytes, this model %d" % (len(model), size))
            self._model_flat.buf[start:start + size].copy_(torch.frombuffer(model, dtype=torch.uint8))
        bufs = g.region(_ID_BUFFERS)
        if bufs is not None and self._buf_flat:
            if len(bufs) != self._buf_flat.nbytes:
                raise Error("the generation's buffers hold %d bytes, this model %d" % (len(bufs), self._buf_flat.nbytes))
            self._buf_flat.buf[:len(bufs)].copy_(torch.frombuffer(bufs, dtype=torch.uint8))

    def _restore_meta(self, meta, g):
        mine = [(n, str(t.dtype), tuple(t.shape)) for n, t in zip(self._names, self._tensors)]
        if meta["names"] != mine:
            raise Error("the generation was taken with another model (its tensors differ from this module's)")
        if meta["zero"] != self._zero:
            raise Error("the generation was taken with zero=%s, this loop has zero=%s" % (meta["zero"], self._zero))
        for group, hyper in zip(self._opt.param_groups, meta["groups"]):
            group.update(hyper)
        # The optimizer's state becomes exactly the generation's: drop what it lacks.
        self._current_params()
        for p in list(self._opt.state.keys()):
            if id(p) in self._mine_ids:
                del self._opt.state[p]
        layout = [(j, key, getattr(torch, d.split(".")[-1]), tuple(s)) for j, key, d, s in meta["layout"]]
        flat = _Flat([(d, s) for _, _, d, s in layout])
        data = g.region(_ID_OPT)
        if layout:
            if data is None or len(data) != flat.nbytes:
                raise Error("the generation's optimizer state holds %s bytes, its description says %d"
                            % (len(data) if data is not None else "no", flat.nbytes))
            flat.buf[:flat.nbytes].copy_(torch.frombuffer(data, dtype=torch.uint8))
        for n, (j, key, _, _) in enumerate(layout):
            self._opt.state[self._opt_params[j]][key] = flat.view(n)
        for (j, key), v in meta["values"].items():
            self._opt.state[self._opt_params[j]][key] = v
        self._opt_flat = None  # the next capture adopts the restored tensors afresh

    def extra_state(self):
        """This rank's own state for a commit: the `stateful` objects' and the rng's, pickled (b"" if none)."""
        if not self._stateful and not self._rng:
            return b""  # nothing of its own: a plain data-parallel rank loses nothing when it fails
        return pickle.dumps({"stateful": [o.state_dict() for o in self._stateful],
                             "rng": torch.get_rng_state() if self._rng else None}, protocol=4)

    def _restore_extra(self, extra):
        x = pickle.loads(extra)
        for obj, sd in zip(self._stateful, x["stateful"]):
            obj.load_state_dict(sd)
        if self._rng and x["rng"] is not None:
            torch.set_rng_state(x["rng"])

    def _reset(self):
        self._current_params()
        self._model_flat.buf.copy_(self._initial["model"])
        if self._buf_flat:
            self._buf_flat.buf.copy_(self._initial["buffers"])
        self._opt.state.clear()
        self._opt_flat, self._opt_layout = None, []
        for group, hyper in zip(self._opt.param_groups, self._initial["groups"]):
            group.update(hyper)
        for obj, blob in zip(self._stateful, self._initial["stateful"]):
            obj.load_state_dict(pickle.loads(blob))
        if self._rng:
            torch.set_rng_state(self._initial["rng"])

    def _rebuild(self, job):
        if not self._zero or job.world == 1:
            return Status.OK
        return self._gather()

    def _gather(self):
        """ZeRO: every rank's segment of the parameters to every rank (one allgather)."""
        start, size = self._own_segment()
        floats = self._model_flat.buf.view(torch.float32)
        n = size // 4
        return self.job.allgather(floats[start // 4:start // 4 + n], floats)

    def _checkpoint(self, directory, step, world):
        """A complete checkpoint: writes DIR/model.pt (the module's state_dict) from the ranks'
        states on disk. Runs on a DeadPool thread: reads only the layout, fixed since join."""
        flat = torch.zeros(self._model_flat.nbytes, dtype=torch.uint8)
        bufs = torch.zeros(self._buf_flat.nbytes, dtype=torch.uint8) if self._buf_flat else None

        def take(g):
            model = g.region(_ID_MODEL)
            if model is not None:
                start = g.rank * self._seg if self._zero else 0
                flat[start:start + len(model)].copy_(torch.frombuffer(model, dtype=torch.uint8))
            b = g.region(_ID_BUFFERS)
            if b is not None and bufs is not None:
                bufs[:len(b)].copy_(torch.frombuffer(b, dtype=torch.uint8))
            return model is not None

        found = [checkpoint_read(directory, r, take) for r in (range(world) if self._zero else [0])]
        if not all(found):
            raise Error("checkpoint %s: a rank's state has no parameters" % directory)
        sd = {}
        for k, i in enumerate(self._pidx):
            t = self._tensors[i]
            o = self._model_flat.offsets[k]
            sd[self._names[i]] = flat[o:o + _nbytes(t)].view(t.dtype).view(t.shape).clone()
        if self._buf_flat:
            for j, i in enumerate(self._bidx):
                t = self._tensors[i]
                o = self._buf_flat.offsets[j]
                sd[self._names[i]] = bufs[o:o + _nbytes(t)].view(t.dtype).view(t.shape).clone()
        for name, i in self._alias.items():
            sd[name] = sd[self._names[i]]
        torch.save({k: sd[k] for k in self._keys}, directory + "/model.pt")

    # --- the loop ---
    def steps(self):
        """The steps to run, from next_step to the job's steps. After a failed step (a
        reduce_gradients or commit that returned False) it recovers: every rank rolls back to
        the newest generation all of them committed and the steps go on from there. Ends
        when the job is done, stopped or this process fenced (see finish)."""
        if self._model is None:
            raise Error("steps: call join(model, optimizer) first")
        while self._final is None:
            if self._failed:
                self._failed = False
                st = self.job.recover()
                if st != Status.OK:
                    self._final = st
                    return
            step = self.job.next_step
            while step < self.job.steps:
                self._step, self._reduced, self._committed = step, False, False
                self._arm(step)
                self._drop_foreign_grads()
                yield step
                if self._final is not None or self._failed:
                    break
                if not self._committed:
                    raise Error("step %d: commit() was not called after the optimizer step" % step)
                step += 1
            else:
                self._final = Status.OK

    def _drop_foreign_grads(self):
        """ZeRO: the loop's zero_grad() reaches only this rank's parameters (the optimizer's
        filtered groups): the others' gradients start each step anew, or they would add up."""
        if not self._zero:
            return
        self._current_params()
        for p in self._gparams:
            if id(p) not in self._mine_ids:
                p.grad = None

    def _outcome(self, st):
        if st == Status.OK:
            return True
        if st == Status.FAILED:
            self._failed = True
        else:
            self._final = st
        return False

    def reduce_gradients(self, loss=None):
        """After backward: averages every gradient (and `loss`) over the ranks in a fixed order.
        Buckets whose gradients were complete during backward are already under way (overlap);
        the rest start now, and all are waited for. Collective. True: go on with the optimizer
        step; False: the step failed (a peer died, the job stopped): `continue`, and steps()
        recovers."""
        if self._step is None or self._reduced:
            raise Error("reduce_gradients: call it once per step, inside `for step in ft.steps()`")
        self._reduced = True
        last = len(self._buckets) - 1
        for b in range(self._next_bucket, last + 1):
            for k in self._buckets[b][1]:
                self._bind_grad(k)  # those backward did not reach (an unused parameter): zeros
            if b == last:
                self._buckets[b][0][-1] = float(loss) if loss is not None else 0.0
            self._start_bucket(b)
        results = [r.wait() for r in self._requests if r is not None]  # every one, also after a failure
        if not self._outcome(self._began):
            return False
        if len(results) != len(self._buckets):
            return self._outcome(Status.FAILED)
        for st in results:
            if not self._outcome(st):
                return False
        self.loss = float(self._buckets[last][0][-1])
        return self._outcome(self.job.before_update())

    def commit(self, lr=None, tokens=0.0):
        """After the optimizer step: (ZeRO: gathers the parameters, collective) captures this
        step's generation. True, or False: the step failed (`continue`)."""
        if not self._reduced:
            raise Error("commit: call reduce_gradients first")
        self._committed = True
        if self._zero and self.job.world > 1 and not self._outcome(self._gather()):
            return False
        if lr is None:
            lr = self._opt.param_groups[0].get("lr", 0.0) if self._opt.param_groups else 0.0
        return self._outcome(self.job.commit(self._step, self.extra_state(), loss=self.loss, lr=lr, tokens=tokens))

    def finish(self, save=None):
        """Leaves the job and returns the exit status for sys.exit. When every step is done,
        save() runs on rank 0 first (write the model into out_dir)."""
        how = self._final if self._final is not None else Status.STOPPED
        if how == Status.OK and save is not None and self.job.rank == 0:
            try:
                path = save()
                if path:
                    self.job.output_saved(path)
            except Exception as e:  # the steps are done: say what failed; DP_ERR here exits "output failed"
                self.job.log("saving the model failed: %s: %s" % (type(e).__name__, e))
                return self.job.finish(Status.ERR)
        return self.job.finish(how)


def _hyper(group):
    return {k: v for k, v in group.items() if k != "params"}
