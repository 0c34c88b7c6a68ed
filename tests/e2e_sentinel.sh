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
