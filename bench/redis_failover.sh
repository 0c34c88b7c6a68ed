#!/usr/bin/env bash
# bench/redis_failover.sh — what training sees when the Redis master dies under Sentinel.
#
# REPS runs of `deadpool run --redis-ha` (embedded master, replica, three sentinels: down after
# 1 s), `--model MODEL`, 2 workers + 1 spare; the master is killed with -9 after KILL_STEP
# steps. From metrics.jsonl: the time lost after the kill — between two progress lines, the
# time the steps between them do not account for at the run's median step time (lines pushed
# while Redis was down are lost, the steps go on) — and whether the job needed a recovery.
# usage: bench/redis_failover.sh [REPS=5] [MODEL=tiny] [STEPS=300] [KILL_STEP=60]     Markdown on stdout
set -uo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}; MODEL=${2:-tiny}; STEPS=${3:-300}; KILL=${4:-60}
make -s deadpool >/dev/null || exit 1
source bench/stats.sh
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
step_of() { grep -oE '^step +[0-9]+' "$1" 2>/dev/null | tail -1 | grep -oE '[0-9]+' || echo 0; }
: >"$work/rows"
for r in $(seq "$REPS"); do
  out="$work/r$r"
  timeout -k 5 600 ./deadpool run --out "$out" --workers 2 --spares 1 --model "$MODEL" --steps "$STEPS" --seed 5 --redis-ha \
    >"$out.stdout" 2>"$out.log" &
  job=$!
  for _ in $(seq 6000); do [ "$(step_of "$out.stdout")" -ge "$KILL" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.02; done
  mp=$(grep -o 'master 127.0.0.1:[0-9]* (pid [0-9]*' "$out.log" | grep -o '[0-9]*$')
  t_kill=$(date +%s%3N)
  [ -n "$mp" ] && kill -9 "$mp"
  wait $job; rc=$?
  # step completion times (s since start) and the kill's, on the same clock as the job's t0
  t0=$(grep -o '"t0_ms":[0-9]*' "$out/events.jsonl" | head -1 | cut -d: -f2)
  # "step t" per metrics line; lines pushed while Redis was down are lost, so a gap between two
  # lines is a pause only for the part the steps between them do not account for
  paste -d' ' <(grep -o '"step":[0-9]*' "$out/metrics.jsonl" | cut -d: -f2) \
              <(grep -o '"t":[0-9.]*' "$out/metrics.jsonl" | cut -d: -f2) >"$out.t"
  med=$(awk 'NR > 1 && $1 == ps + 1 { print $2 - pt } { ps = $1; pt = $2 }' "$out.t" | median)
  awk -v tk="$t_kill" -v t0="${t0:-0}" -v rc="$rc" -v med="$med" -v rec="$(grep -c '"event":"recovered"' "$out/events.jsonl")" '
    { s[NR] = $1; ts[NR] = $2 }
    END { kill = (tk - t0) / 1000; worst = 0
          for (i = 2; i <= NR; i++) {
            lost = ts[i] - ts[i - 1] - (s[i] - s[i - 1]) * med
            if (ts[i] > kill && lost > worst) worst = lost }
          printf "%.0f %.1f %d %d\n", worst * 1000, med * 1000, rec, rc }' "$out.t" >>"$work/rows"
  echo "run $r: $(tail -1 "$work/rows")" >&2
done
echo "| runs | training time lost to the master's kill: median (min–max) | step time (median) | runs with a recovery | runs that failed |"
echo "|---|---|---|---|---|"
printf "| %d | **%s ms** (%s–%s) | %s ms | %d | %d |\n" "$(wc -l <"$work/rows")" "$(awk '{print $1}' "$work/rows" | median)" \
  "$(awk '{print $1}' "$work/rows" | sort -g | head -1)" "$(awk '{print $1}' "$work/rows" | sort -g | tail -1)" \
  "$(awk '{print $2}' "$work/rows" | median)" "$(awk '$3 > 0' "$work/rows" | wc -l)" "$(awk '$4 != 0' "$work/rows" | wc -l)"
echo
echo "\`$MODEL\`, 2 workers + 1 spare, $STEPS steps, master killed after step $KILL; sentinels: down after 1000 ms"
