#!/usr/bin/env bash
# bench/overhead.sh — what per-iteration snapshots cost the training loop.
#
# Same job (`small`, 4 workers + 1 spare, R=1 ring replicas) under four fault-tolerance modes,
# run A/B interleaved (none, deadpool, disk/1, disk/10, then again) PAIRS times. For each run
# the median step time over steps 2..STEPS; the overhead of a mode is the median over pairs of
# (mode / none) from the same pair, so slow phases of a noisy machine cancel out.
# usage: bench/overhead.sh [PAIRS] [STEPS] [DATA]      prints a Markdown report
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-5}
STEPS=${2:-12}
DATA=${3:-../shared/data/tinyshakespeare.txt}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
make -s deadpool
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
MODES=(none deadpool disk1 disk10)
mode_args() {
  case $1 in
    none) echo "--ft none" ;;
    deadpool) echo "--ft deadpool" ;;
    disk1) echo "--ft disk --ckpt-every 1" ;;
    disk10) echo "--ft disk --ckpt-every 10" ;;
  esac
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

for p in $(seq "$PAIRS"); do
  for m in "${MODES[@]}"; do
    out="$work/$m-$p"
    # shellcheck disable=SC2046
    ./deadpool run --workers 4 --spares 1 --model small --steps "$STEPS" --seed 1 --out "$out" \
      $(mode_args "$m") "${DATA_ARGS[@]}" >/dev/null 2>"$out.log" || { cat "$out.log"; exit 1; }
    tail -n +2 "$out/metrics.jsonl" | grep -o '"step_ms":[0-9.]*' | cut -d: -f2 | median >"$out.ms"
    echo "pair $p $m $(cat "$out.ms") ms" >&2
  done
done

echo "| mode | step time (ms), median of runs | overhead vs --ft none (median of paired ratios) |"
echo "|---|---:|---:|"
for m in "${MODES[@]}"; do
  ms=$(cat "$work"/$m-*.ms | median)
  ratio=$(for p in $(seq "$PAIRS"); do awk -v a="$(cat "$work/$m-$p.ms")" -v b="$(cat "$work/none-$p.ms")" 'BEGIN{print a/b}'; done | median)
  echo "| --ft $(mode_args "$m" | sed 's/--ft //') | $ms | $(awk -v r="$ratio" 'BEGIN{printf "%+.2f%%", (r-1)*100}') |"
done
echo
echo "Paired ratios deadpool/none: $(for p in $(seq "$PAIRS"); do awk -v a="$(cat "$work/deadpool-$p.ms")" -v b="$(cat "$work/none-$p.ms")" 'BEGIN{printf "%.4f ", a/b}'; done)"
echo
# Snapshot traffic and latency, from the deadpool runs' snapshot_stats events.
grep -h '"event":"snapshot_stats"' "$work"/deadpool-*/events.jsonl | awk '
  { match($0, /"captures":[0-9]+/); c = substr($0, RSTART + 11, RLENGTH - 11)
    match($0, /"bytes_copied":[0-9]+/); bc = substr($0, RSTART + 15, RLENGTH - 15)
    match($0, /"bytes_replicated":[0-9]+/); br = substr($0, RSTART + 19, RLENGTH - 19)
    match($0, /"copy_ms_mean":[0-9.]+/); cm = substr($0, RSTART + 15, RLENGTH - 15)
    match($0, /"replicate_ms_mean":[0-9.]+/); rm = substr($0, RSTART + 20, RLENGTH - 20)
    match($0, /"waits":[0-9]+/); w = substr($0, RSTART + 8, RLENGTH - 8)
    match($0, /"wait_ms_total":[0-9.]+/); wt = substr($0, RSTART + 16, RLENGTH - 16)
    n++; caps += c; bcs += bc; brs += br; cms += cm; rms += rm; ws += w; wts += wt }
  END { printf "Per rank and step: %.1f MiB copied, %.1f MiB replicated; copy %.1f ms, replication %.1f ms (means over %d rank-runs); the loop waited for a copy %d times in %d steps, %.1f ms in total.\n",
        bcs / caps / 1048576, brs / caps / 1048576, cms / n, rms / n, n, ws, caps, wts }'
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); pairs $PAIRS, steps $STEPS"
