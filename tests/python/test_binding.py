"""Unit tests of the Python binding (python/deadpool): statuses, errors, callbacks that raise,
regions that appear and move. Prints `ok - NAME` / `not ok - NAME`; run by tests/e2e_python.sh.
The tests that need a job start `deadpool run` (loopback only, bounded by a timeout)."""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("DEADPOOL_LIB", os.path.join(ROOT, "build", "libdeadpool.so"))
import deadpool  # noqa: E402

failed = 0


def check(name, cond, detail=""):
    global failed
    if cond:
        print("ok - %s" % name, flush=True)
    else:
        failed += 1
        print("not ok - %s" % name)
        for line in str(detail).splitlines()[-8:]:
            print("  " + line)
        sys.stdout.flush()


def raises(fn, exc=deadpool.Error):
    try:
        fn()
    except exc as e:
        return str(e)
    return None


# --- without a job ---
header = open(os.path.join(ROOT, "include", "deadpool.h")).read()
values = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"\bDP_([A-Z_]+) = (-?\d+)", header))
check("statuses_match_the_header", all(values[s.name] == s.value for s in deadpool.Status), values)
check("roles_match_the_header", all(values.get("ROLE_" + r.name) == r.value for r in deadpool.Role), values)
check("kinds_match_the_header", all(values.get(k.name) == k.value for k in deadpool.Kind), values)
m = re.search(r"#define DEADPOOL_API_VERSION (\d+)", header)
check("api_version_matches_the_header", m and int(m.group(1)) == deadpool.API_VERSION)
v = re.search(r'#define DEADPOOL_VERSION "([^"]+)"', header).group(1)
setup = open(os.path.join(ROOT, "python", "setup.py")).read()
check("one_version_header_library_package", deadpool.version() == v and deadpool.__version__ == v
      and 'version="%s"' % v in setup, (v, deadpool.version(), deadpool.__version__))
check("status_names_from_the_library", [str(s) for s in deadpool.Status] == ["ok", "error", "failed", "stopped", "fenced"],
      [str(s) for s in deadpool.Status])

msg = raises(lambda: deadpool.Job())
check("job_outside_a_job_says_how_to_start_it", msg and "deadpool run" in msg, msg)
try:
    deadpool.Job()
    status = None
except deadpool.Error as e:
    status = getattr(e, "exit_status", None)
check("job_that_cannot_start_says_its_exit_status", status == 1, status)  # a bad job, not Redis away

r = subprocess.run([sys.executable, "-c", "import deadpool; deadpool.Job()"], capture_output=True, text=True,
                   env=dict(os.environ, DEADPOOL_LIB="/nonexistent/libdeadpool.so",
                            PYTHONPATH=os.path.join(ROOT, "python")), timeout=60)
check("missing_library_named", r.returncode != 0 and "/nonexistent/libdeadpool.so" in r.stderr
      and "DEADPOOL_LIB" in r.stderr, r.stderr)

check("callbacks_require_regions_and_reset", raises(lambda: deadpool.Callbacks(regions=None, reset=None)))

import numpy as np  # noqa: E402
msg = raises(lambda: deadpool._float_buffer(np.zeros(4, dtype=np.float64), "x"))
check("collective_buffer_type_checked", msg and "float32" in msg, msg)
try:
    import torch
    msg = raises(lambda: deadpool._float_buffer(torch.zeros(4, dtype=torch.float16), "x"))
    msg2 = raises(lambda: deadpool._float_buffer(torch.zeros(4, 4).t(), "x"))
    check("collective_tensor_checked", msg and "float32" in msg and msg2 and "contiguous" in msg2, (msg, msg2))
    from deadpool.torch import partition
    owners = partition([10, 50, 30, 30, 5], 2)
    check("zero_partition_deterministic_and_balanced", owners == partition([10, 50, 30, 30, 5], 2)
          and owners == [0, 0, 1, 1, 0], owners)  # 50->0, 30->1, 30->1, 10->0, 5->0 (tie)
except ImportError:
    check("collective_tensor_checked # SKIP no torch", True)

msg = raises(lambda: deadpool.checkpoint_read("/nonexistent/ckpt", 0, lambda g: 0))
check("checkpoint_read_of_a_missing_directory", msg and "/nonexistent/ckpt" in msg, msg)

# --- in a job ---
DP = os.path.join(ROOT, "deadpool")
PROG = [sys.executable, os.path.join(ROOT, "tests", "python", "binding_job.py")]
work = tempfile.mkdtemp(prefix="dp_py_")


def job(name, mode, *args):
    out = os.path.join(work, name)
    try:
        r = subprocess.run([DP, "run", "--workers", "2", "--steps", "12", "--seed", "3", "--out", out] + list(args)
                           + ["--"] + PROG + [mode], capture_output=True, text=True, timeout=120)
        return r.returncode, r.stderr, out
    except subprocess.TimeoutExpired as e:
        return 124, (e.stderr or b"").decode(errors="replace"), out


rc, err, out = job("ref", "moving", "--spares", "0")
ref = open(os.path.join(out, "state.bin"), "rb").read() if rc == 0 else b""
check("moving_regions_run", rc == 0 and len(ref) == 8000, err)
rc, err, out = job("moved", "moving", "--spares", "1", "--inject", "kill:1@6", "--inject", "kill:0@9")
got = open(os.path.join(out, "state.bin"), "rb").read() if rc == 0 else b""
events = open(os.path.join(out, "events.jsonl")).read() if os.path.exists(os.path.join(out, "events.jsonl")) else ""
check("regions_that_appear_and_move_restored_bit_identical",
      rc == 0 and got == ref and events.count('"event":"recovered"') >= 2, err)
check("finish_twice_raises", "binding: finish twice: finish called twice" in err, err)

rc, err, out = job("raise_restore", "raise_restore", "--spares", "1", "--inject", "kill:1@5", "--spare-wait", "2")
check("restore_that_raises_is_an_error_not_a_crash",
      rc != 0 and "restore callback raised ValueError: boom" in err and "Segmentation" not in err
      and "core dumped" not in err and "Traceback" not in err, err)

rc, err, out = job("raise_regions", "raise_regions", "--spares", "0")
check("regions_that_raise_is_an_error_not_a_crash",
      rc != 0 and re.search(r"binding: raised deadpool.Error: commit: the regions callback raised RuntimeError: regions "
                            r"exploded", err) is not None and "Segmentation" not in err, err)

# deadpool.torch with state of the rank's own: the RNG (dropout) and a data cursor the RNG moves.
TORCH_PROG = [sys.executable, os.path.join(ROOT, "tests", "python", "torch_job.py")]


def torch_job(name, *args, zero=False):
    out = os.path.join(work, name)
    cmd = [DP, "run", "--workers", "2", "--spares", "1", "--steps", "16", "--seed", "3", "--out", out] + list(args)
    try:
        r = subprocess.run(cmd + ["--"] + TORCH_PROG + (["zero"] if zero else []), capture_output=True, text=True,
                           timeout=180)
    except subprocess.TimeoutExpired as e:
        return b"", (e.stderr or b"").decode(errors="replace"), ""
    path = os.path.join(out, "tiny.pt")
    ev = os.path.join(out, "events.jsonl")
    return (open(path, "rb").read() if r.returncode == 0 and os.path.exists(path) else b""), r.stderr, \
        (open(ev).read() if os.path.exists(ev) else "")


try:
    import torch  # noqa: F401
    for zero in (False, True):
        tag = "zero1" if zero else "plain"
        ref, err, _ = torch_job("t_ref_" + tag, zero=zero)
        got, err2, ev = torch_job("t_kill_" + tag, "--inject", "kill:1@6", "--inject", "kill:0@11", zero=zero)
        check("torch_rng_and_cursor_restored_%s" % tag, ref and got == ref and ev.count('"event":"recovered"') >= 2,
              err + err2)
except ImportError:
    check("torch_rng_and_cursor_restored # SKIP no torch", True)

# The `deadpool` torch.distributed backend: collectives by dtype and op, async ones, broadcast,
# all_gather, barrier and the errors (tests/python/ddp_backend_job.py checks them on every rank
# and step); two kills with collectives in flight end with the failure-free DDP model.
DDP_PROG = [sys.executable, os.path.join(ROOT, "tests", "python", "ddp_backend_job.py")]


def ddp_job(name, *args):
    out = os.path.join(work, name)
    os.makedirs(out, exist_ok=True)
    cmd = [DP, "run", "--workers", "3", "--spares", "1", "--steps", "12", "--out", out] + list(args)
    try:
        r = subprocess.run(cmd + ["--"] + DDP_PROG + [out], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        return 124, b"", 0, (e.stderr or b"").decode(errors="replace"), ""
    read = lambda f, mode="r": open(os.path.join(out, f), mode).read() if os.path.exists(os.path.join(out, f)) else None  # noqa: E731
    return r.returncode, read("ddp.pt", "rb"), int(read("checks.txt") or 0), r.stderr, read("events.jsonl") or ""


try:
    import torch  # noqa: F401,F811
    rc, ref, n, err, _ = ddp_job("ddp_ref")
    check("ddp_backend_collectives_by_dtype_and_op (%d checks on rank 0)" % n, rc == 0 and ref and n == 12 * 19, err)
    rc, got, n, err, ev = ddp_job("ddp_kill", "--inject", "kill:1@5", "--inject", "kill:0@9")
    check("ddp_backend_two_kills_with_collectives_in_flight",
          rc == 0 and ref and got == ref and ev.count('"event":"recovered"') >= 2, err)
except ImportError:
    check("ddp_backend # SKIP no torch", True)

sys.exit(1 if failed else 0)
