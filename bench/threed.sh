#!/usr/bin/env bash
# bench/threed.sh — 3D parallelism on `small` (6 layers, 6 heads, C 384): step time and one
# hot-swap per layout.
#
# Every layout trains the same global batch per replica: --batch 1 --grad-accum 4 (the pipeline's
# micro-batches), STEPS steps, one spare; rank 1 kills itself (kill -9) in step FAIL_STEP. Layouts:
# the data-parallel baselines (1 and 2 ranks), then TP 2, PP 2 and TP 2 x PP 2 with D = 1 and
# D = 2 (rank 1 is a tensor-parallel peer, or with PP 2 and D 1 the last stage). From each run:
# the median step time (steps 2.., the recovered one included), and from its `recovered` event
# total_ms (failure -> training resumed on every rank) with its phases.
# usage: bench/threed.sh [REPS] [STEPS] [FAIL_STEP] [DATA]     prints a Markdown table
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
STEPS=${2:-8}
FAIL=${3:-6}
DATA=${4:-../shared/data/tinyshakespeare.txt}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
make -s deadpool
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source bench/stats.sh

# name:workers:rank killed:options — the D = 1 layouts compare with dp1, the D = 2 ones with dp2
# (the same global batch: D x 4 micro-batches)
LAYOUTS=("dp1:1:0:" "tp2_d1:2:1:--tp 2" "pp2_d1:2:1:--pp 2" "tp2pp2_d1:4:1:--tp 2 --pp 2"
         "dp2:2:1:" "tp2_d2:4:1:--tp 2" "pp2_d2:4:1:--pp 2" "tp2pp2_d2:8:1:--tp 2 --pp 2")

run() { # name workers victim args...
  local name=$1 w=$2 victim=$3; shift 3
  # shellcheck disable=SC2068
  ./deadpool run --workers "$w" --spares 1 --model small --batch 1 --grad-accum 4 --steps "$STEPS" --seed 1 \
    --out "$work/$name" "${DATA_ARGS[@]}" --inject "kill:$victim@$FAIL" $@ >/dev/null 2>"$work/$name.log" ||
    { tail -5 "$work/$name.log"; exit 1; }
  local e="$work/$name/events.jsonl" m="$work/$name/metrics.jsonl" step
  step=$(grep -o '"step_ms":[0-9.]*' "$m" | tail -n +2 | cut -d: -f2 | median)
  grep '"event":"recovered"' "$e" | head -1 | awk -v step="$step" '
    function f(k) { if (match($0, "\"" k "\":[-0-9.]+")) return substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3); return "-" }
    { printf "%.0f %s %s %s %s %s %s %s\n", step, f("total_ms"), f("detect_ms"), f("decide_ms"), f("restore_ms"),
             f("rebuild_ms"), f("resnapshot_ms"), f("steps_recomputed") }' >"$work/$name.row"
  echo "$name: $(cat "$work/$name.row")" >&2
}
for i in $(seq "$REPS"); do
  for l in "${LAYOUTS[@]}"; do
    IFS=: read -r name w victim args <<<"$l"
    # shellcheck disable=SC2086
    run "$name.$i" "$w" "$victim" $args
  done
done

col() { # layout column -> median over its runs
  local v
  v=$(cat "$work/$1".*.row | awk -v c="$2" '$c != "-" { print $c }' | median)
  echo "${v:--}"
}
echo "| layout | ranks (+1 spare) | rank killed | step time (ms) | kill -9 → resumed: total_ms | detect | decide | restore | rebuild | re-snapshot | steps recomputed |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for l in "${LAYOUTS[@]}"; do
  IFS=: read -r name w victim args <<<"$l"
  echo "| $name ${args:+($args)} | $w | $victim | $(for c in 1 2 3 4 5 6 7 8; do printf '%s | ' "$(col "$name" $c)"; done)"
done
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); medians of $REPS runs, steps $STEPS, kill -9 of rank 1 in step $FAIL"
