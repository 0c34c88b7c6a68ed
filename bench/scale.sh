#!/usr/bin/env bash
# bench/scale.sh — what a kill -9 costs at N ranks: N workers + SPARES spares on this machine,
# one rank (N/2+1) kills itself in step FAIL, REPS runs per N; the median of each phase of the
# `recovered` event, the Redis round trips per failure (the coordinator's, from the `decision`
# event, and every rank's join, from the `recovered` event), the median step time, recovery
# divided by it, and the data-plane connections the recovery made (per survivor, at most, and
# in all: survivor_connections_max, connections_total).
#
# usage: bench/scale.sh [REPS] [N...]            (default: 3 runs each of 32 64 128)
#        bench/scale.sh --report DIR [N...]      the table of runs kept in DIR (KEEP=DIR)
# env:   MODEL=micro SPARES=4 STEPS=8 FAIL=5     the job
#        COMM_TIMEOUT_MS                         default 2000 + 250 ms per rank (see below)
#        DETECT_MS=10000                         --detect-timeout-ms (see below)
#        BIN=./deadpool                          the binary to measure (e.g. an older build)
#        KEEP=DIR                                keep every run's output under DIR
#        FIRST_REP=1                             number the runs from here (to add runs to DIR)
#        LOAD_GATE=1                             0: do not wait for the load average at start
#        MAX_FOREIGN=1                           see "Other load" below
#
# Other load. Others share this 2-core machine. The script starts only once the 1-minute load
# average is below 2.5 (waiting up to 15 minutes). From then on every run is watched: twice a
# second the script counts the runnable threads (/proc/*/task/*/stat, state R) outside the
# job's session (the job runs under setsid) and outside this script's. A run during which that
# count averaged more than MAX_FOREIGN is thrown away and run again (at most twice; the table
# says how many were, and the mean count of the runs kept), and before each run the script
# waits (at most 10 minutes) until the count has stayed at or below MAX_FOREIGN for two seconds.
# The load average cannot be the gate between runs: a 128-rank run leaves it far above any
# threshold for minutes after it ended.
#
# Timeouts at scale. N ranks on 2 cores are slow: at 128 ranks a step of `micro` takes 12 s,
# almost all of it the hops of the ring collectives, and a collective is bounded by
# --comm-timeout-ms (default: the 2 s detection timeout), so here it grows with N: 2000 + 250 N
# ms (34 s at 128 ranks). A recovery's rendezvous is bounded by 2 x --detect-timeout-ms + 3 s
# (7 s by default), which 128 ranks on 2 cores need most of; every run here uses
# --detect-timeout-ms 10000 (a 23 s bound). A kill -9 is detected by the launcher, not by that
# timeout, so the recovery measured does not depend on it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPORT=""
if [ "${1:-}" = --report ]; then REPORT=$2; shift 2; set -- 0 "$@"; fi
REPS=${1:-3}; shift || true
SIZES=("$@"); [ ${#SIZES[@]} -gt 0 ] || [ -n "$REPORT" ] || SIZES=(32 64 128)
MODEL=${MODEL:-micro}; SPARES=${SPARES:-4}; STEPS=${STEPS:-8}; FAIL=${FAIL:-5}; DETECT_MS=${DETECT_MS:-10000}
MAX_FOREIGN=${MAX_FOREIGN:-1}
BIN=${BIN:-./deadpool}
FIRST_REP=${FIRST_REP:-1}
source bench/stats.sh
if [ -n "$REPORT" ]; then
  work=$REPORT
  if [ ${#SIZES[@]} -eq 0 ]; then mapfile -t SIZES < <(ls "$work" | sed -n 's/^n\([0-9]*\)\.r[0-9]*\.row$/\1/p' | sort -nu); fi
else
  [ "$BIN" = ./deadpool ] && make -s deadpool
  work=${KEEP:-$(mktemp -d)}; mkdir -p "$work"
  [ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
fi
field() { grep -o "\"$1\":[-0-9.]*" | head -1 | cut -d: -f2; }

# Mean number of runnable threads outside sessions $1 and $2 (and the kernel's), one sample.
foreign_now() {
  { cat /proc/[0-9]*/task/[0-9]*/stat 2>/dev/null || true; } |
    awk -v a="$1" -v b="$2" '{ sub(/^.*\) /, ""); if ($1 == "R" && $4 != 0 && $4 != a && $4 != b) n++ } END { print n + 0 }'
}
my_sid=$(ps -o sid= -p $$ | tr -d ' ')

# Waits until at most MAX_FOREIGN foreign threads ran for two seconds (4 samples), at most 10 minutes.
wait_quiet() {
  local deadline=$((SECONDS + 600)) quiet=0
  while [ $SECONDS -lt $deadline ]; do
    if awk -v f="$(foreign_now "$my_sid" -1)" -v m="$MAX_FOREIGN" 'BEGIN { exit !(f <= m) }'; then quiet=$((quiet + 1)); else quiet=0; fi
    [ $quiet -ge 4 ] && return 0
    sleep 0.5
  done
  echo "bench/scale.sh: the machine did not become quiet within 10 minutes; measuring anyway" >&2
}

# run N REP: one job; writes $work/N.REP.row. Returns 1 when it was disturbed.
run() {
  local n=$1 rep=$2 out="$work/n$1.r$2" victim=$(($1 / 2 + 1)) ct=${COMM_TIMEOUT_MS:-$((2000 + 250 * $1))}
  rm -rf "$out" "$work/n$n.r$rep.row"; mkdir -p "$out"
  wait_quiet
  setsid -w "$BIN" run --workers "$n" --spares "$SPARES" --model "$MODEL" --steps "$STEPS" --seed 1 \
    --inject "kill:$victim@$FAIL" --comm-timeout-ms "$ct" --detect-timeout-ms "$DETECT_MS" --out "$out" >"$out.stdout" 2>"$out.log" &
  local job=$! samples=0 sum=0 s sid
  sleep 0.2
  sid=$(ps -o sid= -p "$job" 2>/dev/null | tr -d ' '); sid=${sid:-$job}
  while kill -0 "$job" 2>/dev/null; do
    s=$(foreign_now "$my_sid" "$sid"); samples=$((samples + 1)); sum=$((sum + s))
    sleep 0.5
  done
  local e="$out/events.jsonl" rec dec step k v
  wait "$job" || { echo "n=$n run $rep failed:" >&2; tail -3 "$out.log" >&2; return 3; }
  rec=$(grep '"event":"recovered"' "$e" | grep -v '"rank":-1' | head -1)
  dec=$(grep '"event":"decision"' "$e" | head -1)
  # a recovery that needed a second decision (its first rendezvous timed out) is a failure here
  [ -n "$rec" ] && [ "$(grep -c '"event":"decision"' "$e")" -eq 1 ] || {
    echo "n=$n run $rep: not recovered by one decision" >&2; return 3; }
  step=$(grep -o '"step_ms":[0-9.]*' "$out/metrics.jsonl" | tail -n +2 | cut -d: -f2 | median)
  local foreign; foreign=$(awk -v s="$sum" -v n="$samples" 'BEGIN { printf "%.2f", n ? s / n : 0 }')
  # total detect decide restore rebuild rendezvous barrier resnapshot coord_rtt join_rtt_max join_rtt_total step foreign
  # survivor_connections_max connections_total
  {
    for k in total_ms detect_ms decide_ms restore_ms rebuild_ms rendezvous_ms barrier_ms resnapshot_ms; do
      v=$(echo "$rec" | field $k); printf '%s ' "${v:--}"
    done
    v=$(echo "$dec" | field redis_round_trips); printf '%s ' "${v:--}"
    for k in join_round_trips_max join_round_trips_total; do v=$(echo "$rec" | field $k); printf '%s ' "${v:--}"; done
    printf '%s %s' "${step:--}" "$foreign"
    for k in survivor_connections_max connections_total; do v=$(echo "$rec" | field $k); printf ' %s' "${v:--}"; done
    echo
  } >"$work/n$n.r$rep.row"
  echo "n=$n run $rep: $(cat "$work/n$n.r$rep.row") (foreign runnable threads $foreign)" >&2
  awk -v f="$foreign" -v m="$MAX_FOREIGN" 'BEGIN { exit !(f > m) }' && return 1
  return 0
}

deadline=$((SECONDS + 900))
while [ -z "$REPORT" ] && [ "${LOAD_GATE:-1}" = 1 ] && [ $SECONDS -lt $deadline ] &&
      awk -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN { exit !(l >= 2.5) }'; do sleep 10; done
[ -n "$REPORT" ] || echo "bench/scale.sh: starting at load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

declare -A disturbed failed
for n in "${SIZES[@]}"; do
  disturbed[$n]=$(cat "$work/n$n.disturbed" 2>/dev/null || echo 0); failed[$n]=$(cat "$work/n$n.failed" 2>/dev/null || echo 0)
  for rep in $(seq "$FIRST_REP" $((FIRST_REP + REPS - 1))); do
    for try in 1 2 3; do
      rc=0; run "$n" "$rep" || rc=$?
      if [ $rc -eq 3 ]; then failed[$n]=$((failed[$n] + 1)); break; fi
      [ $rc -eq 0 ] && break
      disturbed[$n]=$((disturbed[$n] + 1))
      [ $try -lt 3 ] && echo "n=$n run $rep: disturbed by other load, running it again" >&2
    done
  done
  [ -n "$REPORT" ] || { echo "${disturbed[$n]}" >"$work/n$n.disturbed"; echo "${failed[$n]}" >"$work/n$n.failed"; }
done

col() { # n column -> median over the runs ("-" when absent)
  local v; v=$(cat "$work"/n$1.r*.row 2>/dev/null | awk -v c="$2" '$c != "-" { print $c }' | median); echo "${v:--}"
}
nruns() { ls "$work"/n$1.r*.row 2>/dev/null | wc -l; }
echo "| ranks | total_ms: kill -9 → training resumed (median) | detect | decide | restore | rebuild | of which rendezvous | of which first barrier | re-snapshot | Redis round trips: coordinator | per rank (max) | all ranks | step time (ms) | recovery / step | data-plane connections made per survivor (max) | in all | other runnable threads (mean) | runs redone (other load) | runs not recovered by one decision |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in "${SIZES[@]}"; do
  printf '| %s + %s (%s runs) |' "$n" "$SPARES" "$(nruns "$n")"
  for c in 1 2 3 4 5 6 7 8 9 10 11 12; do printf ' %s |' "$(col "$n" $c)"; done
  printf ' %s |' "$(awk -v t="$(col "$n" 1)" -v s="$(col "$n" 12)" 'BEGIN { if (t == "-" || s == "-" || s == 0) print "-"; else printf "%.2f", t / s }')"
  printf ' %s | %s |' "$(col "$n" 14)" "$(col "$n" 15)"
  printf ' %s | %s | %s |\n' "$(col "$n" 13)" "${disturbed[$n]}" "${failed[$n]}"
done
echo
echo "per run (total_ms): $(for n in "${SIZES[@]}"; do printf '%s: %s; ' "$n" "$(cat "$work"/n$n.r*.row 2>/dev/null | awk '{ printf "%s ", $1 }')"; done)"
[ -z "$REPORT" ] || echo "runs kept in $REPORT (their settings and machine: the table printed when they ran)"
[ -n "$REPORT" ] || echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB; $(date); model $MODEL, $STEPS steps, kill -9 of rank N/2+1 in step $FAIL, --detect-timeout-ms $DETECT_MS, --comm-timeout-ms 2000 + 250 N unless COMM_TIMEOUT_MS; binary $BIN"
