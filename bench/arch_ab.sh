#!/usr/bin/env bash
# bench/arch_ab.sh — builds of deadpool against each other on the built-in trainer's compute
# alone: one worker, no spare, --ft none (no snapshot, no collective), so that what differs
# is the code the compiler made (e.g. -march=native against portable). Each repetition runs
# every binary once, in rotated order; a run's step time is its median over steps 2..STEPS.
# Reports per binary the median over repetitions, and each binary's paired ratio to the first
# (median of the per-repetition ratios, 90 % bootstrap interval).
# usage: bench/arch_ab.sh MODEL STEPS REPS BIN_A BIN_B [BIN_C ...]   prints a Markdown table
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/stats.sh
MODEL=$1 STEPS=$2 REPS=$3; shift 3
BINS=(); for b in "$@"; do BINS+=("$(realpath "$b")"); done
n=${#BINS[@]}
DATA=../shared/data/tinyshakespeare.txt
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

for rep in $(seq "$REPS"); do
  for k in $(seq 0 $((n - 1))); do
    i=$(( (k + rep) % n )) out="$work/b$i-r$rep"
    "${BINS[$i]}" run --workers 1 --spares 0 --ft none --model "$MODEL" --steps "$STEPS" --seed 1 --out "$out" \
      "${DATA_ARGS[@]}" >/dev/null 2>"$out.log" || { tail -5 "$out.log" >&2; exit 1; }
    tail -n +2 "$out/metrics.jsonl" | grep -o '"step_ms":[0-9.]*' | cut -d: -f2 | median >"$out.ms"
  done
done

echo "| build | step time (ms), median of $REPS | B/A, median of paired ratios (90 % interval) |"
echo "|---|---:|---|"
for i in $(seq 0 $((n - 1))); do
  med=$(cat "$work"/b$i-r*.ms | median)
  if [ "$i" -eq 0 ]; then echo "| A \`${BINS[0]}\` | $med | |"; continue; fi
  ratios=$(for rep in $(seq "$REPS"); do
    awk -v a="$(cat "$work/b0-r$rep.ms")" -v b="$(cat "$work/b$i-r$rep.ms")" 'BEGIN {printf "%.6f\n", b / a}'; done)
  read -r lo hi < <(boot_ci <<<"$ratios")
  echo "| \`${BINS[$i]}\` | $med | $(pct "$(median <<<"$ratios")") ($(pct "$lo") … $(pct "$hi")) |"
done
