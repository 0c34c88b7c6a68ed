#!/usr/bin/env bash
# bench/torch.sh — the PyTorch GPT-2 (examples/torch/train_gpt2.py) under DeadPool against the
# same script under torchrun with DistributedDataParallel (gloo), 4 ranks, interleaved (ABBA)
# in one sitting:
#   step    the median step time of each run over steps 6..STEPS: DeadPool (4 workers + 1
#           spare, a snapshot every step, replicated to a peer) against DDP; the ratio of each
#           pair, then the median over pairs;
#   memory  the peak resident memory (VmHWM) of each worker, polled every 0.2 s: DeadPool's
#           workers (and its spare, apart) against DDP's;
#   kill    time lost to one kill -9 of rank 1 at step KILL_AT: the training span of the run
#           with the kill (from step 1 done to the last step done) minus the median span
#           without; process start-up before the first step and teardown are outside both. DeadPool hot-swaps the spare; torchrun restarts every
#           worker (--max_restarts 1), which reload the newest torch.save checkpoint, taken
#           every 10 steps (--ckpt-every 10), and replay the steps since.
# usage: bench/torch.sh [PAIRS=5] [STEPS=80] [KILL_AT=35]     prints a Markdown report
#   MODEL="--n-layer 6 --n-embd 384 --n-head 6 --block 256"   another model (default: the script's 0.12M)
#   KILLS=3   kill runs of each side (0: step time and memory only)
#   DPLOOP=ddp  DeadPool's side runs the DDP program itself (train_gpt2.py --ddp) over the
#               `deadpool` torch.distributed backend; default: the deadpool.torch loop
# torchrun is started as `python3 -m torch.distributed.run --redirects 1 --tee 1`: Debian's
# torch 1.13 under Python 3.11 fails on the default --redirects 0 (Std.from_str returns None).
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-5} STEPS=${2:-80} KILL_AT=${3:-35}
PY=/usr/bin/python3
read -r -a MODEL_ARGS <<<"${MODEL:-}"
TRAIN=(examples/torch/train_gpt2.py "${MODEL_ARGS[@]}")
KILLS=${KILLS:-3}
W=$(mktemp -d /tmp/dp_bench_torch_XXXXXX)
if [ -n "${KEEP:-}" ]; then echo "# runs kept in $W"; else trap 'rm -rf "$W"' EXIT; fi
make -s >/dev/null

# peak_rss OUT PATTERN... — until the processes matching PATTERN are gone, each one's VmHWM (kB)
# into OUT as "pid spare? kB" (polled; the newest value of each pid is kept).
poll_rss() {
  local out=$1 pat=$2 p spare
  : >"$out.raw"
  while [ -e "$out.poll" ]; do
    for p in $(pgrep -f "$pat" || true); do
      spare=0; { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -q '^DEADPOOL_SPARE=1' && spare=1
      echo "$p $spare $(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null)" >>"$out.raw"
    done
    sleep 0.2
  done
  awk 'NF == 3 && $3 != "" {v[$1] = $2 " " $3} END {for (p in v) print p, v[p]}' "$out.raw" >"$out"
}

# run_dp DIR [ARGS] / run_ddp DIR [ARGS]: one run (RESTARTS=N: torchrun restarts the workers
# up to N times).
run_dp() {
  local d=$1; shift
  touch "$d.rss.poll"; poll_rss "$d.rss" "^$PY (-u )?${TRAIN[0]}" & local poller=$!
  local prog=("$PY" "${TRAIN[@]}")
  [ "${DPLOOP:-}" = ddp ] && prog+=(--ddp --steps "$STEPS" --seed 1 --out "$d")
  timeout -k 5 600 ./deadpool run --workers 4 --spares 1 --steps "$STEPS" --seed 1 --out "$d" "$@" \
    -- "${prog[@]}" >"$d.log" 2>&1 || { echo "deadpool run failed: $(tail -3 "$d.log")" >&2; exit 1; }
  rm -f "$d.rss.poll"; wait $poller
}
run_ddp() {
  local d=$1; shift
  touch "$d.rss.poll"; poll_rss "$d.rss" "^$PY (-u )?${TRAIN[0]}" & local poller=$!
  mkdir -p "$d"
  timeout -k 5 600 "$PY" -m torch.distributed.run --redirects 1 --tee 1 --log_dir "$d/logs" --nproc_per_node 4 \
    --max_restarts "${RESTARTS:-0}" "${TRAIN[@]}" --ddp --steps "$STEPS" --seed 1 --out "$d" "$@" >"$d.log" 2>&1 \
    || { echo "torchrun failed: $(tail -3 "$d.log")" >&2; exit 1; }
  rm -f "$d.rss.poll"; wait $poller
}
# The median step time (ms) of a run over steps 6..
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
dp_step_ms() { grep -o '"step":[0-9]*,.*"step_ms":[0-9.]*' "$1/metrics.jsonl" | awk -F'[:,]' '$2 > 5 {print $NF}' | median; }
# Seconds from the first step done to the last step done.
dp_span() { awk -F'"t":' 'NR == 1 {split($2, a, "}"); f = a[1]} {split($2, a, "}"); l = a[1]} END {print l - f}' "$1/metrics.jsonl"; }
ddp_span() { grep -o ' t=[0-9.]*' "$1.log" | awk -F= 'NR == 1 {f = $2} {l = $2} END {print l - f}'; }
ddp_step_ms() { grep -o 'step [0-9]*/[0-9]* loss [0-9.]* [0-9.]* ms' "$1.log" | awk '{split($2, s, "/"); if (s[1] > 5) print $5}' | median; }

echo "# bench/torch.sh $PAIRS $STEPS $KILL_AT (MODEL=\"${MODEL:-}\" KILLS=$KILLS DPLOOP=${DPLOOP:-}) — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo
ratios=()
echo "| pair | DeadPool ms/step | DDP ms/step | DeadPool / DDP |"
echo "|---:|---:|---:|---:|"
for ((i = 1; i <= PAIRS; i++)); do
  if ((i % 2)); then run_dp "$W/dp$i"; run_ddp "$W/ddp$i"; else run_ddp "$W/ddp$i"; run_dp "$W/dp$i"; fi
  a=$(dp_step_ms "$W/dp$i"); b=$(ddp_step_ms "$W/ddp$i"); r=$(echo "scale=4; $a / $b" | bc)
  ratios+=("$r")
  echo "| $i | $a | $b | $r |"
done
echo
echo "Median DeadPool / DDP step time over $PAIRS pairs: **$(printf '%s\n' "${ratios[@]}" | median)**"
echo
rss() { cat "$W"/$1*.rss 2>/dev/null | awk -v s="$2" '$2 == s {print $3 / 1024}' | median; }
echo "| peak RSS per process (median, MiB) | DeadPool worker | DeadPool spare | DDP worker |"
echo "|---|---:|---:|---:|"
echo "| | $(rss dp 0) | $(rss dp 1) | $(rss ddp 0) |"
echo

# Time lost to one kill -9: DeadPool's injected kill, torchrun's kill of local rank 1's process
# when rank 0 prints step KILL_AT.
[ "$KILLS" -gt 0 ] || exit 0
lost_dp=() lost_ddp=() base_dp=() base_ddp=()
for ((i = 1; i <= KILLS; i++)); do
  run_dp "$W/kb$i"; base_dp+=("$(dp_span "$W/kb$i")")
  run_dp "$W/kk$i" --inject "kill:1@$KILL_AT"; lost_dp+=("$(dp_span "$W/kk$i")")
  run_ddp "$W/tb$i" --ckpt-every 10; base_ddp+=("$(ddp_span "$W/tb$i")")
  d="$W/tk$i"
  ( for _ in $(seq 30000); do grep -q "step $KILL_AT/" "$d.log" 2>/dev/null && break; sleep 0.02; done
    for p in $(pgrep -f "train_gpt2.py.* --ddp" || true); do
      { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx 'LOCAL_RANK=1' && { kill -9 "$p"; break; }
    done ) & killer=$!
  RESTARTS=1 run_ddp "$d" --ckpt-every 10
  wait $killer || true
  lost_ddp+=("$(ddp_span "$d")")
  grep -q "resumed from" "$d.log" || { echo "torchrun did not restart from the checkpoint" >&2; exit 1; }
  grep -q '"event":"recovered"' "$W/kk$i/events.jsonl" || { echo "DeadPool did not recover" >&2; exit 1; }
done
bd=$(printf '%s\n' "${base_dp[@]}" | median); kd=$(printf '%s\n' "${lost_dp[@]}" | median)
bt=$(printf '%s\n' "${base_ddp[@]}" | median); kt=$(printf '%s\n' "${lost_ddp[@]}" | median)
ld=$(echo "$kd - $bd" | bc); lt=$(echo "$kt - $bt" | bc)
echo "| one kill -9 at step $KILL_AT (medians of $KILLS; training span: step 1 done to step $STEPS done) | without | with the kill | time lost |"
echo "|---|---:|---:|---:|"
echo "| DeadPool (hot-swap, snapshot every step) | $bd s | $kd s | **$ld s** |"
echo "| torchrun + DDP (restart, torch.save every 10 steps) | $bt s | $kt s | **$lt s** |"
echo
echo "Time lost, torchrun / DeadPool: **$(echo "scale=1; $lt / $ld" | bc)x**"
DPREC=$(grep -ho '"total_ms":[0-9.]*' "$W"/kk*/events.jsonl | cut -d: -f2 | median)
echo "DeadPool's recovery (kill to training resumed, its recovered event, median): $DPREC ms"
