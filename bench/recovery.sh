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
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { grep -o "\"$1\":[-0-9.]*" | head -1 | cut -d: -f2; }

run() { # name args...
  local name=$1; shift
  ./deadpool run --workers 4 --spares 1 --model small --steps "$STEPS" --seed 1 --out "$work/$name" \
    "${DATA_ARGS[@]}" "$@" >/dev/null 2>"$work/$name.log" || { tail -5 "$work/$name.log"; exit 1; }
  grep '"event":"recovered"' "$work/$name/events.jsonl" | head -1 >"$work/$name.rec"
  grep -o '"step_ms":[0-9.]*' "$work/$name/metrics.jsonl" | tail -n +2 | cut -d: -f2 | median >"$work/$name.step"
  echo "$name: $(cat "$work/$name.rec")" >&2
}
for i in $(seq "$REPS"); do
  run "crash$i" --inject "kill:2@$FAIL"
  run "hang$i" --inject "stop:1@$FAIL"
  run "disk$i" --ft disk --ckpt-every 50 --inject "kill:2@$FAIL"
done

summary() { # kind -> "total detect decide restore rebuild resnapshot recomputed step_ms lost"
  local k=$1 f
  for f in total_ms detect_ms decide_ms restore_ms rebuild_ms resnapshot_ms steps_recomputed; do
    cat "$work"/$k*.rec | while read -r line; do echo "$line" | field "$f"; done | grep . | median || echo "-"
  done | tr '\n' ' '
  cat "$work"/$k*.step | median | tr '\n' ' '
  for i in $(seq "$REPS"); do
    awk -v t="$(field total_ms <"$work/$k$i.rec")" -v n="$(field steps_recomputed <"$work/$k$i.rec")" \
        -v s="$(cat "$work/$k$i.step")" 'BEGIN { print t + n * s }'
  done | median
}
echo "| failure | total_ms (median) | detect | decide | restore | rebuild | re-snapshot | steps recomputed | step time (ms) | time lost per failure (ms) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for k in crash hang disk; do
  read -r total det dec res reb rs rec step lost <<<"$(summary $k)"
  case $k in
    crash) label="kill -9, hot-swap (--ft deadpool)" ;;
    hang) label="SIGSTOP, hot-swap, 2 s detection" ;;
    disk) label="kill -9, full restart (--ft disk --ckpt-every 50)" ;;
  esac
  echo "| $label | $total | $det | $dec | $res | $reb | $rs | $rec | $step | $lost |"
done
echo
crash_lost=$(summary crash | awk '{print $NF}')
disk_lost=$(summary disk | awk '{print $NF}')
disk_total=$(summary disk | awk '{print $1}')
disk_step=$(summary disk | awk '{print $(NF-1)}')
awk -v c="$crash_lost" -v d="$disk_lost" -v dt="$disk_total" -v ds="$disk_step" 'BEGIN {
  printf "Time lost per failure, same failure (kill -9 at step '"$FAIL"'): hot-swap %.0f ms vs. restart %.0f ms: %.1fx less.\n", c, d, d / c
  e = dt + 24.5 * ds
  printf "A failure at a uniformly random step with a checkpoint every 50 steps costs the restart on average %.0f ms (restart %.0f ms + 24.5 recomputed steps x %.0f ms): %.0fx the hot-swap.\n", e, dt, ds, e / c }'
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); reps $REPS, steps $STEPS, failure at step $FAIL"
