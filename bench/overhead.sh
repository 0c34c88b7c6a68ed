#!/usr/bin/env bash
# bench/overhead.sh — what per-iteration snapshots cost the training loop.
#
# Same job (`small`, 4 workers + 1 spare, R=1 ring replicas) under these modes:
#   none       no checkpoint at all (the baseline)
#   none-again the baseline once more: an A/A control that shows the noise of the method
#   deadpool   per-iteration in-memory snapshots (the default: same-machine holders pull)
#   dp-tcp     the same, replicas sent over TCP as they would be to another machine
#   dp-standing --ft deadpool that never snapshots (--snapshot-every 1e9): what the
#              mode costs with its threads, buffers and holders set up but idle
#   disk1      synchronous disk checkpoint every step
#   disk10     synchronous disk checkpoint every 10 steps
# MODES="none deadpool ..." picks some (none must be among them; default: all).
# Each pair runs every mode once, in the order of the next row of a Williams design: over
# every k pairs (2k for an odd number k of modes) each mode runs in each position equally often
# and follows each other mode equally often, so neither a machine that drifts faster or slower
# over the run nor a run that slows the next one favours a mode. With two modes this is ABBA.
# For each run, the median step time over steps 2..STEPS. A mode's overhead is the median over
# pairs of (mode / none) within the pair; the mean and the range are printed too.
# Disk runs delete their checkpoints and `sync` after they finish (outside the timing), so
# their writeback does not land in the next run. Every run gets --comm-timeout-ms 30000: a
# vCPU the hypervisor stalls for over 2 s (the default collective timeout) would otherwise fail
# a collective now and then, which ends a --ft none run; the timeout costs nothing while all
# is well, so it does not change what is measured.
# Besides step time, the deadpool runs report the CPU time the snapshot threads (copy, CRC,
# send) and the holders' threads (receive or pull, verify) spent on the generations, as a
# share of the CPU time of all workers: the cost itself, without the run-to-run noise of a
# shared machine; and, apart, the one-time CPU of setting up each rank's buffers.
# WORKERS=2 runs 2 workers + 1 spare instead of 4 (on 2 cores: no worker waits for a core).
# usage: [MODES=...] [KEEP=DIR] [WORKERS=N] bench/overhead.sh [PAIRS] [STEPS] [DATA]   runs, prints a Markdown report
#        bench/overhead.sh --report DIR...    the report again, from runs kept with KEEP=DIR; several
#                                             DIRs pool their pairs (same build and steps, please)
# KEEP=DIR keeps every run's metrics and events under DIR (it must not exist yet).
# The report gives, besides the median of the paired ratios, a 90 % bootstrap interval for it
# (2000 resamples of the pairs, fixed seed): the spread that noise alone allows.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/stats.sh
ALL_MODES="none none-again deadpool dp-tcp dp-standing disk1 disk10"
mode_args() {
  case $1 in
    none | none-again) echo "--ft none" ;;
    deadpool) echo "--ft deadpool" ;;
    dp-tcp) echo "--ft deadpool --replica-transport tcp" ;;
    dp-standing) echo "--ft deadpool --snapshot-every 1000000000" ;;
    disk1) echo "--ft disk --ckpt-every 1" ;;
    disk10) echo "--ft disk --ckpt-every 10" ;;
  esac
}

# A run's step time: the median over steps 2.. (step 1 sets up buffers and warms caches).
run_ms() { tail -n +2 "$1/metrics.jsonl" | grep -o '"step_ms":[0-9.]*' | cut -d: -f2 | median; }
# Snapshot + holder threads' CPU over all workers' CPU, in percent.
run_share() {
  awk '/"event":"snapshot_stats"/ { if (match($0, /"cpu_ms":[0-9.]+/)) s += substr($0, RSTART + 9, RLENGTH - 9)
                                   if (match($0, /"holder_cpu_ms":[0-9.]+/)) s += substr($0, RSTART + 16, RLENGTH - 16) }
       /"event":"finish"/ { if (match($0, /"workers_cpu_s":[0-9.]+/)) w = substr($0, RSTART + 16, RLENGTH - 16) }
       END { if (w > 0) printf "%.3f\n", s / (w * 1000) * 100 }' "$1/events.jsonl"
}

# A run counts once it has finished (a copy of a run still going would skew its pair).
finished() { [ -f "$1/events.jsonl" ] && grep -q '"event":"finish"' "$1/events.jsonl"; }
# Every kept pair, as DIR/%s-P (a printf pattern for the mode), from the DIRs given.
pair_runs() {
  local d f
  for d in "$@"; do
    for f in "$d"/none-[0-9]*; do finished "$f" && echo "$d/%s-${f##*-}"; done
  done
  return 0
}
mode_runs() { # MODE PAIRS...: the finished runs of MODE, one per line (pooled DIRs may lack a mode)
  local m=$1 p; shift
  for p in "$@"; do p=$(printf "$p" "$m"); if finished "$p"; then echo "$p"; fi; done
}
ratios() { # MODE PAIRS...: MODE's step time over the pair's --ft none run, one line per pair
  local m=$1 p; shift
  for p in "$@"; do
    local a b; a=$(printf "$p" "$m"); b=$(printf "$p" none)
    finished "$a" && awk -v a="$(run_ms "$a")" -v b="$(run_ms "$b")" 'BEGIN{print a/b}'
  done
  return 0
}
ratios_both() { # MODE PAIRS...: over the geometric mean of the pair's two --ft none runs
  local m=$1 p; shift
  for p in "$@"; do
    local a b c; a=$(printf "$p" "$m"); b=$(printf "$p" none); c=$(printf "$p" none-again)
    finished "$a" && finished "$c" &&
      awk -v a="$(run_ms "$a")" -v b="$(run_ms "$b")" -v c="$(run_ms "$c")" 'BEGIN{print a/sqrt(b*c)}'
  done
  return 0
}

report() {
  local pairs m r ci
  mapfile -t pairs < <(pair_runs "$@")
  [ ${#pairs[@]} -gt 0 ] || { echo "overhead.sh: no kept runs (DIR/none-P/metrics.jsonl) under: $*" >&2; exit 1; }
  local modes=()
  for m in $ALL_MODES; do [ -n "$(mode_runs "$m" "${pairs[@]}")" ] && modes+=("$m"); done
  echo "| mode | step time (ms), median of runs | vs --ft none: median of paired ratios | 90 % interval | mean | lowest | highest | pairs |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  for m in "${modes[@]}"; do
    local ms; ms=$(for a in $(mode_runs "$m" "${pairs[@]}"); do run_ms "$a"; done | median)
    if [ "$m" = none ]; then echo "| $m: $(mode_args "$m") | $ms | | | | | | ${#pairs[@]} |"; continue; fi
    r=$(ratios "$m" "${pairs[@]}"); read -r -a ci <<<"$(boot_ci <<<"$r")"
    echo "| $m: $(mode_args "$m") | $ms | $(pct "$(median <<<"$r")") | $(pct "${ci[0]}") … $(pct "${ci[1]}") |" \
      "$(pct "$(awk '{s+=$1} END {print s/NR}' <<<"$r")") | $(pct "$(sort -g <<<"$r" | head -1)") | $(pct "$(sort -g <<<"$r" | tail -1)") | $(wc -l <<<"$r") |"
  done
  echo
  for m in "${modes[@]}"; do
    [ "$m" = none ] || echo "Paired step-time ratios $m/none, pair by pair: $(ratios "$m" "${pairs[@]}" | awk '{printf "%.4f ", $1}')"
    echo
  done
  if [[ " ${modes[*]} " == *" none-again "* ]]; then
    for m in deadpool dp-tcp dp-standing disk1 disk10; do
      [[ " ${modes[*]} " == *" $m "* ]] || continue
      r=$(ratios_both "$m" "${pairs[@]}")
      [ -n "$r" ] || continue # no pair ran both this mode and none-again
      read -r -a ci <<<"$(boot_ci <<<"$r")"
      echo "$m against both --ft none runs of its pair (geometric mean): median $(pct "$(median <<<"$r")") (90 % interval $(pct "${ci[0]}") … $(pct "${ci[1]}")), mean $(pct "$(awk '{s+=$1} END {print s/NR}' <<<"$r")")"
      echo
    done
  fi
  for m in deadpool dp-tcp; do
    [[ " ${modes[*]} " == *" $m "* ]] || continue
    local shares; shares=$(for a in $(mode_runs "$m" "${pairs[@]}"); do run_share "$a"; done)
    echo "$m: snapshot and holder threads used $(median <<<"$shares")% of the workers' CPU time (median of runs; runs: $(tr '\n' ' ' <<<"$shares"))"
    echo
    # Snapshot traffic and latency, from the runs' snapshot_stats events.
    for a in $(mode_runs "$m" "${pairs[@]}"); do grep -h '"event":"snapshot_stats"' "$a/events.jsonl"; done | awk -v m="$m" '
      function f(k,   v) { if (!match($0, "\"" k "\":[0-9.]+")) return 0; v = substr($0, RSTART, RLENGTH); sub(/.*:/, "", v); return v }
      { n++; caps += f("captures"); bcs += f("bytes_copied"); brs += f("bytes_replicated"); bps += f("bytes_pulled")
        cms += f("copy_ms_mean"); rms += f("replicate_ms_mean"); ws += f("waits"); wts += f("wait_ms_total")
        gcpu += f("cpu_ms") + f("holder_cpu_ms"); wcpu += f("warmup_cpu_ms") }
      END { printf "%s: per rank and step %.1f MiB copied, %.1f MiB replicated (%.0f%% pulled in memory); copy %.1f ms, replication %.1f ms (wall, means over %d rank-runs); the loop waited for a snapshot %d times in %d steps, %.1f ms in total.\n\n",
            m, bcs / caps / 1048576, brs / caps / 1048576, brs ? 100 * bps / brs : 0, cms / n, rms / n, n, ws, caps, wts
            printf "%s: CPU per rank and generation (snapshot thread + its holder) %.1f ms; one-time buffer setup on the snapshot thread %.0f ms per rank (its holder spends about as much on its RESERVE).\n\n", m, gcpu / caps, wcpu / n }'
  done
}

# williams_row K R: row R (mod the design's rows) of a Williams design for K treatments, as
# indices. Row 0 is 0, 1, K-1, 2, K-2, ...; row i adds i (mod K); for odd K the reversed rows
# follow, which is what balances carry-over there.
williams_row() {
  local k=$1 r=$2 rows=$1 j row=()
  [ $((k % 2)) -eq 1 ] && rows=$((2 * k))
  r=$((r % rows))
  for ((j = 0; j < k; j++)); do
    if [ $((j % 2)) -eq 1 ]; then row+=($((((j + 1) / 2 + r) % k))); else row+=($(((k - j / 2 + r) % k))); fi
  done
  if [ "$r" -ge "$k" ]; then for ((j = k - 1; j >= 0; j--)); do echo "${row[j]}"; done
  else printf '%s\n' "${row[@]}"; fi
}

if [ "${1:-}" = --report ]; then
  shift
  report "$@"
  exit 0
fi

PAIRS=${1:-6}
STEPS=${2:-12}
DATA=${3:-../shared/data/tinyshakespeare.txt}
WORKERS=${WORKERS:-4}
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
read -r -a MODES <<<"${MODES:-$ALL_MODES}"
[[ " ${MODES[*]} " == *" none "* ]] || { echo "overhead.sh: MODES must include none (the baseline), found: ${MODES[*]}" >&2; exit 2; }
make -s deadpool
if [ -n "${KEEP:-}" ]; then
  [ -e "$KEEP" ] && { echo "overhead.sh: KEEP=$KEEP exists already; name a new directory" >&2; exit 2; }
  mkdir -p "$KEEP"; work=$KEEP
else
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fi

for p in $(seq "$PAIRS"); do
  order=(); for i in $(williams_row "${#MODES[@]}" $((p - 1))); do order+=("${MODES[i]}"); done
  for m in "${order[@]}"; do
    out="$work/$m-$p"
    # shellcheck disable=SC2046
    ./deadpool run --workers "$WORKERS" --spares 1 --model small --steps "$STEPS" --seed 1 --out "$out" \
      --comm-timeout-ms 30000 $(mode_args "$m") "${DATA_ARGS[@]}" >/dev/null 2>"$out.log" || { cat "$out.log"; exit 1; }
    rm -rf "$out/ckpt"; sync
    echo "pair $p $m $(run_ms "$out") ms/step" >&2
  done
done

report "$work"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); pairs $PAIRS, steps $STEPS, workers $WORKERS + 1 spare"
