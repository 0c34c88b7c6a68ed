#!/usr/bin/env bash
# bench/ab_build.sh — two builds of deadpool, A and B, on the same job in one interleaved run:
# does B change step time or recovery time?
#
# `small`, 4 workers + 1 spare, --ft deadpool, tinyshakespeare when present. Each pair runs, in
# ABBA order (BAAB on odd pairs, so neither build always goes first):
#   train:    STEPS steps, no failure; a run's step time is its median over steps 2..STEPS;
#   recovery: kill -9 of rank 2 in step 8 (11 steps); its `recovered` event's total_ms.
# Reports the median of the paired step-time ratios B/A with a 90 % bootstrap interval, and
# the median recovery total_ms of each build.
# usage: bench/ab_build.sh A_BINARY B_BINARY [PAIRS] [STEPS] [DATA]     prints a Markdown report
# AB_MODEL=tiny (default small) for a model whose step is shorter, so that the collectives'
# share of it is larger.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/stats.sh
A=$(realpath "$1"); B=$(realpath "$2")
PAIRS=${3:-6}
STEPS=${4:-12}
DATA=${5:-../shared/data/tinyshakespeare.txt}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
COMMON=(--workers 4 --spares 1 --model "${AB_MODEL:-small}" --seed 1 --comm-timeout-ms 30000 "${DATA_ARGS[@]}")

run() { # BIN OUT ARGS...
  local bin=$1 out=$2; shift 2
  "$bin" run "${COMMON[@]}" --out "$out" "$@" >/dev/null 2>"$out.log" || { tail -5 "$out.log" >&2; exit 1; }
}
step_ms() { tail -n +2 "$1/metrics.jsonl" | grep -o '"step_ms":[0-9.]*' | cut -d: -f2 | median; }
total_ms() { grep '"event":"recovered"' "$1/events.jsonl" | grep -o '"total_ms":[0-9]*' | head -1 | cut -d: -f2; }

for p in $(seq 1 "$PAIRS"); do
  if [ $((p % 2)) -eq 1 ]; then order="A B B A"; else order="B A A B"; fi
  i=0
  for x in $order; do
    i=$((i + 1)); bin=$A; [ "$x" = B ] && bin=$B
    if [ $i -le 2 ]; then run "$bin" "$work/train-$x-$p" --steps "$STEPS"
    else run "$bin" "$work/rec-$x-$p" --steps 11 --inject kill:2@8; fi
  done
  echo "pair $p: step A $(step_ms "$work/train-A-$p") B $(step_ms "$work/train-B-$p") ms; recovery A $(total_ms "$work/rec-A-$p") B $(total_ms "$work/rec-B-$p") ms" >&2
done

r=$(for p in $(seq 1 "$PAIRS"); do awk -v a="$(step_ms "$work/train-A-$p")" -v b="$(step_ms "$work/train-B-$p")" 'BEGIN{print b/a}'; done)
read -r -a ci <<<"$(boot_ci <<<"$r")"
sa=$(for p in $(seq 1 "$PAIRS"); do step_ms "$work/train-A-$p"; done | median)
sb=$(for p in $(seq 1 "$PAIRS"); do step_ms "$work/train-B-$p"; done | median)
ra=$(for p in $(seq 1 "$PAIRS"); do total_ms "$work/rec-A-$p"; done)
rb=$(for p in $(seq 1 "$PAIRS"); do total_ms "$work/rec-B-$p"; done)
echo "| build | step time (ms), median of runs | recovery total_ms (kill -9), median | recovery runs |"
echo "|---|---:|---:|---|"
echo "| A \`$1\` | $sa | $(median <<<"$ra") | $(tr '\n' ' ' <<<"$ra") |"
echo "| B \`$2\` | $sb | $(median <<<"$rb") | $(tr '\n' ' ' <<<"$rb") |"
echo
echo "Step time B/A, median of $PAIRS paired ratios: $(pct "$(median <<<"$r")") (90 % interval $(pct "${ci[0]}") … $(pct "${ci[1]}")); pairs: $(tr '\n' ' ' <<<"$r")"
