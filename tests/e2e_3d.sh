#!/usr/bin/env bash
# e2e_3d.sh — 3D parallelism end to end on `tiny` (4 heads, 2 layers), 4 micro-batches per
# replica and step:
#  * every layout equals the data-parallel run of the same global batch (D replicas x 4
#    micro-batches) within 1e-5 after 12 Adam steps: TP 2, PP 2, TP 2 x PP 2 with D = 1 and 2;
#  * a layout is deterministic: the same run twice gives the same bytes;
#  * hot-swap of any coordinate (layout rank = t + TP * (d + D * p)) gives the failure-free
#    run's model byte for byte: the first stage, the last stage, a tensor-parallel peer, a
#    hang, a failure during the recovery, a rank of a D = 2 layout, and a kill -9 from outside
#    while the pipeline runs (activations in flight: the whole step is rolled back).
source "$(dirname "$0")/lib_e2e.sh"

COMMON=(--model tiny --steps 12 --seed 21 --warmup 2 --grad-accum 4)

# The data-parallel references: 1 and 2 replicas.
run_job "$WORK/d1" 120 --workers 1 --spares 0 "${COMMON[@]}"; r1=$?
run_job "$WORK/d2" 120 --workers 2 --spares 0 "${COMMON[@]}"; r2=$?
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] || notok "data_parallel_references" "rc $r1 $r2" "$(tail -3 "$WORK/d1.log")"

# layout NAME WORKERS REF ARGS... — equality with the data-parallel run REF within 1e-5.
layout() {
  local name=$1 w=$2 ref=$3; shift 3
  run_job "$WORK/$name" 120 --workers "$w" --spares 0 "${COMMON[@]}" "$@"; local rc=$?
  local out; out=$("$MODELDIFF" "$WORK/$ref/model.bin" "$WORK/$name/model.bin" 1e-5 2>&1); local drc=$?
  if [ $rc -eq 0 ] && [ $drc -eq 0 ]; then ok "$name equals $ref within 1e-5 ($out)"
  else notok "$name equals $ref" "rc $rc diff rc $drc: $out" "$(tail -3 "$WORK/$name.log")"; fi
}
layout tp2_d1 2 d1 --tp 2
layout pp2_d1 2 d1 --pp 2
layout tp2pp2_d1 4 d1 --tp 2 --pp 2
layout tp2_d2 4 d2 --tp 2
layout pp2_d2 4 d2 --pp 2
layout tp2pp2_d2 8 d2 --tp 2 --pp 2

run_job "$WORK/again" 120 --workers 4 --spares 0 "${COMMON[@]}" --tp 2 --pp 2; rc=$?
if [ $rc -eq 0 ] && cmp -s "$WORK/tp2pp2_d1/model.bin" "$WORK/again/model.bin"; then ok "tp2pp2_deterministic"
else notok "tp2pp2_deterministic" "rc $rc"; fi

# Bad layouts are refused with the option named.
run_job "$WORK/bad" 60 --workers 3 --spares 0 "${COMMON[@]}" --tp 2; rc=$?
if [ $rc -ne 0 ] && grep -q -- "--tp 2 x --pp 1: expected a divisor of the 3 ranks" "$WORK/bad.log"; then ok "bad_layout_refused"
else notok "bad_layout_refused" "rc $rc" "$(tail -2 "$WORK/bad.log")"; fi

# recovered NAME REF WORKERS ARGS... — recovers at least once, the model equals REF's bytes.
recovered() {
  local name=$1 ref=$2 w=$3; shift 3
  run_job "$WORK/$name" 180 --workers "$w" "${COMMON[@]}" "$@"; local rc=$?
  local bad="" n
  n=$(grep -c '"event":"recovered"' "$WORK/$name/events.jsonl" 2>/dev/null)
  [ $rc -eq 0 ] || bad="rc $rc"
  [ "${n:-0}" -ge 1 ] || bad="$bad; no recovery"
  cmp -s "$WORK/$ref/model.bin" "$WORK/$name/model.bin" || bad="$bad; model differs from the failure-free run"
  no_leftovers "$WORK/$name" || bad="$bad; processes left behind"
  if [ -z "$bad" ]; then ok "$name ($(grep '"event":"recovered"' "$WORK/$name/events.jsonl" | grep -o '"rank":[0-9]*\|"total_ms":[0-9]*' | tr '\n' ' '))"
  else notok "$name" "$bad" "$(tail -5 "$WORK/$name.log")"; fi
}
# tp 2 x pp 2, D = 1: ranks 0 (stage 0, slice 0), 1 (stage 0, slice 1), 2 and 3 (stage 1)
TP2PP2=(--tp 2 --pp 2)
recovered kill_first_stage tp2pp2_d1 4 "${TP2PP2[@]}" --spares 1 --inject kill:0@6
recovered kill_last_stage tp2pp2_d1 4 "${TP2PP2[@]}" --spares 1 --inject kill:2@7
recovered kill_tp_peer tp2pp2_d1 4 "${TP2PP2[@]}" --spares 1 --inject kill:1@5
recovered hang_last_stage tp2pp2_d1 4 "${TP2PP2[@]}" --spares 1 --inject stop:3@6 --detect-timeout-ms 1000
recovered failure_during_recovery tp2pp2_d1 4 "${TP2PP2[@]}" --spares 2 --inject kill:2@6 --inject rkill:2@1
# D = 2: rank 5 is (d 0, stage 1, slice 1); its parameters come from its data-parallel peer
recovered kill_d2 tp2pp2_d2 8 "${TP2PP2[@]}" --spares 1 --inject kill:5@6
recovered kill_pp2 pp2_d1 2 --pp 2 --spares 1 --inject kill:1@6
recovered kill_tp2 tp2_d1 2 --tp 2 --spares 1 --inject kill:0@6

# kill -9 from outside, mid-run: a step of tiny is mostly its pipeline, so the kill lands with
# activations in flight; the reference is the same run without it.
LONG=(--workers 4 --model tiny --steps 150 --seed 21 --warmup 2 --grad-accum 4 "${TP2PP2[@]}")
run_job "$WORK/long_ref" 180 "${LONG[@]}" --spares 0; rc=$?
mkdir -p "$WORK/outside"
timeout -k 5 180 "$DP" run --out "$WORK/outside" "${LONG[@]}" --spares 1 >"$WORK/outside.stdout" 2>"$WORK/outside.log" &
lp=$!
for _ in $(seq 600); do [ "$(count_lines "$WORK/outside/metrics.jsonl")" -ge 40 ] && break; sleep 0.05; done
[ "$(count_lines "$WORK/outside/metrics.jsonl")" -ge 40 ] \
  || echo "# waited 30 s for 40 steps in $WORK/outside/metrics.jsonl: saw $(count_lines "$WORK/outside/metrics.jsonl")" >&2
victim=$(grep '"event":"rank_joined"' "$WORK/outside/events.jsonl" 2>/dev/null | grep '"rank":2,' | grep -o '"pid":[0-9]*' | head -1 | cut -d: -f2)
[ -n "$victim" ] && grep -qa deadpool "/proc/$victim/cmdline" 2>/dev/null && kill -9 "$victim"
wait $lp; rc2=$?
n=$(grep -c '"event":"recovered"' "$WORK/outside/events.jsonl" 2>/dev/null)
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ "${n:-0}" -ge 1 ] && cmp -s "$WORK/long_ref/model.bin" "$WORK/outside/model.bin" &&
   no_leftovers "$WORK/outside"; then
  ok "kill_outside_mid_pipeline (rank 2, pid ${victim:-?}: $(grep '"event":"recovered"' "$WORK/outside/events.jsonl" | grep -o '"rollback_step":[0-9]*\|"total_ms":[0-9]*' | tr '\n' ' '))"
else
  notok "kill_outside_mid_pipeline" "rc $rc $rc2, $n recoveries, victim ${victim:-none}" "$(tail -4 "$WORK/outside.log")"
fi

# A 3D job interrupted (SIGINT) after its checkpoint of step 40 and resumed with --resume: the
# checkpoint's states are shards of parts, its model.bin the whole model assembled from them;
# the final model equals the uninterrupted run's (and the newest checkpoint's model.bin is a model of the
# same shape, within 1 of the final one: it is 30 steps older).
out="$WORK/resume"; mkdir -p "$out"
"$DP" run --out "$out" "${LONG[@]}" --spares 0 --persist-every 40 >"$out.stdout" 2>"$out.log" &
lp=$!
for _ in $(seq 600); do [ -f "$out/ckpt/step_000000040/DONE" ] && break; kill -0 $lp 2>/dev/null || break; sleep 0.05; done
[ -f "$out/ckpt/step_000000040/DONE" ] || echo "# waited up to 30 s for $out/ckpt/step_000000040/DONE: absent," \
  "launcher $(kill -0 $lp 2>/dev/null && echo running || echo exited) (checkpoints: $(ls "$out/ckpt" 2>/dev/null | tr '\n' ' '))" >&2
kill -INT $lp 2>/dev/null
for _ in $(seq 300); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
kill -0 $lp 2>/dev/null && echo "# waited 30 s for the launcher to exit after SIGINT: still running, killed (last: '$(tail -1 "$out.log")')" >&2
kill -9 $lp 2>/dev/null
wait $lp; rc1=$?
ck=$(ls "$out/ckpt" 2>/dev/null | tail -1)
timeout -k 5 240 "$DP" run --resume "$out" >"$out.resume.stdout" 2>"$out.resume.log"; rc2=$?
last=$(ls "$out/ckpt" 2>/dev/null | tail -1)
if [ $rc1 -eq 130 ] && [ $rc2 -eq 0 ] && cmp -s "$out/model.bin" "$WORK/long_ref/model.bin" &&
   "$MODELDIFF" "$out/ckpt/$last/model.bin" "$WORK/long_ref/model.bin" 1 >/dev/null 2>&1; then
  ok "resume_3d_bit_identical (interrupted, resumed from $ck)"
else
  notok "resume_3d_bit_identical" "rc $rc1 $rc2, checkpoint ${ck:-none}" "$(tail -3 "$out.resume.log")"
fi
