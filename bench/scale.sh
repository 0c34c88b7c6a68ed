#!/usr/bin/env bash
# bench/scale.sh — what a kill -9 costs at N ranks: N workers + SPARES spares on this machine,
# one rank (N/2+1) kills itself in step FAIL, REPS runs per N; the median of each phase of the
# `recovered` event, the Redis round trips per failure (the coordinator's, from the `decision`
# event, and every rank's join, from the `recovered` event) and the median step time.
#
# usage: bench/scale.sh [REPS] [N...]            (default: 3 runs each of 32 64 128)
# env:   MODEL=micro SPARES=4 STEPS=8 FAIL=5     the job
#        COMM_TIMEOUT_MS                         default 2000 + 100 ms per rank (see below)
#        BIN=./deadpool                          the binary to measure (e.g. an older build)
#        KEEP=DIR                                keep every run's output under DIR
#        MAX_FOREIGN=0.5                         see "Other load" below
#
# Other load. Others share this 2-core machine, so every run is watched: twice a second the
# script counts the runnable threads (/proc/*/task/*/stat, state R) outside the job's session
# (the job runs under setsid) and outside this script's. A run during which that count averaged
# more than MAX_FOREIGN is thrown away and run again (at most twice; the table says how many
# were), and before each run the script waits (at most 10 minutes) until that count has stayed
# below MAX_FOREIGN for two seconds. The 1-minute load average cannot be the gate between runs:
# a 128-rank run leaves it far above any threshold for minutes after it ended.
#
# Timeouts at scale. N ranks on 2 cores reach each collective up to about N/2 forward/backward
# passes apart, and a collective is bounded by --comm-timeout-ms (default: the 2 s detection
# timeout), so the default grows with N here: 2000 + 100 N ms (14.8 s at 128 ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; shift || true
SIZES=("$@"); [ ${#SIZES[@]} -gt 0 ] || SIZES=(32 64 128)
MODEL=${MODEL:-micro}; SPARES=${SPARES:-4}; STEPS=${STEPS:-8}; FAIL=${FAIL:-5}
MAX_FOREIGN=${MAX_FOREIGN:-0.5}
BIN=${BIN:-./deadpool}
[ "$BIN" = ./deadpool ] && make -s deadpool
source bench/stats.sh
work=${KEEP:-$(mktemp -d)}; mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
field() { grep -o "\"$1\":[-0-9.]*" | head -1 | cut -d: -f2; }

# Mean number of runnable threads outside sessions $1 and $2 (and the kernel's), one sample.
foreign_now() {
  cat /proc/[0-9]*/task/[0-9]*/stat 2>/dev/null |
    awk -v a="$1" -v b="$2" '{ sub(/^.*\) /, ""); if ($1 == "R" && $4 != 0 && $4 != a && $4 != b) n++ } END { print n + 0 }'
}
my_sid=$(ps -o sid= -p $$ | tr -d ' ')

# Waits until no foreign thread has run for two seconds (4 samples), at most 10 minutes.
wait_quiet() {
  local deadline=$((SECONDS + 600)) quiet=0
  while [ $SECONDS -lt $deadline ]; do
    if [ "$(foreign_now "$my_sid" -1)" -eq 0 ]; then quiet=$((quiet + 1)); else quiet=0; fi
    [ $quiet -ge 4 ] && return 0
    sleep 0.5
  done
  echo "bench/scale.sh: the machine did not become quiet within 10 minutes; measuring anyway" >&2
}

# run N REP: one job; writes $work/N.REP.row. Returns 1 when it was disturbed.
run() {
  local n=$1 rep=$2 out="$work/n$1.r$2" victim=$(($1 / 2 + 1)) ct=${COMM_TIMEOUT_MS:-$((2000 + 100 * $1))}
  rm -rf "$out"; mkdir -p "$out"
  wait_quiet
  setsid -w "$BIN" run --workers "$n" --spares "$SPARES" --model "$MODEL" --steps "$STEPS" --seed 1 \
    --inject "kill:$victim@$FAIL" --comm-timeout-ms "$ct" --out "$out" >"$out.stdout" 2>"$out.log" &
  local job=$! samples=0 sum=0 s sid
  sleep 0.2
  sid=$(ps -o sid= -p "$job" 2>/dev/null | tr -d ' '); sid=${sid:-$job}
  while kill -0 "$job" 2>/dev/null; do
    s=$(foreign_now "$my_sid" "$sid"); samples=$((samples + 1)); sum=$((sum + s))
    sleep 0.5
  done
  wait "$job" || { echo "n=$n run $rep failed:" >&2; tail -5 "$out.log" >&2; return 2; }
  local e="$out/events.jsonl" rec dec step k v
  rec=$(grep '"event":"recovered"' "$e" | head -1)
  dec=$(grep '"event":"decision"' "$e" | head -1)
  [ -n "$rec" ] || { echo "n=$n run $rep: no recovered event" >&2; return 2; }
  step=$(grep -o '"step_ms":[0-9.]*' "$out/metrics.jsonl" | tail -n +2 | cut -d: -f2 | median)
  local foreign; foreign=$(awk -v s="$sum" -v n="$samples" 'BEGIN { printf "%.2f", n ? s / n : 0 }')
  # total detect decide restore rebuild rendezvous barrier resnapshot coord_rtt join_rtt_max join_rtt_total step foreign
  {
    for k in total_ms detect_ms decide_ms restore_ms rebuild_ms rendezvous_ms barrier_ms resnapshot_ms; do
      v=$(echo "$rec" | field $k); printf '%s ' "${v:--}"
    done
    v=$(echo "$dec" | field redis_round_trips); printf '%s ' "${v:--}"
    for k in join_round_trips_max join_round_trips_total; do v=$(echo "$rec" | field $k); printf '%s ' "${v:--}"; done
    printf '%s %s\n' "${step:--}" "$foreign"
  } >"$work/n$n.r$rep.row"
  echo "n=$n run $rep: $(cat "$work/n$n.r$rep.row") (foreign runnable threads $foreign)" >&2
  awk -v f="$foreign" -v m="$MAX_FOREIGN" 'BEGIN { exit !(f > m) }' && return 1
  return 0
}

declare -A disturbed
for n in "${SIZES[@]}"; do
  disturbed[$n]=0
  for rep in $(seq "$REPS"); do
    for try in 1 2 3; do
      rc=0; run "$n" "$rep" || rc=$?
      [ $rc -eq 2 ] && exit 1
      [ $rc -eq 0 ] && break
      disturbed[$n]=$((disturbed[$n] + 1))
      [ $try -lt 3 ] && echo "n=$n run $rep: disturbed by other load, running it again" >&2
    done
  done
done

col() { # n column -> median over the runs ("-" when absent)
  local v; v=$(cat "$work"/n$1.r*.row | awk -v c="$2" '$c != "-" { print $c }' | median); echo "${v:--}"
}
echo "| ranks | total_ms: kill -9 → training resumed (median of $REPS) | detect | decide | restore | rebuild | of which rendezvous | of which first barrier | re-snapshot | Redis round trips: coordinator | per rank (max) | all ranks | step time (ms) | runs redone (other load) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in "${SIZES[@]}"; do
  printf '| %s + %s |' "$n" "$SPARES"
  for c in 1 2 3 4 5 6 7 8 9 10 11 12; do printf ' %s |' "$(col "$n" $c)"; done
  printf ' %s |\n' "${disturbed[$n]}"
done
echo
echo "per run (total_ms): $(for n in "${SIZES[@]}"; do printf '%s: %s; ' "$n" "$(cat "$work"/n$n.r*.row | awk '{ printf "%s ", $1 }')"; done)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date); model $MODEL, $STEPS steps, kill -9 of rank N/2+1 in step $FAIL, binary $BIN"
