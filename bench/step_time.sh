#!/usr/bin/env bash
# bench/step_time.sh — step time and tokens/s of the `small` preset with 1, 2 and 4 workers.
#
# Each configuration runs REPS times (interleaved, so slow phases of the machine hit all of
# them alike); each run trains STEPS steps and its first step (warm-up: page faults, BLAS
# buffers, connection set-up) is dropped. Reported: the median over runs of the median step
# time, and the tokens/s that implies for the whole job. One BLAS thread per worker.
# usage: bench/step_time.sh [STEPS] [REPS] [DATA]   (appends nothing; prints a Markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8}
REPS=${2:-3}
DATA=${3:-../shared/data/tinyshakespeare.txt}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
make -s deadpool
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

source bench/stats.sh

for rep in $(seq "$REPS"); do
  for w in 1 2 4; do
    out="$work/w$w-r$rep"
    ./deadpool run --workers "$w" --spares 0 --model small --steps "$STEPS" --seed 1 --out "$out" \
      "${DATA_ARGS[@]}" >/dev/null 2>"$out.log" || { cat "$out.log"; exit 1; }
    tail -n +2 "$out/metrics.jsonl" | grep -o '"step_ms":[0-9.]*' | cut -d: -f2 | median >"$out.median"
  done
done

echo "| workers | step time (ms), median | tokens/s (job) | tokens/s per worker |"
echo "|---:|---:|---:|---:|"
for w in 1 2 4; do
  ms=$(cat "$work"/w$w-r*.median | median)
  awk -v w="$w" -v ms="$ms" 'BEGIN { tok = w * 4 * 256; printf "| %d | %.1f | %.0f | %.0f |\n", w, ms, tok / (ms / 1000), tok / (ms / 1000) / w }'
done
echo
make -s build/bench/sgemm_floor && build/bench/sgemm_floor 5
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); steps $STEPS, reps $REPS"
