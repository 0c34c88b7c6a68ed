#!/usr/bin/env bash
# chaos_long.sh — the long chaos harness: runs of one job, each with faults of a kind drawn
# from a seed, injected from inside (--inject) and from outside (signals to spares, holders
# and the redis-server, a full disk). Every run must end either recovered with the
# failure-free model byte for byte, or stopped cleanly with its committed state on disk from
# which `--resume` gives that same model. Hangs (a run past its bound) and orphans (a process
# of the run alive after it) must be 0.
#
# usage: tests/chaos_long.sh [FAULTS] [SEED] [REPORT.md]     (tests/e2e_chaos.sh runs a short one)
#        tests/chaos_long.sh control [SEED] [REPORT.md]      the control plane's faults, each once
#        (issue 27, item 11): Redis stopped 3, 10 and 60 s, killed (restarted by the launcher),
#        a Sentinel failover whose first attempts abort (master killed, replica stopped 13 s); no
#        process fails. Per fault: steps during the outage, the longest step against the median
#        and against the longest while Redis was fine, model identical yes/no.
# Kinds: worker_kill, worker_hang, spare_kill, spare_stop, holder_with_owner (owner and its
# ring holder at once, --replicas 2), corrupt_replica (every copy of a rank's newest state
# damaged in memory, then the rank is killed: the job stops naming where the good state is),
# recovery_failure (the spare dies while it restores), redis_kill, redis_stop, disk_full
# (root: --out on a tiny tmpfs); redis_stop_10, redis_stop_60 and sentinel_abort (the control
# plane's, see `control` above).
source "$(dirname "$0")/lib_e2e.sh"
FAULTS=${1:-500}
SEED=${2:-1}
REPORT=${3:-}
STEPS=60
CONTROL=0
if [ "$FAULTS" = control ]; then
  # Long enough to train through the longest outage (60 s at a few tens of ms a step).
  CONTROL=1; STEPS=${CONTROL_STEPS:-2500}; KINDS_CP=(redis_stop redis_stop_10 redis_stop_60 redis_kill sentinel_abort)
  FAULTS=${#KINDS_CP[@]}
fi
COMMON=(--workers 4 --model tiny --steps "$STEPS" --seed 11 --detect-timeout-ms 500)
KINDS=(worker_kill worker_hang spare_kill spare_stop holder_with_owner corrupt_replica recovery_failure redis_kill redis_stop)
[ "$(id -u)" -eq 0 ] && KINDS+=(disk_full)
[ -n "${CHAOS_KINDS:-}" ] && read -r -a KINDS <<<"$CHAOS_KINDS" # e.g. CHAOS_KINDS="redis_kill spare_kill"
RANDOM=$SEED
# A private copy of the binary: a rebuild during a long run must not change what runs.
cp "$DP" "$WORK/deadpool" && DP="$WORK/deadpool"

run_job "$WORK/ref" 600 "${COMMON[@]}" --spares 0 || { notok "chaos_long" "reference run failed"; exit 1; }
rows="$WORK/rows"; : >"$rows"
cp_rows="$WORK/cp_rows"; : >"$cp_rows"

pid_of() { grep "\"event\":\"$2\"" "$1/events.jsonl" 2>/dev/null | grep -o '"pid":[0-9]*' | cut -d: -f2 | head -"${3:-1}" | tail -1; }
wait_steps() { for _ in $(seq 400); do [ "$(count_lines "$1/metrics.jsonl")" -ge "$2" ] && return 0; sleep 0.025; done
  echo "# waited 10 s for $2 steps in $1/metrics.jsonl: saw $(count_lines "$1/metrics.jsonl")" >&2; return 1; }

# one_run N KIND — runs the job with faults of KIND; appends "kind faults outcome total_ms..." to rows.
one_run() {
  local n=$1 kind=$2 out="$WORK/r$1" args=(--spares 2) faults=1 at=$((10 + RANDOM % 40)) rank=$((RANDOM % 4))
  local outside=""
  case $kind in
    worker_kill) args+=(--inject "kill:$rank@$at") ;;
    worker_hang) args+=(--inject "stop:$rank@$at") ;;
    spare_kill | spare_stop) outside=$kind; args+=(--inject "kill:$rank@$((at + 10))"); faults=2 ;;
    holder_with_owner) args+=(--replicas 2 --inject "kill:$rank@$at" --inject "kill:$(((rank + 1) % 4))@$at"); faults=2 ;;
    corrupt_replica) args+=(--persist-every 5 --inject "corrupt:$rank@$at" --inject "kill:$rank@$at") ;;
    recovery_failure) args+=(--inject "kill:$rank@$at" --inject "rkill:$rank@1"); faults=2 ;;
    redis_kill | redis_stop | redis_stop_10 | redis_stop_60) outside=$kind ;;
    sentinel_abort) outside=$kind; args+=(--redis-ha) ;;
    disk_full) mkdir -p "$out" && mount -t tmpfs -o size=300k,mode=700 tmpfs "$out" || return 0 ;;
  esac
  mkdir -p "$out"
  TMPDIR="$WORK" "$DP" run --out "$out" "${COMMON[@]}" "${args[@]}" >"$out.stdout" 2>"$out.log" &
  local lp=$! t0; t0=$(date +%s)
  case $outside in
    spare_kill) wait_steps "$out" $((at - 5)); kill -9 "$(pid_of "$out" spare_joined)" 2>/dev/null ;;
    spare_stop) wait_steps "$out" $((at - 5)); local sp; sp=$(pid_of "$out" spare_joined)
                kill -STOP "$sp" 2>/dev/null; sleep 1; kill -CONT "$sp" 2>/dev/null ;;
    redis_kill | redis_stop | redis_stop_10 | redis_stop_60)
      wait_steps "$out" "$at"
      local rp secs=3; rp=$(grep -o 'embedded redis-server on [^ ]* (pid [0-9]*' "$out.log" | grep -o '[0-9]*$')
      [ "$outside" = redis_stop_10 ] && secs=10
      [ "$outside" = redis_stop_60 ] && secs=60
      cp_a=$(date +%s%3N)
      if [ "$outside" = redis_kill ]; then kill -9 "$rp" 2>/dev/null; sleep 1; else kill -STOP "$rp" 2>/dev/null; sleep $secs; kill -CONT "$rp" 2>/dev/null; fi
      cp_b=$(date +%s%3N) ;;
    sentinel_abort) # the master killed while the replica is stopped: failovers abort until it is back
      wait_steps "$out" "$at"
      local mp rpl; mp=$(grep -o 'master 127.0.0.1:[0-9]* (pid [0-9]*' "$out.log" | grep -o '[0-9]*$')
      rpl=$(grep -o 'replica :[0-9]* (pid [0-9]*' "$out.log" | grep -o '[0-9]*$')
      cp_a=$(date +%s%3N); kill -STOP "$rpl" 2>/dev/null; kill -9 "$mp" 2>/dev/null; sleep 13; kill -CONT "$rpl" 2>/dev/null
      for _ in $(seq 300); do grep -q 'deadpool\] the control plane is back' "$out.log" && break; kill -0 $lp 2>/dev/null || break; sleep 0.1; done
      cp_b=$(date +%s%3N)
      grep -q 'deadpool\] the control plane is back' "$out.log" || echo "# waited up to 30 s for 'the control plane is back' in $out.log:" \
        "not seen, launcher $(kill -0 $lp 2>/dev/null && echo running || echo exited) (last: '$(grep -v '^step' "$out.log" | tail -1)')" >&2 ;;
  esac
  local hang=0
  for _ in $(seq $((CONTROL ? 6000 : 1200))); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
  if kill -0 $lp 2>/dev/null; then hang=1; kill -9 $lp; fi
  wait $lp; local rc=$?
  local orphan=0; no_leftovers "$out" || orphan=1
  local outcome=failed model="$out/model.bin"
  [ "$kind" = disk_full ] && model=$(grep -o "written to [^ ]* instead" "$out.log" | cut -d' ' -f3)
  if [ $rc -eq 0 ] && [ -n "$model" ] && cmp -s "$WORK/ref/model.bin" "$model"; then
    outcome=recovered
  elif [ $rc -ne 0 ] && [ $hang -eq 0 ] && grep -q 'deadpool run --resume' "$out.log"; then
    timeout -k 5 120 "$DP" run --resume "$out" >"$out.resume.out" 2>&1 && cmp -s "$WORK/ref/model.bin" "$out/model.bin" \
      && outcome=stopped_cleanly
  fi
  [ "$kind" = disk_full ] && umount "$out" 2>/dev/null
  local ms; ms=$(grep '"event":"recovered"' "$out/events.jsonl" 2>/dev/null | grep -o '"total_ms":[0-9]*' | cut -d: -f2 | tr '\n' ',')
  echo "$kind $faults $outcome $hang $orphan ${ms:-,}" >>"$rows"
  if [ -n "${cp_a:-}" ]; then
    local st same=no; st=$(stall_report "$out" "$cp_a" "$cp_b" "$WORK/ref" 2>/dev/null); cmp -s "$WORK/ref/model.bin" "$out/model.bin" && same=yes
    echo "$kind $(( (cp_b - cp_a + 500) / 1000 )) $st $same $(grep -c '"event":"recovered"' "$out/events.jsonl")" >>"$cp_rows"
    cp_a=""
  fi
  echo "  run $n: $kind ($faults faults): $outcome, $(( $(date +%s) - t0 )) s${ms:+, recovered in ${ms%,} ms}"
}

total=0; n=0; cp_a=""
while [ $total -lt "$FAULTS" ]; do
  n=$((n + 1))
  kind=${KINDS[$((RANDOM % ${#KINDS[@]}))]}
  [ $CONTROL -eq 1 ] && kind=${KINDS_CP[$((n - 1))]}
  one_run $n "$kind"
  total=$(awk '{s += $2} END {print s + 0}' "$rows")
done

summary=$(awk '
  function pct(a, n, p,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                      return n ? a[int((n - 1) * p) + 1] : "-" }
  { runs[$1]++; faults[$1] += $2; out[$1, $3]++; hangs += $4; orphans += $5; bad += ($3 == "failed")
    m = split($6, ms, ","); for (i = 1; i <= m; i++) if (ms[i] != "") { k = ++nt[$1]; t[$1, k] = ms[i] } }
  END { printf "| kind | runs | faults | recovered | stopped cleanly | failed | recovery total_ms p50 / p90 / max |\n|---|---:|---:|---:|---:|---:|---|\n"
        for (k in runs) { delete a; for (i = 1; i <= nt[k]; i++) a[i] = t[k, i]
          printf "| %s | %d | %d | %d | %d | %d | %s / %s / %s |\n", k, runs[k], faults[k], out[k, "recovered"] + 0,
                 out[k, "stopped_cleanly"] + 0, out[k, "failed"] + 0, pct(a, nt[k], 0.5), pct(a, nt[k], 0.9), pct(a, nt[k], 1.0) }
        printf "\nhangs: %d, orphans: %d, failed runs: %d\n", hangs, orphans, bad }' "$rows")
if [ -s "$cp_rows" ]; then
  summary="$summary
$(awk 'BEGIN { printf "\n| control-plane fault | outage s | steps during it | longest step ms | median ms | longest while Redis was fine ms | stalled > 1 step | recoveries | model identical |\n|---|---:|---:|---:|---:|---:|---|---:|---|\n" }
  { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $5, $6, $7, ($4 == 1 ? "no" : "yes"), $9, $8 }' "$cp_rows")"
fi
echo "$summary"
[ -n "$REPORT" ] && echo "$summary" >"$REPORT"
if awk '$3 == "failed" || $4 || $5 {exit 1}' "$rows"; then
  ok "chaos_long ($total faults in $n runs: every run recovered or stopped cleanly, 0 hangs, 0 orphans)"
else notok "chaos_long" "$(awk '$3 == "failed" || $4 || $5' "$rows" | head -5)"; fi
