"""A job's program for tests/python/test_binding.py: the low-level binding (deadpool.Job) with
numpy state, in one of these modes (argv[1]):
  moving        state that appears at step 2 and moves to a new buffer every step (the
                regions callback reports where it is now); writes OUT/state.bin at the end;
  raise_restore the restore callback raises ValueError("boom") when a rank is restored;
  raise_regions the regions callback raises at step 3.
It prints what the test checks on stderr ("binding: ...")."""
import sys

import numpy as np

import deadpool

mode = sys.argv[1]
job = deadpool.Job()
assert isinstance(job.role, deadpool.Role)
N = 1000
state = {"w": np.zeros(N, dtype=np.float32), "m": None}
state["w"][:] = np.arange(N, dtype=np.float32) / N


def regions():
    if mode == "raise_regions" and job.next_step >= 0 and state.get("step", 0) >= 3:
        raise RuntimeError("regions exploded")
    out = [deadpool.Region(1, deadpool.Kind.IDENTICAL, state["w"].ctypes.data, state["w"].nbytes, state["w"])]
    if state["m"] is not None:
        out.append(deadpool.Region(2, deadpool.Kind.IDENTICAL, state["m"].ctypes.data, state["m"].nbytes, state["m"]))
    return out


def restore(g):
    if mode == "raise_restore":
        raise ValueError("boom")
    w = g.region(1)
    if w is not None:
        state["w"][:] = np.frombuffer(w, dtype=np.float32)
    m = g.region(2)
    state["m"] = None if m is None else np.frombuffer(m, dtype=np.float32).copy()


def reset():
    state["w"][:] = np.arange(N, dtype=np.float32) / N
    state["m"] = None


st = job.join(deadpool.Callbacks(regions=regions, reset=reset, restore=restore))
grads = np.zeros(N + 1, dtype=np.float32)
try:
    while st == deadpool.Status.OK:
        step = job.next_step
        while step < job.steps and st == deadpool.Status.OK:
            state["step"] = step
            rng = np.random.default_rng(step * 1000 + job.rank)
            grads[:N] = rng.standard_normal(N, dtype=np.float32)
            grads[N] = 1.0
            st = job.before_reduce(step)
            if st == deadpool.Status.OK:
                st = job.allreduce_mean(grads)
            if st == deadpool.Status.OK:
                st = job.before_update()
            if st != deadpool.Status.OK:
                break
            assert grads[N] == 1.0, grads[N]  # the mean of ones
            if step >= 2:  # state appears, then moves every step: a new buffer each time
                m = np.zeros(N, dtype=np.float32) if state["m"] is None else state["m"].copy()
                m = np.float32(0.9) * m + grads[:N]
                state["m"] = m
                state["w"] -= np.float32(0.01) * m
            st = job.commit(step, loss=float(grads[N]))
            step += 1
        if st != deadpool.Status.FAILED:
            break
        st = job.recover()
except deadpool.Error as e:
    print("binding: raised deadpool.Error: %s" % e, file=sys.stderr, flush=True)
    sys.exit(job.finish(deadpool.Status.ERR))
if st == deadpool.Status.OK and job.rank == 0:
    with open(job.out_dir + "/state.bin", "wb") as f:
        f.write(state["w"].tobytes() + (state["m"].tobytes() if state["m"] is not None else b""))
rc = job.finish(st)
try:
    job.finish(st)
except deadpool.Error as e:
    print("binding: finish twice: %s" % e, file=sys.stderr, flush=True)
sys.exit(rc)
