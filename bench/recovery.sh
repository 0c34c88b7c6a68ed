#!/usr/bin/env bash
# bench/recovery.sh — what one failure costs: DeadPool hot-swap vs. a full restart from disk.
#
# `small`, 4 workers + 1 spare, one injected failure at step FAIL_STEP (the process kills or
# stops itself there, recording the time), REPS repetitions each of:
#   crash  — kill -9 of rank 2, --ft deadpool (hot-swap);
#   hang   — SIGSTOP of rank 1, --ft deadpool, default detection timeout (2 s);
#   disk   — kill -9 of rank 2, --ft disk --ckpt-every 50: the whole job restarts from disk.
# From each run's `recovered` event: total_ms (failure -> first step done again), the
# timeline, steps recomputed. Time lost per failure = total_ms + steps_recomputed x step time.
# usage: bench/recovery.sh [REPS] [STEPS] [FAIL_STEP] [DATA]      prints a Markdown report
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
STEPS=${2:-11}
FAIL=${3:-8}
DATA=${4:-../shared/data/tinyshakespeare.txt}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
make -s deadpool
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source bench/stats.sh
field() { grep -o "\"$1\":[-0-9.]*" | head -1 | cut -d: -f2; }

run() { # name args...
  local name=$1; shift
  ./deadpool run --workers 4 --spares 1 --model small --steps "$STEPS" --seed 1 --out "$work/$name" \
    "${DATA_ARGS[@]}" "$@" >/dev/null 2>"$work/$name.log" || { tail -5 "$work/$name.log"; exit 1; }
  local e="$work/$name/events.jsonl" m="$work/$name/metrics.jsonl" rec tf tl step
  rec=$(grep '"event":"recovered"' "$e" | head -1)
  tf=$(grep '"event":"fault_injected"' "$e" | head -1 | field t)
  # work in flight when the failure struck: since the last step completed before it
  tl=$(awk -v tf="$tf" '{ match($0, /"t":[0-9.]+/); t = substr($0, RSTART + 4, RLENGTH - 4) + 0; if (t <= tf) last = t } END { print last + 0 }' "$m")
  step=$(grep -o '"step_ms":[0-9.]*' "$m" | tail -n +2 | cut -d: -f2 | median)
  # one line: total detect decide restore rebuild resnapshot recomputed step_ms inflight_ms lost_ms
  echo "$rec" | awk -v step="$step" -v tf="$tf" -v tl="$tl" '
    function f(k,   r) { if (match($0, "\"" k "\":[-0-9.]+")) return substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3); return "-" }
    { inflight = (tf - tl) * 1000; n = f("steps_recomputed")
      printf "%s %s %s %s %s %s %s %.0f %.0f %.0f\n", f("total_ms"), f("detect_ms"), f("decide_ms"), f("restore_ms"),
             f("rebuild_ms"), f("resnapshot_ms"), n, step, inflight, f("total_ms") + inflight + n * step }' >"$work/$name.row"
  echo "$name: $(cat "$work/$name.row")" >&2
}
for i in $(seq "$REPS"); do
  run "crash$i" --inject "kill:2@$FAIL"
  run "hang$i" --inject "stop:1@$FAIL"
  run "disk$i" --ft disk --ckpt-every 50 --inject "kill:2@$FAIL"
done

col() { # kind column -> median over runs ("-" when absent)
  local v
  v=$(cat "$work"/$1*.row | awk -v c="$2" '$c != "-" { print $c }' | median)
  echo "${v:--}"
}
echo "| failure | total_ms: failure → training resumed (median) | detect | decide | restore | rebuild | re-snapshot | steps recomputed | step time (ms) | work in flight lost (ms) | time lost per failure (ms) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for k in crash hang disk; do
  case $k in
    crash) label="kill -9, hot-swap (--ft deadpool)" ;;
    hang) label="SIGSTOP, hot-swap, 2 s detection" ;;
    disk) label="kill -9, full restart (--ft disk --ckpt-every 50)" ;;
  esac
  echo "| $label | $(for c in 1 2 3 4 5 6 7 8 9 10; do printf '%s | ' "$(col $k $c)"; done)"
done
echo
c=$(col crash 10); d=$(col disk 10); dt=$(col disk 1); ds=$(col disk 8); ci=$(col crash 9)
awk -v c="$c" -v d="$d" -v dt="$dt" -v ds="$ds" -v ci="$ci" -v fail="$FAIL" 'BEGIN {
  printf "Time lost per failure (restart or resume + work in flight + steps recomputed), same failure (kill -9 in step %d): hot-swap %.0f ms vs. full restart %.0f ms: %.1fx less.\n", fail, c, d, d / c
  e = dt + ci + 24.5 * ds; h = c - ci + ci
  printf "With a checkpoint every 50 steps, a failure at a uniformly random step makes the restart recompute 24.5 steps on average: %.0f ms (restart %.0f + in flight %.0f + 24.5 x %.0f), %.0fx the hot-swap.\n", e, dt, ci, ds, e / h }'
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); reps $REPS, steps $STEPS, failure in step $FAIL"
