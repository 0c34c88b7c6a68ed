#!/usr/bin/env bash
# e2e_snapshot.sh — per-iteration snapshots in real jobs: they do not change the result, every
# step commits, replicas can live on spares, and the persistent tier resumes bit-identically.
source "$(dirname "$0")/lib_e2e.sh"

COMMON=(--workers 4 --spares 1 --model tiny --steps 20 --seed 11)

run_job "$WORK/dp" 240 "${COMMON[@]}" --ft deadpool; rc1=$?
run_job "$WORK/none" 240 "${COMMON[@]}" --ft none; rc2=$?
run_job "$WORK/disk" 240 "${COMMON[@]}" --ft disk --ckpt-every 5; rc3=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && cmp -s "$WORK/dp/model.bin" "$WORK/none/model.bin" \
   && cmp -s "$WORK/dp/model.bin" "$WORK/disk/model.bin"; then
  ok "ft_modes_give_identical_models"
else
  notok "ft_modes_give_identical_models" "rc $rc1 $rc2 $rc3" "$(tail -3 "$WORK/dp.log")"
fi

# Every rank committed every step; nothing failed; the metrics carry the commit front.
e="$WORK/dp/events.jsonl"; m="$WORK/dp/metrics.jsonl"
bad=""
[ "$(grep -c '"event":"snapshot_stats"' "$e")" -eq 4 ] || bad="snapshot_stats lines"
[ "$(grep '"event":"snapshot_stats"' "$e" | grep -c '"commits":20,"failures":0')" -eq 4 ] || bad="$bad; commits"
[ "$(grep -c '"committed_step":' "$m")" -eq 20 ] || bad="$bad; committed_step missing"
[ "$(grep -c '"snapshot_wait_ms":' "$m")" -eq 20 ] || bad="$bad; snapshot_wait_ms missing"
last=$(tail -1 "$m" | grep -o '"committed_step":[0-9]*' | cut -d: -f2)
[ "${last:-0}" -ge 18 ] || bad="$bad; committed_step at the end is $last (expected >= 18)"
if [ -z "$bad" ]; then ok "every_step_committed (last committed_step $last)"; else notok "every_step_committed" "$bad"; fi

# Replicas on the spares instead of the ring buddies.
run_job "$WORK/sp" 240 "${COMMON[@]}" --replica-placement spares; rc=$?
if [ $rc -eq 0 ] && cmp -s "$WORK/dp/model.bin" "$WORK/sp/model.bin" \
   && [ "$(grep '"event":"snapshot_stats"' "$WORK/sp/events.jsonl" | grep -c '"commits":20,"failures":0')" -eq 4 ]; then
  ok "replicas_on_spares"
else notok "replicas_on_spares" "rc $rc" "$(tail -3 "$WORK/sp.log")"; fi

# interrupt_then_resume NAME ARGS... — SIGINT once the checkpoint of step 40 is complete, then
# --resume; the final model must equal the uninterrupted run's byte for byte.
interrupt_then_resume() {
  local name=$1; shift
  local out="$WORK/$name"
  mkdir -p "$out"
  "$DP" run --out "$out" "$@" >"$out.stdout" 2>"$out.log" &
  local lp=$!
  for _ in $(seq 600); do [ -f "$out/ckpt/step_000000040/DONE" ] && break; kill -0 $lp 2>/dev/null || break; sleep 0.05; done
  [ -f "$out/ckpt/step_000000040/DONE" ] || echo "# waited up to 30 s for $out/ckpt/step_000000040/DONE: absent," \
    "launcher $(kill -0 $lp 2>/dev/null && echo running || echo exited) (checkpoints: $(ls "$out/ckpt" 2>/dev/null | tr '\n' ' '))" >&2
  kill -INT $lp 2>/dev/null
  for _ in $(seq 300); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
  kill -0 $lp 2>/dev/null && echo "# waited 30 s for the launcher to exit after SIGINT: still running, killed (last: '$(tail -1 "$out.log")')" >&2
  kill -9 $lp 2>/dev/null
  wait $lp; local rc1=$?
  local resumed_from
  resumed_from=$(ls "$out/ckpt" | tail -1)
  timeout -k 5 240 "$DP" run --resume "$out" >"$out.resume.stdout" 2>"$out.resume.log"; local rc2=$?
  if [ $rc1 -eq 130 ] && [ $rc2 -eq 0 ] && cmp -s "$out/model.bin" "$WORK/full/model.bin" && grep -q '"event":"resume"' "$out/events.jsonl"; then
    ok "resume_bit_identical_$name (interrupted, resumed from $resumed_from)"
  else
    notok "resume_bit_identical_$name" "rc $rc1 $rc2" "$(tail -3 "$out.resume.log")"
  fi
}
LONG=(--workers 2 --spares 0 --model tiny --steps 200 --seed 5)
run_job "$WORK/full" 300 "${LONG[@]}"; rc=$?
[ $rc -eq 0 ] || notok "uninterrupted_run" "rc $rc" "$(tail -3 "$WORK/full.log")"
interrupt_then_resume persist "${LONG[@]}" --persist-every 20
interrupt_then_resume disk "${LONG[@]}" --ft disk --ckpt-every 20

# --resume verifies every file of a checkpoint: one damaged byte in the newest rank state, or
# in the model the trainer wrote there, makes it fall back to the older intact checkpoint,
# naming the damaged file, and the resumed job still ends with the uninterrupted run's model.
corrupt_then_resume() { # NAME FILE_GLOB
  local name=$1 file=$2 ck rc
  cp -r "$WORK/persist" "$WORK/$name"
  rm -f "$WORK/$name/model.bin"
  ck=$(ls -d "$WORK/$name/ckpt"/step_* | tail -1)
  printf '\xff' | dd of="$ck/$file" bs=1 seek=5000 conv=notrunc 2>/dev/null
  timeout -k 5 120 "$DP" run --resume "$WORK/$name" >"$WORK/$name.stdout" 2>"$WORK/$name.log"; rc=$?
  if [ $rc -eq 0 ] && grep -q "$file: checksum mismatch" "$WORK/$name.log" && grep -q "using the checkpoint of step" "$WORK/$name.log" \
     && cmp -s "$WORK/full/model.bin" "$WORK/$name/model.bin"; then
    ok "${name}_falls_back_to_intact_checkpoint"
  else notok "${name}_falls_back_to_intact_checkpoint" "rc $rc" "$(tail -3 "$WORK/$name.log")"; fi
}
corrupt_then_resume corrupt_state rank_00001.state
corrupt_then_resume corrupt_model model.bin
# Every checkpoint damaged: refused, naming the file.
cp -r "$WORK/persist" "$WORK/corrupt_all"
for ck in "$WORK/corrupt_all/ckpt"/step_*; do printf '\xff' | dd of="$ck/rank_00000.state" bs=1 seek=5000 conv=notrunc 2>/dev/null; done
timeout -k 5 120 "$DP" run --resume "$WORK/corrupt_all" >"$WORK/corrupt_all.stdout" 2>"$WORK/corrupt_all.log"; rc=$?
if [ $rc -ne 0 ] && grep -q "no intact checkpoint" "$WORK/corrupt_all.log" && grep -q "rank_00000.state: checksum mismatch" "$WORK/corrupt_all.log"; then
  ok "corrupt_checkpoint_refused"
else notok "corrupt_checkpoint_refused" "rc $rc" "$(tail -3 "$WORK/corrupt_all.log")"; fi
