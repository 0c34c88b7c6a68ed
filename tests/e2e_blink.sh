#!/usr/bin/env bash
# e2e_blink.sh — the control plane can vanish without costing a step (issue 27, items 11-12).
# Training needs Redis only to handle a failure: with no process failing, the job trains on
# through a Redis stall (SIGSTOP), a Redis kill (the launcher starts it again, empty, on the
# same port: everybody republishes) and a Sentinel failover (one whose first attempt aborts
# too); its steps during the outage are at most the bounded Redis calls of the step that meets
# the outage longer than the steps while Redis is fine (stall_report in lib_e2e.sh), and the model is byte-identical to the failure-free run. A worker killed while Redis
# is stopped: the job waits for Redis and recovers, byte-identical. Redis gone longer than
# --control-wait with a failed worker: the job stops with a checkpoint and `--resume` ends with
# the same model. A Redis stall while the processes start is no bad job (item 12).
# Every wait is bounded; only processes this script started are signalled, by pid.
source "$(dirname "$0")/lib_e2e.sh"

STEPS=1000
ARGS=(--workers 2 --spares 1 --model tiny --steps "$STEPS" --seed 11)
run_job "$WORK/ref" 180 "${ARGS[@]}"
[ -s "$WORK/ref/model.bin" ] || { notok "blink_reference" "$(tail -3 "$WORK/ref.log")"; exit 1; }

redis_pid() { grep -o 'embedded redis-server on [^ ]* (pid [0-9]*' "$1.log" 2>/dev/null | tail -1 | grep -o '[0-9]*$'; }
master_pid() { grep -o 'master 127.0.0.1:[0-9]* (pid [0-9]*' "$1.log" 2>/dev/null | grep -o '[0-9]*$'; }
replica_pid() { grep -o 'replica :[0-9]* (pid [0-9]*' "$1.log" 2>/dev/null | grep -o '[0-9]*$'; }
worker_pid() { grep -o "\"rank\":$2,\"proc\":[0-9]*,\"pid\":[0-9]*" "$1/events.jsonl" 2>/dev/null | head -1 | grep -o '[0-9]*$'; }
is_redis() { [ -n "$1" ] && grep -qa redis "/proc/$1/cmdline" 2>/dev/null; }
is_ours() { [ -n "$1" ] && grep -qa deadpool "/proc/$1/cmdline" 2>/dev/null; }
wait_steps() { for _ in $(seq 1200); do [ "$(count_lines "$1/metrics.jsonl")" -ge "$2" ] && return 0; kill -0 "$3" 2>/dev/null || break; sleep 0.05; done
  echo "# waited up to 60 s for $2 steps in $1/metrics.jsonl: saw $(count_lines "$1/metrics.jsonl"), job $(kill -0 "$3" 2>/dev/null && echo running || echo exited)" >&2; return 1; }
now_ms() { date +%s%3N; }


# outage NAME KIND SECONDS [ARGS...] — runs the job, and at step 60: KIND stop (SIGSTOP for
# SECONDS) or kill (-9, the launcher restarts it) the embedded Redis. No process fails.
outage() {
  local name=$1 kind=$2 secs=$3 out="$WORK/$1"; shift 3
  mkdir -p "$out"
  timeout -k 5 240 "$DP" run --out "$out" "${ARGS[@]}" "$@" >"$out.stdout" 2>"$out.log" &
  local job=$! a b rp
  wait_steps "$out" 60 $job
  rp=$(redis_pid "$out"); a=$(now_ms)
  if ! is_redis "$rp"; then notok "$name" "no embedded redis-server found"; wait $job; return; fi
  if [ "$kind" = stop ]; then kill -STOP "$rp"; sleep "$secs"; kill -CONT "$rp"; else kill -9 "$rp"; sleep 1; fi
  b=$(now_ms)
  wait $job; local rc=$? bad=""
  [ $rc -eq 0 ] || bad="rc $rc"
  cmp -s "$WORK/ref/model.bin" "$out/model.bin" || bad="$bad; the model differs from the failure-free run"
  grep -q '"event":"recovered"' "$out/events.jsonl" && bad="$bad; a recovery happened (nothing failed)"
  no_leftovers "$out" || bad="$bad; processes left behind"
  local n stall_ok mx med noise; read -r n stall_ok mx med noise <<<"$(stall_report "$out" "$a" "$b" "$WORK/ref")"
  [ "${stall_ok:-0}" = 1 ] || bad="$bad; stalled: $n steps during the outage, the longest $mx ms (median $med, longest while Redis was fine $noise)"
  if [ -z "$bad" ]; then ok "$name ($n steps during the outage, longest $mx ms, median $med, longest while Redis was fine $noise)"
  else notok "$name" "$bad" "$(grep -v '^step' "$out.log" | tail -6)"; fi
}

outage blink_redis_stopped_3s_job_trains_on stop 3
outage blink_redis_stopped_10s_job_trains_on stop 10
outage blink_redis_killed_restarted_job_trains_on kill 0

# resume_bad OUT — runs `deadpool run --resume OUT`; prints what went wrong ("" when it ended
# with the failure-free model).
resume_bad() {
  local bad=""
  timeout -k 5 180 "$DP" run --resume "$1" >"$1.resume.stdout" 2>"$1.resume.log" || bad="resume failed: $(tail -2 "$1.resume.log")"
  cmp -s "$WORK/ref/model.bin" "$1/model.bin" || bad="$bad; the resumed model differs from the failure-free run"
  echo "$bad"
}

# A worker killed while Redis is stopped: its committed state is kept, the failure waits for
# the control plane; when Redis returns the job recovers. SECONDS, then EXPECT: recover | stop.
fail_in_outage() {
  local name=$1 secs=$2 expect=$3 out="$WORK/$1"; shift 3
  mkdir -p "$out"
  timeout -k 5 240 "$DP" run --out "$out" "${ARGS[@]}" "$@" >"$out.stdout" 2>"$out.log" &
  local job=$! rp wp
  wait_steps "$out" 60 $job
  rp=$(redis_pid "$out"); wp=$(worker_pid "$out" 1)
  if ! is_redis "$rp" || ! is_ours "$wp"; then notok "$name" "redis '$rp' or rank 1 '$wp' not found"; wait $job; return; fi
  kill -STOP "$rp"; sleep 0.5; kill -9 "$wp"; sleep "$secs"; kill -CONT "$rp"
  wait $job; local rc=$? bad=""
  if [ "$expect" = recover ]; then
    [ $rc -eq 0 ] || bad="rc $rc"
    grep -q '"event":"recovered"' "$out/events.jsonl" || bad="$bad; no recovery"
    cmp -s "$WORK/ref/model.bin" "$out/model.bin" || bad="$bad; the model differs from the failure-free run"
  else
    [ $rc -ne 0 ] || bad="rc 0 (expected a stop)"
    grep -q 'deadpool run --resume' "$out.log" || bad="$bad; no resume command"
    [ -n "$bad" ] || bad=$(resume_bad "$out")
  fi
  no_leftovers "$out" || bad="$bad; processes left behind"
  local back; back=$(grep -o 'deadpool\] the control plane is back after [0-9.]* s' "$out.log" | head -1 | grep -o '[0-9.]* s')
  if [ -z "$bad" ]; then ok "$name (Redis back after ${back:-?}; $(grep -o 'rolling back to step [0-9]*\|the state of step [0-9]*' "$out.log" | head -1))"
  else notok "$name" "$bad" "$(grep -v '^step' "$out.log" | tail -6)"; fi
}

fail_in_outage blink_worker_killed_while_redis_stopped_recovers 3 recover
fail_in_outage blink_redis_gone_past_control_wait_stops_resumable 8 stop --control-wait 2

# Sentinel: the master killed (and with the replica stopped for 13 s meanwhile, so that the
# failover attempts find no good replica and abort: the sentinels try again after
# twice the failover timeout, 6 s; an outage of about 14 s). The job trains on, byte-identical.
sentinel() {
  local name=$1 replica_stop=$2 out="$WORK/$1"
  mkdir -p "$out"
  timeout -k 5 240 "$DP" run --out "$out" "${ARGS[@]}" --redis-ha >"$out.stdout" 2>"$out.log" &
  local job=$! mp rpl
  wait_steps "$out" 60 $job
  mp=$(master_pid "$out"); rpl=$(replica_pid "$out")
  if ! is_redis "$mp" || ! is_redis "$rpl"; then notok "$name" "master '$mp' or replica '$rpl' not found"; wait $job; return; fi
  [ "$replica_stop" -gt 0 ] && kill -STOP "$rpl"
  kill -9 "$mp"
  if [ "$replica_stop" -gt 0 ]; then sleep "$replica_stop"; kill -CONT "$rpl"; fi
  wait $job; local rc=$? bad=""
  [ $rc -eq 0 ] || bad="rc $rc"
  cmp -s "$WORK/ref/model.bin" "$out/model.bin" || bad="$bad; the model differs from the failure-free run"
  grep -q '"event":"recovered"' "$out/events.jsonl" && bad="$bad; a recovery happened (nothing failed)"
  no_leftovers "$out" || bad="$bad; processes left behind"
  local back; back=$(grep -o 'deadpool\] the control plane is back after [0-9.]* s' "$out.log" | head -1 | grep -o '[0-9.]* s')
  if [ -z "$bad" ]; then ok "$name (the coordinator saw Redis back after ${back:-?})"
  else notok "$name" "$bad" "$(grep -v '^step' "$out.log" | tail -6)"; fi
}
sentinel blink_sentinel_master_killed_job_trains_on 0
sentinel blink_sentinel_first_failover_aborts_job_trains_on 13

# Redis gone past --control-wait while a survivor waits after a failed join (the spare that
# took rank 1 is killed while recovering: rank 0's join fails, RETRYING; no spare is left).
# Rank 0 finds the control plane lost within --control-wait (its calls while it waits are
# bounded by a quarter of it, not the connection's 5 s: it used to notice only after Redis was
# back) and writes what it committed from its old epoch's snapshots; `--resume` ends with the
# failure-free model.
out="$WORK/joinfail_gone"; mkdir -p "$out"
timeout -k 5 240 "$DP" run --out "$out" "${ARGS[@]}" --control-wait 2 --inject kill:1@30 --inject rkill:1@1 \
  >"$out.stdout" 2>"$out.log" &
job=$!
for _ in $(seq 1200); do grep -q 'joining epoch 1 failed' "$out.log" 2>/dev/null && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
rp=$(redis_pid "$out"); bad=""
if is_redis "$rp" && grep -q 'joining epoch 1 failed' "$out.log"; then kill -STOP "$rp"; sleep 8; kill -CONT "$rp"
else bad="no failed join, or no redis-server ('$rp')"; fi
wait $job; rc=$?
[ $rc -ne 0 ] || bad="$bad; rc 0 (expected a stop)"
grep -q '\[rank 0\] the control plane is lost: the state of step [0-9]* is in' "$out.log" || bad="$bad; rank 0 did not persist"
[ -n "$bad" ] || bad=$(resume_bad "$out")
no_leftovers "$out" || bad="$bad; processes left behind"
if [ -z "$bad" ]; then ok "blink_redis_gone_after_a_failed_join_persists_resumable ($(grep -o 'the state of step [0-9]*' "$out.log" | head -1))"
else notok "blink_redis_gone_after_a_failed_join_persists_resumable" "$bad" "$(grep -v '^step' "$out.log" | tail -6)"; fi

# Item 12: Redis stopped for 6 s right after the job is published, while its processes start
# (each connection attempt times out after 5 s): they retry; the job trains on, identical.
out="$WORK/start_stall"; mkdir -p "$out"
timeout -k 5 240 "$DP" run --out "$out" "${ARGS[@]}" >"$out.stdout" 2>"$out.log" &
job=$!
for _ in $(seq 400); do grep -q '^\[deadpool\] job ' "$out.log" 2>/dev/null && break; sleep 0.01; done
grep -q '^\[deadpool\] job ' "$out.log" 2>/dev/null || echo "# waited 4 s for '[deadpool] job ' in $out.log: not seen (last: '$(tail -1 "$out.log" 2>/dev/null)')" >&2
rp=$(redis_pid "$out")
if is_redis "$rp"; then kill -STOP "$rp"; sleep 6; kill -CONT "$rp"; fi
wait $job; rc=$?
if [ $rc -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$out/model.bin" && ! grep -q "bad job" "$out.log" && no_leftovers "$out"; then
  ok "blink_redis_stall_while_processes_start_is_no_bad_job"
else notok "blink_redis_stall_while_processes_start_is_no_bad_job" "rc $rc" "$(grep -v '^step' "$out.log" | tail -14)"; fi
