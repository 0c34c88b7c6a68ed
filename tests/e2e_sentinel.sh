#!/usr/bin/env bash
# e2e_sentinel.sh — the control plane under Redis Sentinel (`--redis-ha`: an embedded master,
# replica and three sentinels on loopback): killing the master with -9 mid-run, the sentinels
# promote the replica, every process finds the new master, and the job finishes with the same
# model as without the failover; nothing is left behind.
source "$(dirname "$0")/lib_e2e.sh"

STEPS=300
ARGS=(--workers 2 --spares 1 --model tiny --steps "$STEPS" --seed 11)
run_job "$WORK/ref" 300 "${ARGS[@]}"
[ -s "$WORK/ref/model.bin" ] || { notok "sentinel_reference" "$(tail -3 "$WORK/ref.log")"; exit 1; }

# master_pid LOG — the embedded master's pid, from the launcher's control-plane line.
master_pid() { grep -o 'master 127.0.0.1:[0-9]* (pid [0-9]*' "$1" 2>/dev/null | grep -o '[0-9]*$'; }
step_of() { grep -oE '^step +[0-9]+' "$1" 2>/dev/null | tail -1 | grep -oE '[0-9]+' || echo 0; }

mkdir -p "$WORK/ha"
timeout -k 5 300 "$DP" run --out "$WORK/ha" "${ARGS[@]}" --redis-ha >"$WORK/ha.stdout" 2>"$WORK/ha.log" &
job=$!
for _ in $(seq 1200); do [ "$(step_of "$WORK/ha.stdout")" -ge 60 ] && break; kill -0 $job 2>/dev/null || break; sleep 0.05; done
[ "$(step_of "$WORK/ha.stdout")" -ge 60 ] || echo "# waited up to 60 s for step 60 in $WORK/ha.stdout: at step $(step_of "$WORK/ha.stdout")," \
  "job $(kill -0 $job 2>/dev/null && echo running || echo exited)" >&2
mp=$(master_pid "$WORK/ha.log")
killed=0
if [ -n "$mp" ] && grep -qa redis "/proc/$mp/cmdline" 2>/dev/null; then kill -9 "$mp" && killed=1; fi
wait $job; rc=$?
sentinel_left=$(pgrep -f "$(grep -o '/tmp/deadpool-run-[0-9]*-[A-Za-z0-9]*' "$WORK/ha.log" | head -1)/" | wc -l)
dir=$(grep -o '/tmp/deadpool-run-[0-9]*-[A-Za-z0-9]*' "$WORK/ha.log" | head -1)
if [ $rc -eq 0 ] && [ $killed -eq 1 ] && cmp -s "$WORK/ref/model.bin" "$WORK/ha/model.bin" && no_leftovers "$WORK/ha" \
   && [ "$sentinel_left" -eq 0 ] && [ -n "$dir" ] && [ ! -e "$dir" ]; then
  ok "redis_master_killed_under_sentinel_job_goes_on ($(grep -c '"event":"recovered"' "$WORK/ha/events.jsonl") recoveries)"
else notok "redis_master_killed_under_sentinel_job_goes_on" "rc $rc killed $killed (pid '$mp') sentinels left $sentinel_left" \
  "$(grep -v '^step' "$WORK/ha.log" | tail -8)"; fi

# The master's port squatted (issue 34 item 3): another local user (nobody) binds the dead
# master's port within milliseconds and records what the sentinels, the replica and the job's
# processes send it while they reconnect. The job's password (what reads and writes its keys)
# must not be among it: the processes check whose socket answers before AUTH, the replica and
# the sentinels authenticate as users of their own (dp-repl, dp-sentinel) with derived
# passwords. The job goes on, byte-identical.
mkdir -p "$WORK/sq"
timeout -k 5 300 "$DP" run --out "$WORK/sq" "${ARGS[@]}" --redis-ha >"$WORK/sq.stdout" 2>"$WORK/sq.log" &
job=$!
for _ in $(seq 1200); do [ "$(step_of "$WORK/sq.stdout")" -ge 60 ] && break; kill -0 $job 2>/dev/null || break; sleep 0.05; done
mp=$(master_pid "$WORK/sq.log")
mport=$(grep -o 'master 127.0.0.1:[0-9]*' "$WORK/sq.log" | head -1 | cut -d: -f2)
dir=$(grep -o '/tmp/deadpool-run-[0-9]*-[A-Za-z0-9]*' "$WORK/sq.log" | head -1)
pw=$(grep -oE '[0-9a-f]{64}' "$dir/redis" 2>/dev/null | head -1)
# the squatter: binds the port as soon as it is free, then takes every connection for 6 s
/usr/bin/python3 - "$mport" >"$WORK/squat.out" 2>"$WORK/squat.err" <<'PY' &
import os, select, socket, sys, time
port = int(sys.argv[1])
os.setgroups([]); os.setgid(65534); os.setuid(65534)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t0 = time.time()
while True:
    try:
        s.bind(("127.0.0.1", port)); break
    except OSError:
        if time.time() - t0 > 20: print("BIND FAILED"); sys.exit(1)
        time.sleep(0.001)
s.listen(64); print("BOUND uid %d" % os.getuid(), flush=True)
conns, end = [], time.time() + 6
while time.time() < end:
    r, _, _ = select.select([s] + conns, [], [], 0.1)
    for x in r:
        if x is s:
            c, _ = s.accept(); conns.append(c); print("CONN", flush=True)
        else:
            d = x.recv(4096)
            if d: sys.stdout.write(repr(d) + "\n"); sys.stdout.flush()
            else: conns.remove(x); x.close()
PY
sq=$!
sleep 0.2
killed=0
if [ -n "$mp" ] && grep -qa redis "/proc/$mp/cmdline" 2>/dev/null; then kill -9 "$mp" && killed=1; fi
wait $job; rc=$?
wait $sq
conns=$(grep -c '^CONN' "$WORK/squat.out"); users=$(grep -oE 'dp-(repl|sentinel)' "$WORK/squat.out" | sort -u | tr '\n' ' ')
if [ $rc -eq 0 ] && [ $killed -eq 1 ] && [ ${#pw} -eq 64 ] && grep -q '^BOUND uid 65534' "$WORK/squat.out" && [ "$conns" -gt 0 ] \
   && ! grep -qF "$pw" "$WORK/squat.out" && cmp -s "$WORK/ref/model.bin" "$WORK/sq/model.bin" && no_leftovers "$WORK/sq"; then
  ok "ha_master_port_squatted_the_password_never_sent ($conns connections to nobody's socket, users offered: ${users:-none}; model identical)"
else notok "ha_master_port_squatted_the_password_never_sent" "rc $rc killed $killed pw ${#pw} chars; $conns connections; password sent: $(grep -cF "$pw" "$WORK/squat.out")" \
  "$(head -3 "$WORK/squat.out")" "$(grep -v '^step' "$WORK/sq.log" | tail -5)"; fi
