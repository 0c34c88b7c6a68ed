#!/usr/bin/env bash
# bench/torch_kill_ab.sh — two checkouts of DeadPool, A and B, on the DDP program under the
# `deadpool` backend (examples/torch/train_gpt2.py --ddp, 4 workers + 1 spare, a snapshot every
# step), interleaved: does B change the time one kill -9 costs, or the step time while a spare
# starts?
#
# Each repetition runs, in ABBA order (BAAB on even ones), for each checkout: one run without a
# failure and one with `--inject kill:1@KILL_AT`. Per run: the training span (step 1 done to the
# last step done), its median step time over steps 5..KILL_AT-2 (the spare is starting then),
# the time the first spare took to join the pool, and the number of spares started. Time lost
# to the kill = span with the kill minus span without, per checkout and repetition; the report
# gives the medians with a 90 % bootstrap interval.
# usage: bench/torch_kill_ab.sh A_DIR B_DIR [REPS=5] [STEPS=60] [KILL_AT=35]   (both built)
#   MODEL="--n-layer 6 --n-embd 384 --n-head 6 --block 256"   another model (default: 0.12M)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/stats.sh
A=$(realpath "$1"); B=$(realpath "$2")
REPS=${3:-5} STEPS=${4:-60} KILL_AT=${5:-35}
read -r -a MODEL_ARGS <<<"${MODEL:-}"
W=$(mktemp -d /tmp/dp_bench_tkab_XXXXXX); trap 'rm -rf "$W"' EXIT

run() { # TREE OUT ARGS...
  local tree=$1 out=$2; shift 2
  mkdir -p "$out"
  (cd "$tree" && timeout -k 5 900 ./deadpool run --workers 4 --spares 1 --steps "$STEPS" --seed 1 --out "$out" "$@" \
     -- /usr/bin/python3 examples/torch/train_gpt2.py "${MODEL_ARGS[@]}" --ddp --steps "$STEPS" --seed 1 --out "$out") \
    >"$out.log" 2>&1 || { echo "run $out failed: $(tail -3 "$out.log")" >&2; exit 1; }
}
span() { awk -F'"t":' 'NR == 1 {split($2, a, "}"); f = a[1]} {split($2, a, "}"); l = a[1]} END {print l - f}' "$1/metrics.jsonl"; }
early_ms() { grep -o '"step":[0-9]*,"step_ms":[0-9.]*' "$1/metrics.jsonl" | awk -F'[:,]' -v k="$KILL_AT" '$2 >= 5 && $2 <= k - 2 {print $4}' | median; }
joined_s() { # the first spare_joined, seconds after the first step
  local t1 sj
  t1=$(head -1 "$1/metrics.jsonl" | grep -o '"t":[0-9.]*' | cut -d: -f2)
  sj=$(grep -m1 '"event":"spare_joined"' "$1/events.jsonl" | grep -o '"t":[0-9.]*' | cut -d: -f2)
  echo "$sj - $t1" | bc
}
spares() { grep -c '"event":"spare_joined"' "$1/events.jsonl" || true; }

echo "# bench/torch_kill_ab.sh $REPS $STEPS $KILL_AT (MODEL=\"${MODEL:-}\") — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
echo "# A: $A ($(git -C "$A" rev-parse --short HEAD)), B: $B ($(git -C "$B" rev-parse --short HEAD)$(git -C "$B" diff --quiet HEAD || echo ' + changes'))"
echo
echo "| rep | build | span without (s) | span with the kill (s) | time lost (s) | step ms while the spare starts | spare joined after (s) | spares joined (kill run) |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
for ((i = 1; i <= REPS; i++)); do
  order=(A B B A); ((i % 2)) || order=(B A A B)
  for x in "${order[@]}"; do
    tree=$A; [ "$x" = B ] && tree=$B
    if [ -e "$W/$x$i.base" ]; then run "$tree" "$W/$x$i.kill" --inject "kill:1@$KILL_AT"
    else run "$tree" "$W/$x$i.base"; fi
  done
  for x in A B; do
    b=$(span "$W/$x$i.base"); k=$(span "$W/$x$i.kill"); l=$(echo "$k - $b" | bc)
    echo "$l" >>"$W/lost.$x"; early_ms "$W/$x$i.base" >>"$W/early.$x"
    echo "| $i | $x | $b | $k | $l | $(early_ms "$W/$x$i.base") | $(joined_s "$W/$x$i.base") | $(spares "$W/$x$i.kill") |"
  done
done
echo
for x in A B; do
  echo "$x: time lost median **$(median <"$W/lost.$x") s** (90 % CI $(boot_ci <"$W/lost.$x")), step while the spare starts median $(median <"$W/early.$x") ms (90 % CI $(boot_ci <"$W/early.$x"))"
done
