"""DeadPool from Python: a binding of libdeadpool (include/deadpool.h) through ctypes.

The loop is the C one (deadpool.h has it in full), with the same calls:

    import deadpool
    job = deadpool.Job()                        # role, rank, world from `deadpool run`
    job.join(deadpool.Callbacks(regions=..., reset=...))   # spares wait here until needed
    ...
    sys.exit(job.finish(status))

Every blocking call releases the GIL. Statuses are `Status` values (OK, FAILED: call
`recover`, STOPPED and FENCED: leave); a usage or setup error (DP_ERR) is raised as `Error`
with the library's message. A callback that raises does not take the process down: the
library gets an error return (or, for `reset`, the failure is remembered), and the call that
ran the callback raises `Error` naming it, chained to the original exception.

For PyTorch, `deadpool.torch` puts a module and an optimizer under DeadPool in a few lines.
"""
import ctypes
import enum

from . import _lib
from ._lib import find as find_library  # noqa: F401  (public: where the library is)

__all__ = ["version", "Job", "Callbacks", "Region", "Generation", "Group", "Status", "Role", "Kind", "Error",
           "DType", "Op", "Request",
           "checkpoint_read", "find_library", "API_VERSION"]

API_VERSION = 1  # DEADPOOL_API_VERSION of the deadpool.h this binding covers
__version__ = "1.1.0"  # DEADPOOL_VERSION of that deadpool.h


def version():
    """The loaded library's version (dp_version)."""
    return _lib.lib().dp_version().decode()


class Status(enum.IntEnum):
    OK = 0
    ERR = -1       # a usage or setup error: raised as Error, never returned
    FAILED = 1     # the step failed (a peer died, the epoch closed): call Job.recover
    STOPPED = 2    # the job is over: leave with Job.finish
    FENCED = 3     # a newer epoch replaced this process (it hung or was cut off): leave

    def __str__(self):  # the library's name for it (dp_status_str)
        return _lib.lib().dp_status_str(int(self)).decode()


class Role(enum.IntEnum):
    INITIAL = 0    # a member since the job started (or was resumed from disk)
    SURVIVOR = 1   # a member that rolled back from its own buffers after a failure
    RECOVERED = 2  # a spare that took a failed rank and restored its state
    SPARE = 3      # a spare still waiting


class Kind(enum.IntEnum):
    SHARDED = 0    # this rank's own state: snapshotted and replicated by every rank
    IDENTICAL = 1  # the same bytes on every rank


class DType(enum.IntEnum):
    """Element types of the asynchronous collectives (deadpool.h's dp_dtype)."""
    FLOAT32 = 0
    FLOAT64 = 1
    BFLOAT16 = 2
    INT64 = 3


class Op(enum.IntEnum):
    """Reductions of Job.iallreduce (dp_op)."""
    SUM = 0
    MEAN = 1
    MAX = 2
    MIN = 3


_TORCH_DTYPES = {"torch.float32": DType.FLOAT32, "torch.float64": DType.FLOAT64, "torch.bfloat16": DType.BFLOAT16,
                 "torch.int64": DType.INT64}


def _typed_buffer(buf, what):
    """(address, elements, DType) of a contiguous host tensor of a supported dtype."""
    if not (hasattr(buf, "data_ptr") and hasattr(buf, "is_contiguous")):
        raise Error("%s: expected a torch tensor" % what)
    t = _TORCH_DTYPES.get(str(buf.dtype))
    if t is None:
        raise Error("%s: expected a float32, float64, bfloat16 or int64 tensor, found %s" % (what, buf.dtype))
    if buf.device.type != "cpu":
        raise Error("%s: expected a tensor in host memory, found one on %s" % (what, buf.device))
    if not buf.is_contiguous():
        raise Error("%s: expected a contiguous tensor" % what)
    return buf.data_ptr(), buf.numel(), t


class Request:
    """A collective in flight (Job.iallreduce ...): wait() once, for its Status."""

    def __init__(self, job, handle, keep, what):
        self._job, self._handle, self._keep, self._what = job, handle, keep, what

    def done(self):
        """True once it completed (wait() then returns at once). Local."""
        return self._handle is None or bool(self._job._L.dp_test(self._handle))

    def wait(self):
        """Waits for it: Status.OK, or FAILED (the step failed). Local; once."""
        if self._handle is None:
            raise Error("%s: waited for twice" % self._what)
        h, self._handle = self._handle, None
        st = self._job._status(self._job._L.dp_wait(h), self._what)
        self._keep = None
        return st


class Error(Exception):
    """A DeadPool error; the message is the library's (or names the callback that raised).
    Raised by Job(), it has `exit_status`, the status a process that cannot join should exit
    with: `except deadpool.Error as e: sys.exit(e.exit_status)`."""


class Region:
    """One piece of state: `nbytes` bytes of host memory at address `ptr` (which must stay
    valid and unchanged from a commit until the next before_reduce). `keep` holds a reference
    to whatever owns the memory."""
    __slots__ = ("id", "kind", "ptr", "nbytes", "keep")

    def __init__(self, id, kind, ptr, nbytes, keep=None):
        self.id, self.kind, self.ptr, self.nbytes, self.keep = int(id), Kind(kind), int(ptr), int(nbytes), keep

    def __repr__(self):
        return "Region(id=%d, kind=%s, nbytes=%d)" % (self.id, self.kind.name, self.nbytes)


class Generation:
    """A verified generation handed to a callback. `regions` is a list of (id, kind,
    memoryview); the memory is DeadPool's and valid only during the callback: copy out of it."""

    def __init__(self, g):
        self.step, self.rank, self.world = g.step, g.rank, g.world
        self.extra = ctypes.string_at(g.extra, g.extra_len) if g.extra_len else b""
        self.regions = []
        for i in range(g.nregions):
            r = g.regions[i]
            buf = (ctypes.c_char * r.len).from_address(r.ptr) if r.len else bytearray()
            self.regions.append((r.id, Kind(r.kind), memoryview(buf).cast("B")))

    def region(self, id):
        """The memoryview of region `id`, None if the generation has none."""
        for rid, _, view in self.regions:
            if rid == id:
                return view
        return None


class Callbacks:
    """What DeadPool calls (deadpool.h's dp_callbacks), as Python callables:
      regions() -> list of Region: the state as it is now (asked at every capture);
      restore(gen: Generation): put a generation back (None: copy each region by id);
      reset(): back to the initial state (required);
      rebuild(job) -> Status or None: after a restore, rebuild derived state with the new
          epoch's collectives;
      checkpoint(dir, step, world): write the application's files into a complete checkpoint
          (may run on a DeadPool thread while the loop trains)."""

    def __init__(self, regions, reset, restore=None, rebuild=None, checkpoint=None):
        if regions is None or reset is None:
            raise Error("Callbacks: regions and reset are required")
        self.regions, self.reset, self.restore, self.rebuild, self.checkpoint = (
            regions, reset, restore, rebuild, checkpoint)


def _put_err(err, errlen, msg):
    if err and errlen:
        data = msg.encode("utf-8", "replace")[: errlen - 1] + b"\0"
        ctypes.memmove(err, data, len(data))


def _buffer(buf, what, floats):
    """(address, length) of a writable contiguous buffer in host memory: a CPU torch tensor, a
    numpy array, or anything with the buffer protocol. floats: float32 items only, the length
    counted in them; else the length in bytes."""
    if hasattr(buf, "data_ptr") and hasattr(buf, "is_contiguous"):  # torch.Tensor, without importing torch
        if floats and str(buf.dtype) != "torch.float32":
            raise Error("%s: expected a float32 tensor, found %s" % (what, buf.dtype))
        if buf.device.type != "cpu":
            raise Error("%s: expected a tensor in host memory, found one on %s" % (what, buf.device))
        if not buf.is_contiguous():
            raise Error("%s: expected a contiguous tensor" % what)
        return buf.data_ptr(), buf.numel() * (1 if floats else buf.element_size())
    view = memoryview(buf)
    if floats and (view.format != "f" or view.itemsize != 4):
        raise Error("%s: expected float32 items, found format %r" % (what, view.format))
    if not view.c_contiguous or view.readonly:
        raise Error("%s: expected a writable contiguous buffer" % what)
    if view.nbytes == 0:
        return 0, 0
    return ctypes.addressof(ctypes.c_char.from_buffer(view.cast("B"))), view.nbytes // (4 if floats else 1)


def _float_buffer(buf, what):
    return _buffer(buf, what, True)


def _byte_buffer(buf, what):
    return _buffer(buf, what, False)


_FPTR = ctypes.POINTER(ctypes.c_float)


def _reduce(job, fn, handle, buf, what):
    """A reduction in place (dp_allreduce_sum/mean, their group forms)."""
    p, n = _float_buffer(buf, what)
    return job._status(fn(handle, ctypes.cast(p, _FPTR), n), what)


def _gather(job, fn, handle, size, inp, out, what):
    """out[r*n:(r+1)*n] = member r's inp (dp_allgather, dp_group_allgather)."""
    pi, n = _float_buffer(inp, what + " input")
    po, m = _float_buffer(out, what + " output")
    if m != n * size:
        raise Error("%s: the output holds %d floats, expected %d x %d" % (what, m, n, size))
    return job._status(fn(handle, ctypes.cast(pi, _FPTR), ctypes.cast(po, _FPTR), n), what)


def _getter(fn, conv=None):
    """A read-only property of the job from the library's getter `fn` (dp_rank ...)."""
    def get(self):
        v = getattr(self._L, fn)(self._h())
        return conv(v) if conv else v
    return property(get)


def _text(v):
    return v.decode("utf-8", "replace") if v else None


class Job:
    """A process of a DeadPool job (deadpool.h's dp_t). Every method is local to this process
    unless it says it is collective (every rank of the epoch must call it, in the same order).

    Job(redis_url=None, job=None, spare=False, rank=-1, bind_host=None): connects and claims a
    role; with no arguments everything comes from the environment `deadpool run` sets."""

    def __init__(self, redis_url=None, job=None, spare=False, rank=-1, bind_host=None):
        self._L = _lib.lib()
        self._cb_error = None  # (callback name, exception) of the last callback that raised
        self._keep = None      # the ctypes callback objects, referenced while the library may call them
        self._regions_out = []  # the Region lists of the newest captures (their memory must stay alive)
        err = ctypes.create_string_buffer(1024)
        opts = None
        if any(v is not None for v in (redis_url, job, bind_host)) or spare or rank != -1:
            enc = lambda s: s.encode() if s is not None else None  # noqa: E731
            opts = ctypes.byref(_lib.Options(enc(redis_url), enc(job), int(bool(spare)), int(rank), enc(bind_host)))
        self._dp = self._L.dp_init(opts, err, len(err))
        if not self._dp:
            e = Error(err.value.decode("utf-8", "replace") or "dp_init failed")
            # The status to exit with (deadpool.h's dp_finish(NULL, DP_ERR)): 1 a bad job (the
            # launcher stops the job), 2 the control plane stayed away (the process is replaced).
            e.exit_status = self._L.dp_finish(None, -1)
            raise e

    # --- state of this process (local) ---
    def _h(self):
        if not self._dp:
            raise Error("the job was finished: this Job can no longer be used")
        return self._dp

    role = _getter("dp_get_role", Role)
    rank = _getter("dp_rank")
    world = _getter("dp_world")
    local_rank = _getter("dp_local_rank")
    next_step = _getter("dp_next_step")
    steps = _getter("dp_steps")
    seed = _getter("dp_seed")
    epoch = _getter("dp_epoch")
    out_dir = _getter("dp_out_dir", _text)
    resume_dir = _getter("dp_resume_dir", _text)
    last_error = _getter("dp_last_error", lambda v: _text(v) or "")

    def store_prefix(self):
        """The Redis key prefix of the current epoch, "dp:JOB:eEPOCH:app:"."""
        buf = ctypes.create_string_buffer(256)
        if self._L.dp_store_prefix(self._h(), buf, len(buf)) != 0:
            raise Error("dp_store_prefix failed")
        return buf.value.decode()

    def aborted(self):
        """True once the epoch was closed by a failure elsewhere (safe from any thread)."""
        return bool(self._L.dp_aborted(self._h()))

    def replica_spread(self, block):
        """Take replica holders outside this rank's block of `block` ranks first. Before join."""
        self._L.dp_replica_spread(self._h(), int(block))

    def log(self, msg):
        """"[deadpool rank R] msg" on stderr."""
        self._L.dp_log(self._h(), b"%s", str(msg).encode("utf-8", "replace"))

    def output_saved(self, path):
        """Tells the job an output file was written (a model_saved event)."""
        self._L.dp_output_saved(self._h(), str(path).encode())

    # --- status handling ---
    def _status(self, st, what, err=None):
        """Status of a call; raises Error for DP_ERR or when a callback raised during it."""
        cb = self._cb_error
        self._cb_error = None
        if cb is not None:
            name, exc = cb
            raise Error("%s: the %s callback raised %s: %s" % (what, name, type(exc).__name__, exc)) from exc
        if st == Status.ERR:
            msg = err.value.decode("utf-8", "replace") if err is not None else self.last_error
            raise Error("%s: %s" % (what, msg or "failed"))
        return Status(st)

    # --- callbacks: Python functions behind C function pointers ---
    def _wrap(self, cbs):
        me = self

        def fail(name, exc, err=None, errlen=0):
            me._cb_error = (name, exc)
            _put_err(err, errlen, "%s callback raised %s: %s" % (name, type(exc).__name__, exc))

        def regions(_arg, out, maxn):
            try:
                rs = list(cbs.regions())
                if len(rs) > maxn:
                    raise Error("%d regions, at most %d" % (len(rs), maxn))
                for i, r in enumerate(rs):
                    out[i].id, out[i].kind, out[i].ptr, out[i].len = r.id, int(r.kind), r.ptr, r.nbytes
                # The memory must outlive the background copy of this capture: keep the two newest.
                me._regions_out = (me._regions_out + [rs])[-2:]
                return len(rs)
            except BaseException as e:  # noqa: B902 — never unwind through C
                fail("regions", e)
                return -1

        def restore(_arg, g, err, errlen):
            try:
                cbs.restore(Generation(g.contents))
                return 0
            except BaseException as e:  # noqa: B902
                fail("restore", e, err, errlen)
                return -1

        def reset(_arg):
            try:
                cbs.reset()
            except BaseException as e:  # noqa: B902
                fail("reset", e)

        def rebuild(_dp, _arg):
            try:
                st = cbs.rebuild(me)
                return int(Status.OK if st is None else st)
            except BaseException as e:  # noqa: B902
                fail("rebuild", e)
                return int(Status.ERR)

        def checkpoint(_arg, d, step, world, err, errlen):
            try:
                cbs.checkpoint(d.decode(), step, world)
                return 0
            except BaseException as e:  # noqa: B902
                fail("checkpoint", e, err, errlen)
                return -1

        keep = [_lib.REGIONS_FN(regions), _lib.RESTORE_FN(restore if cbs.restore else 0),
                _lib.RESET_FN(reset), _lib.REBUILD_FN(rebuild if cbs.rebuild else 0),
                _lib.CHECKPOINT_FN(checkpoint if cbs.checkpoint else 0)]
        return _lib.Callbacks(*keep, None), keep

    # --- membership (collective with the other members) ---
    def join(self, callbacks):
        """Becomes a member (an initial one builds the collectives and, resuming, restores its
        state from disk; a spare waits, warm, until it takes a failed rank). Collective.
        Status.OK or Status.STOPPED (the job ended first)."""
        c, keep = self._wrap(callbacks)
        self._keep = (callbacks, c, keep)  # referenced for as long as the library may call them
        err = ctypes.create_string_buffer(1024)
        return self._status(self._L.dp_join(self._h(), ctypes.byref(c), err, len(err)), "join", err)

    def recover(self):
        """After Status.FAILED: waits for the decision, rolls back to the newest generation
        every rank committed, and returns OK (next_step set), STOPPED or FENCED. Collective."""
        err = ctypes.create_string_buffer(1024)
        return self._status(self._L.dp_recover(self._h(), err, len(err)), "recover", err)

    def finish(self, how=Status.OK):
        """Leaves the job; returns the process exit status (0: done). The Job is unusable after."""
        if not self._dp:
            raise Error("finish called twice")
        rc = self._L.dp_finish(self._dp, int(how))
        self._dp = None
        return rc

    # --- the step ---
    def before_reduce(self, step):
        """After forward/backward of `step`, before communicating: OK or FAILED."""
        return self._status(self._L.dp_step_before_reduce(self._h(), int(step)), "before_reduce")

    def before_update(self):
        """After the reduction, before the optimizer changes state: OK or FAILED."""
        return self._status(self._L.dp_step_before_update(self._h()), "before_update")

    def commit(self, step, extra=b"", loss=0.0, lr=0.0, grad_norm=0.0, tokens=0.0):
        """After the update of `step`: captures generation `step` (regions + `extra` bytes,
        copied now) and reports the metrics (loss=None: none, the loop does not know them). OK or FAILED."""
        extra = bytes(extra)
        m = None if loss is None else ctypes.byref(_lib.Metrics(float(loss), float(lr), float(grad_norm), float(tokens)))
        st = self._L.dp_step_commit(self._h(), int(step), extra, len(extra), m)
        return self._status(st, "commit")

    # --- collectives of the current epoch (collective; a fixed-order ring: deterministic) ---
    def allreduce_sum(self, buf):
        return _reduce(self, self._L.dp_allreduce_sum, self._h(), buf, "allreduce_sum")

    def allreduce_mean(self, buf):
        """The mean over the ranks (the ring's sum times 1/world, the same bits on every rank);
        append the loss to the buffer to average it in the same collective."""
        return _reduce(self, self._L.dp_allreduce_mean, self._h(), buf, "allreduce_mean")

    def allgather(self, inp, out):
        """out[r*n:(r+1)*n] = rank r's inp (n = len(inp)); inp may alias its place in out."""
        return _gather(self, self._L.dp_allgather, self._h(), self.world, inp, out, "allgather")

    def broadcast(self, buf, root):
        p, n = _byte_buffer(buf, "broadcast")
        return self._status(self._L.dp_broadcast(self._h(), p, n, int(root)), "broadcast")

    def barrier(self):
        return self._status(self._L.dp_barrier(self._h()), "barrier")

    # --- asynchronous collectives (collective: every rank starts the same ones in the same
    # order; they complete in that order; the tensor is DeadPool's until wait() returns) ---
    def _start(self, what, call, keep):
        req = ctypes.c_void_p()
        st = self._status(call(ctypes.byref(req)), what)
        if st != Status.OK:
            return None
        return Request(self, req.value, keep, what)

    def iallreduce(self, tensor, op=Op.SUM):
        """Starts an in-place allreduce of a float32/float64/bfloat16/int64 host tensor: a Request."""
        p, n, t = _typed_buffer(tensor, "iallreduce")
        return self._start("iallreduce", lambda r: self._L.dp_iallreduce(self._h(), p, n, int(t), int(op), r), tensor)

    def iallgather(self, inp, out):
        """Starts out[r*n:(r+1)*n] = rank r's inp (same dtype, n*itemsize a multiple of 4): a Request."""
        pi, n, t = _typed_buffer(inp, "iallgather input")
        po, m, t2 = _typed_buffer(out, "iallgather output")
        if t2 != t or m != n * self.world:
            raise Error("iallgather: the output holds %d %s, expected %d x %d %s" % (m, t2.name, n, self.world, t.name))
        return self._start("iallgather", lambda r: self._L.dp_iallgather(self._h(), pi, po, n, int(t), r), (inp, out))

    def ibroadcast(self, buf, root):
        """Starts root's buf (any contiguous buffer) to every rank: a Request."""
        p, n = _byte_buffer(buf, "ibroadcast")
        return self._start("ibroadcast", lambda r: self._L.dp_ibroadcast(self._h(), p, n, int(root), r), buf)

    def group(self, name, index, size):
        """Joins group `name` of `size` ranks as member `index` (collective among its members);
        groups end at the next recovery: join them again after it."""
        err = ctypes.create_string_buffer(1024)
        g = self._L.dp_group_join(self._h(), name.encode(), int(index), int(size), err, len(err))
        if not g:
            raise Error("group %s: %s" % (name, err.value.decode("utf-8", "replace")))
        return Group(self, g)

    def __repr__(self):
        if not self._dp:
            return "Job(finished)"
        return "Job(rank=%d, world=%d, role=%s, epoch=%d)" % (self.rank, self.world, self.role.name, self.epoch)


class Group:
    """Collectives among some of the ranks (deadpool.h's dp_group); valid until the next
    recovery. Every method is collective among the group's members except send."""

    def __init__(self, job, handle):
        self._job, self._g = job, handle
        self.index = job._L.dp_group_index(handle)
        self.size = job._L.dp_group_size(handle)

    def _st(self, st, what):
        return self._job._status(st, what)

    def allreduce_sum(self, buf):
        return _reduce(self._job, self._job._L.dp_group_allreduce_sum, self._g, buf, "group allreduce_sum")

    def allreduce_mean(self, buf):
        return _reduce(self._job, self._job._L.dp_group_allreduce_mean, self._g, buf, "group allreduce_mean")

    def allgather(self, inp, out):
        return _gather(self._job, self._job._L.dp_group_allgather, self._g, self.size, inp, out, "group allgather")

    def send(self, buf, dst, tag=0):
        """Posted: `buf` must stay unchanged until wait_sends."""
        p, n = _byte_buffer(buf, "group send")
        return self._st(self._job._L.dp_group_send(self._g, p, n, int(dst), int(tag)), "group send")

    def recv(self, buf, src, tag=0):
        p, n = _byte_buffer(buf, "group recv")
        return self._st(self._job._L.dp_group_recv(self._g, p, n, int(src), int(tag)), "group recv")

    def wait_sends(self):
        return self._st(self._job._L.dp_group_wait_sends(self._g), "group wait_sends")


def checkpoint_read(directory, rank, fn):
    """Reads and verifies (CRC32C) rank's state in checkpoint directory `directory` and returns
    fn(Generation)'s result. Raises Error for a missing, truncated or corrupt file."""
    L = _lib.lib()
    box = {}

    def read(_arg, g):
        try:
            box["value"] = fn(Generation(g.contents))
            return 0
        except BaseException as e:  # noqa: B902
            box["error"] = e
            return -1

    cfn = _lib.READ_FN(read)
    err = ctypes.create_string_buffer(1024)
    rc = L.dp_checkpoint_read(str(directory).encode(), int(rank), cfn, None, err, len(err))
    if "error" in box:
        e = box["error"]
        raise Error("checkpoint_read %s rank %d: the reader raised %s: %s" % (directory, rank, type(e).__name__, e)) from e
    if rc != 0:
        raise Error(err.value.decode("utf-8", "replace") or "checkpoint_read failed")
    return box.get("value")
