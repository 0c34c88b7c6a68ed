#!/usr/bin/env bash
# bench/multinode.sh — losing a whole machine, on simulated machines (tests/lib_hosts.sh).
#
# Host 0 runs Redis; hosts 1 and 2 are the job's machines (P ranks each), host 3 a spare
# machine. Per repetition, two runs of `--model MODEL`, the default --detect-timeout-ms:
#   crash — host 2's pid 1 is killed once it has done FAIL_STEP steps (every process of the
#           machine dies at once; its address stays: peers see resets);
#   cut   — host 2's link goes down instead (its processes live on, unreachable);
#   coord — host 1, the machine that coordinates (its launcher and its ranks), crashes: another
#           machine's launcher takes the coordinator's lease and decides.
# From the coordinator's `recovered` event: training resumed (the last member back in the
# step loop) minus the moment of the fault as the bench took it (date in the root namespace:
# the same kernel clock every machine reads here), and the phases. Needs root.
# usage: bench/multinode.sh [REPS=5] [MODEL=small] [P=2] [STEPS=40] [FAIL_STEP=15]   Markdown on stdout
set -uo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}; MODEL=${2:-small}; P=${3:-2}; STEPS=${4:-40}; FAIL=${5:-15}
make -s deadpool >/dev/null || exit 1
source tests/lib_e2e.sh
source tests/lib_hosts.sh
source bench/stats.sh
hosts_available || { echo "bench/multinode.sh: needs root and network namespaces" >&2; exit 1; }
hosts_create 4 || exit 1
export DEADPOOL_REDIS_PASSWORD="bench-$$-$RANDOM"
host_spawn 0 "$WORK/redis.log" redis-server --port 6399 --bind "${HOST_ADDR[0]}" --save '' --appendonly no \
  --requirepass "$DEADPOOL_REDIS_PASSWORD"
sleep 0.5
URL="redis://${HOST_ADDR[0]}:6399"
field() { grep -o "\"$1\":[-0-9.]*" | head -1 | cut -d: -f2; }
L=()
start() { # host job
  host_spawn "$1" "$WORK/$2.h$1.log" timeout -k 5 300 "$DP" run --nnodes 2 --nproc-per-node "$P" --model "$MODEL" \
    --steps "$STEPS" --seed 3 --redis "$URL" --job "$2" --secret-file "$SECRET_FILE" --out "${HOST_DIR[$1]}/$2" --bind "${HOST_ADDR[$1]}"
  L[$1]=$HOST_SPAWN_PID
  local k # joined before the next one starts: machines join in the order they are started
  for k in $(seq 600); do grep -q 'joined job' "$WORK/$2.h$1.log" 2>/dev/null && break; sleep 0.05; done
}
step_of() { grep -oE '^step +[0-9]+' "$1" 2>/dev/null | tail -1 | grep -oE '[0-9]+' || echo 0; }
# run KIND REP — appends "total detect decide restore rebuild resnapshot failed_wall fault_wall kind" to
# $WORK/KIND.rows. Called in the main shell: host_spawn's processes must be its children.
run() {
  local kind=$1 j="b$1$2" t_fault rec
  start 1 "$j"; start 2 "$j"; start 3 "$j"
  for _ in $(seq 3000); do [ "$(step_of "$WORK/$j.h1.log")" -ge "$FAIL" ] && break; sleep 0.02; done
  t_fault=$(date +%s%3N)
  case $kind in crash) host_kill 2 ;; cut) host_link_down 2 ;; coord) host_kill 1 ;; esac
  recs() { cat "${HOST_DISK[1]}/$j/events.jsonl" "${HOST_DISK[2]}/$j/events.jsonl" "${HOST_DISK[3]}/$j/events.jsonl" 2>/dev/null | grep '"event":"recovered"'; }
  for _ in $(seq 1500); do [ -n "$(recs)" ] && break; sleep 0.02; done
  [ "$kind" = cut ] && host_link_up 2
  host_wait "${L[2]}" 240 >/dev/null; host_wait "${L[3]}" 60 >/dev/null; host_wait "${L[1]}" 60 >/dev/null
  case $kind in crash) host_restart 2 ;; coord) host_restart 1 ;; esac
  rec=$(recs | head -1)
  [ -n "$rec" ] || { echo "$kind $2: no recovery in $j" >&2; return 1; }
  local row
  row="$(( $(echo "$rec" | field resumed_wall_ms) - t_fault )) $(echo "$rec" | field detect_ms) $(echo "$rec" | field decide_ms)"
  row="$row $(echo "$rec" | field restore_ms) $(echo "$rec" | field rebuild_ms) $(echo "$rec" | field resnapshot_ms)"
  row="$row $(echo "$rec" | field failed_wall_ms) $t_fault $(echo "$rec" | grep -o '"failure_kind":"[a-z]*"' | cut -d'"' -f4)"
  echo "$row" >>"$WORK/$kind.rows"
  echo "$kind $2: $row" >&2
}
KINDS=${KINDS:-crash cut coord}
for kind in $KINDS; do : >"$WORK/$kind.rows"; done
for r in $(seq "$REPS"); do
  for kind in $KINDS; do run "$kind" "$r"; done
done
echo "| fault | runs | fault → training resumed: median (min–max) | the coordinator's detect / decide / restore / rebuild / re-snapshot (medians, ms) | failure kinds |"
echo "|---|---|---|---|---|"
for kind in $KINDS; do
  f="$WORK/$kind.rows"
  col() { awk -v c="$1" '{print $c}' "$f" | median; }
  printf "| %s | %d | **%s ms** (%s–%s) | %s / %s / %s / %s / %s | %s |\n" "$kind" "$(wc -l <"$f")" "$(col 1)" \
    "$(awk '{print $1}' "$f" | sort -g | head -1)" "$(awk '{print $1}' "$f" | sort -g | tail -1)" \
    "$(col 2)" "$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)" \
    "$(awk '{print $9}' "$f" | sort | uniq -c | awk '{printf "%s%s x %s", (NR > 1 ? ", " : ""), $1, $2}')"
done
echo
echo "machines: 2 × $P ranks + 1 spare machine of $P, \`$MODEL\`, $STEPS steps, fault after step $FAIL, default --detect-timeout-ms"
