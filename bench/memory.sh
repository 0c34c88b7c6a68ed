#!/usr/bin/env bash
# bench/memory.sh — host memory of a running job, per process: what a worker holds (its live
# model, its snapshot buffers, the replica slots it keeps for another rank) and what the spare
# holds, for one or more builds.
#
# For each BINARY: `small`, W workers + 1 spare, --ft deadpool, 12 steps; once the 6th step's
# metrics are out (every buffer and replica slot is set up and in use by then), VmRSS and
# RssAnon of every worker and of the spare, read from /proc/PID/status. Prints a Markdown
# table: the workers' median, the spare, the whole job.
# usage: [WORKERS=N] [ARGS="--snapshot-every 2 ..."] bench/memory.sh [BINARY...]   (default: ./deadpool)
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-4}
read -r -a EXTRA <<<"${ARGS:-}"
DATA=../shared/data/tinyshakespeare.txt
DATA_ARGS=(); [ -f "$DATA" ] && DATA_ARGS=(--data "$DATA")
[ $# -gt 0 ] || { make -s deadpool; set -- ./deadpool; }
. bench/stats.sh
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

echo "| build | worker VmRSS (MB, median of $WORKERS) | worker RssAnon | spare VmRSS | spare RssAnon | job VmRSS (MB) |"
echo "|---|---:|---:|---:|---:|---:|"
for bin in "$@"; do
  out="$work/run"; rm -rf "$out"
  "$bin" run --workers "$WORKERS" --spares 1 --model small --steps 12 --seed 1 --out "$out" "${DATA_ARGS[@]}" \
    "${EXTRA[@]}" >/dev/null 2>"$work/log" &
  job=$!
  for _ in $(seq 600); do # up to 120 s for the 6th step
    n=$(cat "$out/metrics.jsonl" 2>/dev/null | grep -c '"step"' || true)
    [ "${n:-0}" -ge 6 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.2
  done
  workers=$(grep -o '"event":"rank_joined"[^}]*"pid":[0-9]*' "$out/events.jsonl" | grep -o '"pid":[0-9]*' | cut -d: -f2)
  spare=$(grep -o '"event":"spare_joined"[^}]*"pid":[0-9]*' "$out/events.jsonl" | grep -o '"pid":[0-9]*' | cut -d: -f2 | head -1)
  w_rss=""; w_anon=""; total=0
  for p in $workers; do
    r=$(kb "$p" VmRSS); a=$(kb "$p" RssAnon)
    w_rss+="$r"$'\n'; w_anon+="$a"$'\n'; total=$((total + ${r:-0}))
  done
  s_rss=$(kb "$spare" VmRSS); s_anon=$(kb "$spare" RssAnon); total=$((total + ${s_rss:-0}))
  wait "$job" || { cat "$work/log"; exit 1; }
  mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
  echo "| $bin | $(mb "$(median <<<"$w_rss")") | $(mb "$(median <<<"$w_anon")") | $(mb "${s_rss:-0}") | $(mb "${s_anon:-0}") | $(mb "$total") |"
done
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F); workers $WORKERS + 1 spare"
