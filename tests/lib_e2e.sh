# lib_e2e.sh — helpers for the end-to-end tests (sourced). Each test prints "ok - name" or
# "not ok - name"; every wait is bounded; only processes this script started are killed.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DP="$ROOT/deadpool"
MODELDIFF="$ROOT/build/tests/tool_modeldiff"
WORK=$(mktemp -d /tmp/dp_e2e_XXXXXX)
# KEEP_WORK=1 keeps the runs' directories for a look after a failure.
if [ -n "${KEEP_WORK:-}" ]; then echo "# keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
SHAKESPEARE="$ROOT/../shared/data/tinyshakespeare.txt"

# The secret a test's jobs across machines (and the workers it starts by hand) share
# (deadpool run/worker --secret-file): one line, mode 0600.
SECRET_FILE=$WORK/job.secret
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$SECRET_FILE")
ok() { echo "ok - $1"; }
notok() { echo "not ok - $1"; shift; for l in "$@"; do echo "  $l"; done; }

# run_job OUTDIR TIMEOUT_S ARGS... — runs `deadpool run` with a bound; stderr to OUTDIR.log.
run_job() {
  local out=$1 limit=$2; shift 2
  mkdir -p "$out"
  timeout -k 5 "$limit" "$DP" run --out "$out" "$@" >"$out.stdout" 2>"$out.log"
}

# pids_of_job OUTDIR — every process pid the job reported (workers, spares).
pids_of_job() {
  grep -o '"pid":[0-9]*' "$1/events.jsonl" 2>/dev/null | cut -d: -f2 | sort -u
  grep -o 'pid [0-9]*' "$1.log" 2>/dev/null | cut -d' ' -f2 | sort -u
}

# no_leftovers OUTDIR — true when no process the job started is still alive.
no_leftovers() {
  local p
  for p in $(pids_of_job "$1"); do
    if kill -0 "$p" 2>/dev/null && grep -qa deadpool "/proc/$p/cmdline" 2>/dev/null; then return 1; fi
    if kill -0 "$p" 2>/dev/null && grep -qa redis "/proc/$p/cmdline" 2>/dev/null; then return 1; fi
  done
  return 0
}

# expect_like REF NAME MIN_RECOVERED ARGS... — `deadpool run ARGS` into $WORK/NAME (bounded by
# RUN_LIMIT s, 180) must exit 0 with at least MIN_RECOVERED `recovered` events, leave no process
# behind, and write E2E_MODEL (model.bin) byte-identical to $WORK/REF's.
expect_like() {
  local ref=$1 name=$2 n=$3 model=${E2E_MODEL:-model.bin}; shift 3
  run_job "$WORK/$name" "${RUN_LIMIT:-180}" "$@"; local rc=$?
  local got bad=""
  got=$(grep -c '"event":"recovered"' "$WORK/$name/events.jsonl" 2>/dev/null)
  [ $rc -eq 0 ] || bad="rc $rc"
  [ "${got:-0}" -ge "$n" ] || bad="$bad; $got recovered events, expected >= $n"
  cmp -s "$WORK/$ref/$model" "$WORK/$name/$model" || bad="$bad; $model differs from the failure-free run"
  no_leftovers "$WORK/$name" || bad="$bad; processes left behind"
  if [ -z "$bad" ]; then ok "$name ($got recovered)"; else notok "$name" "$bad" "$(tail -5 "$WORK/$name.log")"; fi
}

count_lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }

# stall_report OUT FROM_MS TO_MS [REF] — "STEPS STALL_OK MAX MEDIAN CALM": the steps whose end
# falls in the outage (wall ms, + 0.5 s), their longest step, the median step, and the longest
# step while Redis was fine (the machine's own noise: this run's steps outside the outage and,
# given REF, a failure-free run's, so that the calm sample is not much smaller than the
# outage's). STALL_OK = 1 when the outage's longest step exceeds the calm longest by at most
# what the design lets the step that meets an outage pay: its three bounded Redis calls on the
# training path (fence check, commit record, a collective partner's), each
# max(5 ms, a third of a step) (rt_telemetry.c, rt_path_timeout_ms); and the outage's median step is at
# most twice the calm one. A wait on Redis itself would cost the outage's length; a bounded
# wait paid on every step would show in the median.
stall_report() {
  /usr/bin/python3 - "$1" "$2" "$3" "${4:-}" <<'EOF'
import json, sys
out, a, b, ref = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def steps(d):
    seen = {}
    for l in open(d + "/metrics.jsonl"):
        m = json.loads(l); seen[m["step"]] = m  # a line sent twice counts once
    return sorted(seen.values(), key=lambda m: m["step"])
t0 = None
for l in open(out + "/events.jsonl"):
    e = json.loads(l)
    if e.get("event") == "start": t0 = e["t0_ms"]; break
ms = steps(out)
times = sorted(m["step_ms"] for m in ms)
med = times[len(times) // 2]
lo, hi = (a - t0) / 1e3, (b - t0) / 1e3 + 0.5
during = [m for m in ms if lo <= m["t"] <= hi]
# the steps while Redis was fine (after the first 5, and not just after the outage)
calm = [m["step_ms"] for m in ms[5:] if m["t"] < lo or m["t"] > hi + 1.0]
if ref: calm += [m["step_ms"] for m in steps(ref)[5:]]
mx = max((m["step_ms"] for m in during), default=0.0)
noise = max(calm, default=med)
allowed = 3 * max(5.0, med / 3)
# ... and the outage's steps are not each slower (a bounded wait paid on every step)
dmed = sorted(m["step_ms"] for m in during)[len(during) // 2] if during else 0.0
cmed = sorted(calm)[len(calm) // 2] if calm else med
ok = len(during) > 0 and mx <= noise + allowed and dmed <= 2 * cmed
print("%d %d %.1f %.1f %.1f" % (len(during), int(ok), mx, med, noise))
EOF
}

# redis_private NAME — a redis-server of this test's own on a random loopback port with a random
# password (no persistence): sets port, pw, rp (its pid), exports DEADPOOL_REDIS_PASSWORD and
# defines rcli. Non-zero (after "not ok - NAME_redis_started") when it does not answer in 5 s.
redis_private() {
  port=$((20000 + RANDOM % 20000)); pw=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf 'port %s\nbind 127.0.0.1\nrequirepass %s\nsave ""\nappendonly no\n' "$port" "$pw" | redis-server - >/dev/null 2>&1 &
  rp=$!
  for _ in $(seq 100); do redis-cli -p "$port" -a "$pw" --no-auth-warning ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  redis-cli -p "$port" -a "$pw" --no-auth-warning ping 2>/dev/null | grep -q PONG || { notok "$1_redis_started" "port $port"; return 1; }
  export DEADPOOL_REDIS_PASSWORD=$pw
  rcli() { redis-cli -p "$port" -a "$pw" --no-auth-warning "$@" 2>/dev/null; }
}
