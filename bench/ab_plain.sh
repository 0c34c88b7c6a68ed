#!/usr/bin/env bash
# bench/ab_plain.sh — two builds, A and B, on examples/mlp.c --plain in one interleaved run: the
# worst case for work on the commit path (a step of under a millisecond, and every rank
# stateless, so each commit record goes out with the rank's stateless claim).
# Each pair runs A and B twice, ABBA (BAAB on even pairs): 3 workers + 1 spare, STEPS steps; a
# run's step time is its median step_ms over steps 20..STEPS. Prints each pair's medians, the
# median of the paired ratios B/A and its 90 % bootstrap interval.
# usage: bench/ab_plain.sh A_TREE B_TREE [PAIRS=8] [STEPS=3000]   (each TREE: a built checkout,
#        with TREE/deadpool and TREE/build/examples/mlp: `make && make build/examples/mlp`)
set -euo pipefail
source "$(dirname "$0")/stats.sh"
A=$(realpath "$1") B=$(realpath "$2") PAIRS=${3:-8} STEPS=${4:-3000}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
run() { # TREE OUT
  "$1/deadpool" run --workers 3 --spares 1 --steps "$STEPS" --seed 7 --out "$2" -- "$1/build/examples/mlp" --plain \
    >/dev/null 2>"$2.log" || { tail -3 "$2.log" >&2; exit 1; }
}
step_ms() { tail -n +20 "$1/metrics.jsonl" | grep -o '"step_ms":[0-9.]*' | cut -d: -f2 | median; }
ratios=()
for i in $(seq "$PAIRS"); do
  if [ $((i % 2)) -eq 1 ]; then order="A B B A"; else order="B A A B"; fi
  a=""; b=""; n=0
  for x in $order; do
    n=$((n + 1)); d="$W/$x$i.$n"
    if [ "$x" = A ]; then run "$A" "$d"; a+="$(step_ms "$d") "; else run "$B" "$d"; b+="$(step_ms "$d") "; fi
  done
  ma=$(tr ' ' '\n' <<<"$a" | grep . | median); mb=$(tr ' ' '\n' <<<"$b" | grep . | median)
  echo "pair $i: step A $ma B $mb ms"
  ratios+=("$(awk -v a="$ma" -v b="$mb" 'BEGIN { print b / a }')")
done
med=$(printf '%s\n' "${ratios[@]}" | median)
read -r lo hi < <(printf '%s\n' "${ratios[@]}" | boot_ci)
echo "Step time B/A, median of $PAIRS paired ratios: $(pct "$med") (90 % interval $(pct "$lo") … $(pct "$hi"))"
