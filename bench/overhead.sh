#!/usr/bin/env bash
# bench/overhead.sh — what per-iteration snapshots cost the training loop.
#
# Same job (`small`, 4 workers + 1 spare, R=1 ring replicas) under these modes:
#   none       no checkpoint at all (the baseline)
#   none-again the baseline once more: an A/A control that shows the noise of the method
#   deadpool   per-iteration in-memory snapshots (the default: same-machine holders pull)
#   dp-tcp     the same, replicas sent over TCP as they would be to another machine
#   disk1      synchronous disk checkpoint every step
#   disk10     synchronous disk checkpoint every 10 steps
# MODES="none deadpool ..." picks some (none must be among them; default: all).
# Each pair runs every mode once, in ABBA order (odd pairs forward, even pairs backward), so a
# machine that drifts faster or slower over the run does not favour one mode. For each run,
# the median step time over steps 2..STEPS. A mode's overhead is the median over pairs of
# (mode / none) within the pair; the mean and the range are printed too.
# Disk runs delete their checkpoints and `sync` after they finish (outside the timing), so
# their writeback does not land in the next run. Every run gets --comm-timeout-ms 30000: a
# vCPU the hypervisor stalls for over 2 s (the default collective timeout) would otherwise fail
# a collective now and then, which ends a --ft none run; the timeout costs nothing while all
# is well, so it does not change what is measured.
# Besides step time, the deadpool runs report the CPU time the snapshot threads (copy, CRC,
# send) and the holders' threads (receive or pull, verify) spent on the generations, as a
# share of the CPU time of all workers: the cost itself, without the run-to-run noise of a
# shared machine; and, apart, the one-time CPU of setting up each rank's buffers.
# usage: [MODES=...] bench/overhead.sh [PAIRS] [STEPS] [DATA]      prints a Markdown report
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-6}
STEPS=${2:-12}
DATA=${3:-../shared/data/tinyshakespeare.txt}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
make -s deadpool
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
read -r -a MODES <<<"${MODES:-none none-again deadpool dp-tcp disk1 disk10}"
mode_args() {
  case $1 in
    none | none-again) echo "--ft none" ;;
    deadpool) echo "--ft deadpool" ;;
    dp-tcp) echo "--ft deadpool --replica-transport tcp" ;;
    disk1) echo "--ft disk --ckpt-every 1" ;;
    disk10) echo "--ft disk --ckpt-every 10" ;;
  esac
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

for p in $(seq "$PAIRS"); do
  order=("${MODES[@]}")
  if [ $((p % 2)) -eq 0 ]; then order=(); for ((i = ${#MODES[@]} - 1; i >= 0; i--)); do order+=("${MODES[i]}"); done; fi
  for m in "${order[@]}"; do
    out="$work/$m-$p"
    # shellcheck disable=SC2046
    ./deadpool run --workers 4 --spares 1 --model small --steps "$STEPS" --seed 1 --out "$out" \
      --comm-timeout-ms 30000 $(mode_args "$m") "${DATA_ARGS[@]}" >/dev/null 2>"$out.log" || { cat "$out.log"; exit 1; }
    tail -n +2 "$out/metrics.jsonl" | grep -o '"step_ms":[0-9.]*' | cut -d: -f2 | median >"$out.ms"
    # snapshot + holder threads' CPU over all workers' CPU, in percent
    awk '/"event":"snapshot_stats"/ { if (match($0, /"cpu_ms":[0-9.]+/)) s += substr($0, RSTART + 9, RLENGTH - 9)
                                     if (match($0, /"holder_cpu_ms":[0-9.]+/)) s += substr($0, RSTART + 16, RLENGTH - 16) }
         /"event":"finish"/ { if (match($0, /"workers_cpu_s":[0-9.]+/)) w = substr($0, RSTART + 16, RLENGTH - 16) }
         END { if (w > 0) printf "%.3f\n", s / (w * 1000) * 100 }' "$out/events.jsonl" >"$out.share"
    rm -rf "$out/ckpt"; sync
    echo "pair $p $m $(cat "$out.ms") ms/step" >&2
  done
done

ratios() { # mode: mode/none step time, one line per pair
  for p in $(seq "$PAIRS"); do
    awk -v a="$(cat "$work/$1-$p.ms")" -v b="$(cat "$work/none-$p.ms")" 'BEGIN{print a/b}'
  done
}
ratios_both() { # mode over the geometric mean of the pair's two --ft none runs
  for p in $(seq "$PAIRS"); do
    awk -v a="$(cat "$work/$1-$p.ms")" -v b="$(cat "$work/none-$p.ms")" -v c="$(cat "$work/none-again-$p.ms")" 'BEGIN{print a/sqrt(b*c)}'
  done
}
pct() { awk -v r="$1" 'BEGIN{printf "%+.2f%%", (r-1)*100}'; }

echo "| mode | step time (ms), median of runs | vs --ft none: median of paired ratios | mean | lowest | highest |"
echo "|---|---:|---:|---:|---:|---:|"
for m in "${MODES[@]}"; do
  r=$(ratios "$m")
  echo "| $m: $(mode_args "$m") | $(cat "$work"/$m-*.ms | median) | $(pct "$(median <<<"$r")") |" \
    "$(pct "$(awk '{s+=$1} END {print s/NR}' <<<"$r")") | $(pct "$(sort -g <<<"$r" | head -1)") | $(pct "$(sort -g <<<"$r" | tail -1)") |"
done
echo
for m in "${MODES[@]}"; do
  [ "$m" = none ] || echo "Paired step-time ratios $m/none, pair by pair: $(ratios "$m" | awk '{printf "%.4f ", $1}')"
  echo
done
if [[ " ${MODES[*]} " == *" none-again "* ]]; then
  for m in deadpool dp-tcp disk1 disk10; do
    [[ " ${MODES[*]} " == *" $m "* ]] || continue
    r=$(ratios_both "$m")
    echo "$m against both --ft none runs of its pair (geometric mean): median $(pct "$(median <<<"$r")"), mean $(pct "$(awk '{s+=$1} END {print s/NR}' <<<"$r")")"
    echo
  done
fi
for m in deadpool dp-tcp; do
  [[ " ${MODES[*]} " == *" $m "* ]] || continue
  echo "$m: snapshot and holder threads used $(cat "$work"/$m-*.share | median)% of the workers' CPU time (median of runs; runs: $(cat "$work"/$m-*.share | tr '\n' ' '))"
  echo
done
# Snapshot traffic and latency, from the deadpool runs' snapshot_stats events.
for m in deadpool dp-tcp; do
  [[ " ${MODES[*]} " == *" $m "* ]] || continue
  grep -h '"event":"snapshot_stats"' "$work"/$m-*/events.jsonl | awk -v m="$m" '
    function f(k,   v) { if (!match($0, "\"" k "\":[0-9.]+")) return 0; v = substr($0, RSTART, RLENGTH); sub(/.*:/, "", v); return v }
    { n++; caps += f("captures"); bcs += f("bytes_copied"); brs += f("bytes_replicated"); bps += f("bytes_pulled")
      cms += f("copy_ms_mean"); rms += f("replicate_ms_mean"); ws += f("waits"); wts += f("wait_ms_total")
      gcpu += f("cpu_ms") + f("holder_cpu_ms"); wcpu += f("warmup_cpu_ms") }
    END { printf "%s: per rank and step %.1f MiB copied, %.1f MiB replicated (%.0f%% pulled in memory); copy %.1f ms, replication %.1f ms (wall, means over %d rank-runs); the loop waited for a snapshot %d times in %d steps, %.1f ms in total.\n\n",
          m, bcs / caps / 1048576, brs / caps / 1048576, brs ? 100 * bps / brs : 0, cms / n, rms / n, n, ws, caps, wts
          printf "%s: CPU per rank and generation (snapshot thread + its holder) %.1f ms; one-time buffer setup on the snapshot thread %.0f ms per rank (its holder spends about as much on its RESERVE).\n\n", m, gcpu / caps, wcpu / n }'
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); pairs $PAIRS, steps $STEPS"
