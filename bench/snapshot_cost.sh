#!/usr/bin/env bash
# bench/snapshot_cost.sh — what one snapshot costs the step it overlaps, A/B within one job.
#
# Comparing whole runs (bench/overhead.sh) is at the mercy of this machine's run-to-run
# swings: two identical runs land up to 15 % apart, which buries a 1 % effect. Here the A/B
# is step by step inside one job: `small`, 4 workers + 1 spare, `--ft deadpool
# --snapshot-every 2`. A snapshot is captured after the allgather of every even step, where it
# lies (zero copy), so its replication runs during the next (odd) step, whose optimizer update
# is also the out-of-place one (it must not overwrite the snapshot); even steps carry no
# replication and update in place. For each odd step s >= 3 the sample is
# t(s) / sqrt(t(s-1) * t(s+1)): the step with a snapshot against its two neighbours without
# (the geometric mean cancels a linear drift). The estimate is the median over all samples of
# all runs, with a 90 % bootstrap interval (2000 resamples, fixed seed). Control: the same
# samples from `--ft none` runs of the same job, interleaved with the others, where odd and
# even steps differ in nothing.
# usage: bench/snapshot_cost.sh [RUNS] [STEPS] [CONTROL_EVERY] [DATA]
#   RUNS deadpool runs of STEPS steps; a --ft none control run after every CONTROL_EVERY-th.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/stats.sh
RUNS=${1:-12}
STEPS=${2:-40}
CONTROL_EVERY=${3:-3}
DATA=${4:-../shared/data/tinyshakespeare.txt}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
make -s deadpool
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

run() { # NAME ARGS...
  local out="$work/$1"; shift
  ./deadpool run --workers 4 --spares 1 --model small --steps "$STEPS" --seed 1 --out "$out" \
    --comm-timeout-ms 30000 "$@" "${DATA_ARGS[@]}" >/dev/null 2>"$out.log" || { cat "$out.log"; exit 1; }
  echo "$(basename "$out") done" >&2
}
for i in $(seq "$RUNS"); do
  run "dp-$i" --ft deadpool --snapshot-every 2
  if [ $((i % CONTROL_EVERY)) -eq 0 ]; then run "none-$i" --ft none; fi
done

# samples RUN...: t(s)/sqrt(t(s-1)*t(s+1)) for odd s >= 3, one per line
samples() {
  local f
  for f in "$@"; do
    grep -o '"step_ms":[0-9.]*' "$f/metrics.jsonl" | cut -d: -f2 |
      awk '{ t[NR] = $1 } END { for (s = 3; s < NR; s += 2) print t[s] / sqrt(t[s - 1] * t[s + 1]) }'
  done
}
report() { # LABEL RUN...
  local label=$1; shift
  local s ci; s=$(samples "$@"); read -r -a ci <<<"$(boot_ci <<<"$s")"
  echo "| $label | $# | $(wc -l <<<"$s") | $(pct "$(median <<<"$s")") | $(pct "${ci[0]}") … $(pct "${ci[1]}") |"
}

echo "| mode | runs | samples | odd step / its even neighbours, median | 90 % interval |"
echo "|---|---:|---:|---:|---:|"
report "--ft deadpool --snapshot-every 2 (odd steps carry a snapshot)" "$work"/dp-*[0-9]
controls=("$work"/none-*[0-9])
if [ -d "${controls[0]}" ]; then report "--ft none (control: no step carries one)" "${controls[@]}"
else echo "| --ft none (control) | 0 | fewer than $CONTROL_EVERY deadpool runs, so no control run | | |"; fi
echo
grep -h '"event":"snapshot_stats"' "$work"/dp-*/events.jsonl | awk '
  function f(k,   v) { if (!match($0, "\"" k "\":[0-9.]+")) return 0; v = substr($0, RSTART, RLENGTH); sub(/.*:/, "", v); return v }
  { caps += f("captures"); ws += f("waits"); gcpu += f("cpu_ms") + f("holder_cpu_ms") }
  END { printf "deadpool runs: %d snapshots, CPU per rank and snapshot (snapshot thread + its holder) %.1f ms, the loop waited %d times.\n\n", caps, gcpu / caps, ws }'
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); runs $RUNS, steps $STEPS, one control run per $CONTROL_EVERY deadpool runs"
