"""Finds and loads libdeadpool.so and declares deadpool.h's functions for ctypes.

ctypes.CDLL releases the GIL for the length of every call, so DeadPool's waits (a spare in
dp_join, a collective, dp_recover) do not block the interpreter's other threads; callbacks
take the GIL back when the library calls into Python.
"""
import ctypes
import os
import shutil

LIB_ENV = "DEADPOOL_LIB"


def _candidates():
    """Where libdeadpool.so may be, in order: DEADPOOL_LIB, beside this package when it was
    installed by `make install` (PREFIX/lib/python3/dist-packages/deadpool -> PREFIX/lib), and
    next to the `deadpool` binary on the PATH (a build tree: ./deadpool + build/; an install:
    PREFIX/bin/deadpool + PREFIX/lib)."""
    env = os.environ.get(LIB_ENV)
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for up in ("../../..", "../../../.."):  # PREFIX/lib/python3/dist-packages, PREFIX/lib/python3.X/site-packages
        yield os.path.normpath(os.path.join(here, up, "libdeadpool.so"))
    # The source tree: python/deadpool -> build/.
    yield os.path.normpath(os.path.join(here, "..", "..", "build", "libdeadpool.so"))
    exe = shutil.which("deadpool")
    if exe:
        d = os.path.dirname(os.path.realpath(exe))
        yield os.path.join(d, "build", "libdeadpool.so")
        yield os.path.normpath(os.path.join(d, "..", "lib", "libdeadpool.so"))


def find():
    """The path of the library to load; raises OSError naming every place looked at."""
    tried = []
    for path in _candidates():
        if os.path.isfile(path):
            return path
        tried.append(path)
    how = "set %s to its path" % LIB_ENV if not os.environ.get(LIB_ENV) else "%s names no file" % LIB_ENV
    raise OSError("libdeadpool.so not found (looked at %s); build it with `make`, install it with "
                  "`make install`, or %s" % (", ".join(tried) or "nothing", how))


# --- deadpool.h's types -------------------------------------------------------------------

class Region(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("kind", ctypes.c_int), ("ptr", ctypes.c_void_p),
                ("len", ctypes.c_size_t)]


class Generation(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("rank", ctypes.c_int), ("world", ctypes.c_int),
                ("extra", ctypes.c_void_p), ("extra_len", ctypes.c_size_t),
                ("regions", ctypes.POINTER(Region)), ("nregions", ctypes.c_int)]


class Metrics(ctypes.Structure):
    _fields_ = [("loss", ctypes.c_double), ("lr", ctypes.c_double), ("grad_norm", ctypes.c_double),
                ("tokens", ctypes.c_double)]


class Options(ctypes.Structure):
    _fields_ = [("redis_url", ctypes.c_char_p), ("job", ctypes.c_char_p), ("spare", ctypes.c_int),
                ("rank", ctypes.c_int), ("bind_host", ctypes.c_char_p)]


ERRBUF = ctypes.c_char_p
REGIONS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Region), ctypes.c_int)
RESTORE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Generation), ctypes.c_void_p,
                              ctypes.c_size_t)
RESET_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
REBUILD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
CHECKPOINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_size_t)
READ_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Generation))


class Callbacks(ctypes.Structure):
    _fields_ = [("regions", REGIONS_FN), ("restore", RESTORE_FN), ("reset", RESET_FN),
                ("rebuild", REBUILD_FN), ("checkpoint", CHECKPOINT_FN), ("arg", ctypes.c_void_p)]


def _declare(lib):
    P, I, I64, SZ, U32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_uint32
    F = ctypes.POINTER(ctypes.c_float)
    S = ctypes.c_char_p
    sigs = {
        "dp_init": (P, [ctypes.POINTER(Options), P, SZ]),
        "dp_join": (I, [P, ctypes.POINTER(Callbacks), P, SZ]),
        "dp_finish": (I, [P, I]),
        "dp_get_role": (I, [P]),
        "dp_rank": (I, [P]),
        "dp_world": (I, [P]),
        "dp_local_rank": (I, [P]),
        "dp_next_step": (I64, [P]),
        "dp_steps": (I64, [P]),
        "dp_seed": (ctypes.c_uint64, [P]),
        "dp_out_dir": (S, [P]),
        "dp_resume_dir": (S, [P]),
        "dp_epoch": (ctypes.c_long, [P]),
        "dp_store_prefix": (I, [P, P, SZ]),
        "dp_last_error": (S, [P]),
        "dp_version": (S, []),
        "dp_status_str": (S, [I]),
        "dp_replica_spread": (None, [P, I]),
        "dp_step_before_reduce": (I, [P, I64]),
        "dp_step_before_update": (I, [P]),
        "dp_step_commit": (I, [P, I64, P, SZ, ctypes.POINTER(Metrics)]),
        "dp_aborted": (I, [P]),
        "dp_recover": (I, [P, P, SZ]),
        "dp_allreduce_sum": (I, [P, F, SZ]),
        "dp_allgather": (I, [P, F, F, SZ]),
        "dp_broadcast": (I, [P, P, SZ, I]),
        "dp_barrier": (I, [P]),
        "dp_group_join": (P, [P, S, I, I, P, SZ]),
        "dp_group_index": (I, [P]),
        "dp_group_size": (I, [P]),
        "dp_group_allreduce_sum": (I, [P, F, SZ]),
        "dp_group_allgather": (I, [P, F, F, SZ]),
        "dp_group_send": (I, [P, P, SZ, I, U32]),
        "dp_group_recv": (I, [P, P, SZ, I, U32]),
        "dp_group_wait_sends": (I, [P]),
        "dp_checkpoint_read": (I, [S, I, READ_FN, P, P, SZ]),
        "dp_output_saved": (None, [P, S]),
        "dp_log": (None, [P, S, S]),
        "dp_allreduce_mean": (I, [P, F, SZ]),
        "dp_group_allreduce_mean": (I, [P, F, SZ]),
        "dp_iallreduce": (I, [P, P, SZ, I, I, ctypes.POINTER(P)]),
        "dp_iallgather": (I, [P, P, P, SZ, I, ctypes.POINTER(P)]),
        "dp_ibroadcast": (I, [P, P, SZ, I, ctypes.POINTER(P)]),
        "dp_wait": (I, [P]),
        "dp_test": (I, [P]),
    }
    for name, (res, args) in sigs.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise OSError("%s has no %s: it is older than this package (rebuild it)" % (lib._name, name)) from None
        fn.restype = res
        fn.argtypes = args


_lib = None


def lib():
    """The loaded library (loaded once, on first use)."""
    global _lib
    if _lib is None:
        path = find()
        try:
            loaded = ctypes.CDLL(path)
        except OSError as e:
            raise OSError("%s: cannot load: %s" % (path, e)) from None
        _declare(loaded)
        _lib = loaded
    return _lib
