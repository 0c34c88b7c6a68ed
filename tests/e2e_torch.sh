#!/usr/bin/env bash
# e2e_torch.sh — a PyTorch loop under DeadPool (examples/torch/train_gpt2.py through
# python/deadpool): every fault-tolerance path ends with the failure-free model.pt, byte for
# byte, with a `recovered` event for each failure. Plain data parallelism (every rank holds
# the same state) and ZeRO-1 (each rank owns a slice).
source "$(dirname "$0")/lib_e2e.sh"
PY=/usr/bin/python3
TRAIN=("$PY" "$ROOT/examples/torch/train_gpt2.py")
if ! "$PY" -c 'import torch' 2>/dev/null; then
  for c in torch_deterministic torch_kill torch_hang torch_failure_during_recovery torch_two_faults torch_two_at_once_1_and_2 torch_two_at_once_0_and_2 \
           torch_no_spare_persist_then_resume torch_ctrl_c_keeps_the_work torch_ft_disk torch_zero1_equals_plain torch_zero1_kill \
           torch_buckets_run torch_buckets_kill torch_buckets_two_faults torch_buckets_zero1_kill torch_ddp_deterministic torch_ddp_kill \
           torch_ddp_kill_rank0 torch_ddp_hang torch_ddp_failure_during_recovery torch_ddp_two_faults torch_ddp_no_spare_persist_then_resume \
           torch_ddp_ctrl_c_then_resume torch_cnn_ddp_under_deadpool torch_machine_crash; do echo "not ok - $c (no torch for $PY: scripts/install-deps.sh --test)"; done
  exit 1
fi
STEPS=24
BASE=(--workers 3 --steps "$STEPS" --seed 5)

run_job "$WORK/ref" 180 "${BASE[@]}" --spares 0 -- "${TRAIN[@]}"; rc=$?
run_job "$WORK/ref2" 180 "${BASE[@]}" --spares 1 -- "${TRAIN[@]}"; rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ -s "$WORK/ref/model.pt" ] && cmp -s "$WORK/ref/model.pt" "$WORK/ref2/model.pt" \
   && grep -q '"event":"model_saved"' "$WORK/ref/events.jsonl"; then
  ok "torch_deterministic"
else notok "torch_deterministic" "rc $rc $rc2" "$(tail -3 "$WORK/ref.log")"; fi

# expect_same NAME REF MIN_RECOVERED ARGS... — a run that must end with REF's model.pt.
E2E_MODEL=model.pt RUN_LIMIT=240
expect_same() { local name=$1 ref=$2 n=$3; shift 3; expect_like "$ref" "$name" "$n" "${BASE[@]}" "$@"; }

expect_same torch_kill ref 1 --spares 1 --inject kill:1@8 -- "${TRAIN[@]}"
expect_same torch_hang ref 1 --spares 1 --detect-timeout-ms 1000 --inject stop:2@9 -- "${TRAIN[@]}"
expect_same torch_failure_during_recovery ref 1 --spares 1 --detect-timeout-ms 1000 \
  --inject kill:0@10 --inject rkill:0@3 -- "${TRAIN[@]}"
expect_same torch_two_faults ref 2 --spares 1 --inject kill:2@6 --inject kill:1@15 -- "${TRAIN[@]}"
# Two ranks at once with plain data parallelism: ranks without state of their own (everything
# is DP_IDENTICAL, no extra) lose nothing; rank 0 with its holder is covered by the survivor.
expect_same torch_two_at_once_1_and_2 ref 1 --spares 2 --inject kill:1@10 --inject kill:2@10 -- "${TRAIN[@]}"
expect_same torch_two_at_once_0_and_2 ref 1 --spares 2 --inject kill:0@10 --inject kill:2@10 -- "${TRAIN[@]}"
expect_same torch_ft_disk ref 1 --spares 0 --ft disk --ckpt-every 5 --inject kill:1@12 -- "${TRAIN[@]}"

# No spare left: the committed state goes to disk (with the checkpoint callback's model.pt),
# the job stops telling how to resume, and the resumed job ends with the same model.
run_job "$WORK/nospare" 180 "${BASE[@]}" --spares 0 --respawn-spares 0 --spare-wait 1 --inject kill:1@12 \
  -- "${TRAIN[@]}"; rc=$?
timeout -k 5 180 "$DP" run --resume "$WORK/nospare" -- "${TRAIN[@]}" >"$WORK/nospare.resume.stdout" 2>"$WORK/nospare.resume.log"; rc2=$?
ck=$(ls -d "$WORK"/nospare/ckpt/step_*/ 2>/dev/null | tail -1)
if [ $rc -ne 0 ] && grep -q 'deadpool run --resume' "$WORK/nospare.log" && [ $rc2 -eq 0 ] \
   && cmp -s "$WORK/ref/model.pt" "$WORK/nospare/model.pt" && [ -s "${ck}model.pt" ] && no_leftovers "$WORK/nospare"; then
  ok "torch_no_spare_persist_then_resume"
else notok "torch_no_spare_persist_then_resume" "rc $rc $rc2; checkpoint ${ck:-none}" "$(tail -3 "$WORK/nospare.log")" \
  "$(tail -3 "$WORK/nospare.resume.log")"; fi

# Ctrl-C keeps the work (no --persist-every): the newest step every rank committed is written
# before the job stops, and --resume ends with the failure-free model.
mkdir -p "$WORK/sigint"
timeout -k 30 180 "$DP" run --out "$WORK/sigint" "${BASE[@]}" --spares 1 -- "${TRAIN[@]}" >"$WORK/sigint.stdout" 2>"$WORK/sigint.log" &
pid=$!
for _ in $(seq 1200); do grep -qE "^step +6/" "$WORK/sigint.stdout" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
grep -qE "^step +6/" "$WORK/sigint.stdout" 2>/dev/null || echo "# waited up to 120 s for step 6 in $WORK/sigint.stdout: not seen," \
  "job $(kill -0 $pid 2>/dev/null && echo running || echo exited) (last: '$(tail -1 "$WORK/sigint.stdout" 2>/dev/null)')" >&2
# To the launcher itself: timeout would relay the signal to its process group as well, a second Ctrl-C.
kill -INT "$(pgrep -P $pid | head -1)" 2>/dev/null; wait $pid; rc=$?
timeout -k 5 180 "$DP" run --resume "$WORK/sigint" -- "${TRAIN[@]}" >"$WORK/sigint.resume.stdout" 2>"$WORK/sigint.resume.log"; rc2=$?
if [ $rc -eq 130 ] && grep -q '"event":"kept_on_stop"' "$WORK/sigint/events.jsonl" && [ $rc2 -eq 0 ] \
   && cmp -s "$WORK/ref/model.pt" "$WORK/sigint/model.pt" && no_leftovers "$WORK/sigint"; then
  ok "torch_ctrl_c_keeps_the_work ($(grep -o 'writing step [0-9]*' "$WORK/sigint.log"))"
else notok "torch_ctrl_c_keeps_the_work" "rc $rc $rc2; kept $(grep -c kept_on_stop "$WORK/sigint/events.jsonl");" \
  "$(cmp "$WORK/ref/model.pt" "$WORK/sigint/model.pt" 2>&1); $(no_leftovers "$WORK/sigint" || echo left)" \
  "$(tail -3 "$WORK/sigint.log")" "$(tail -3 "$WORK/sigint.resume.log")"; fi

# ZeRO-1: the same parameters as plain data parallelism (values: the file's storage layout
# differs), and a kill of a rank that owns a slice, then of another, ends byte-identical.
run_job "$WORK/zref" 180 "${BASE[@]}" --spares 0 -- "${TRAIN[@]}" --zero; rc=$?
same=$("$PY" -c '
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
print("same" if a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) else "differ")' \
  "$WORK/ref/model.pt" "$WORK/zref/model.pt" 2>&1)
if [ $rc -eq 0 ] && [ "$same" = same ]; then ok "torch_zero1_equals_plain"
else notok "torch_zero1_equals_plain" "rc $rc: $same" "$(tail -3 "$WORK/zref.log")"; fi
expect_same torch_zero1_kill zref 2 --spares 1 --inject kill:0@7 --inject kill:2@14 -- "${TRAIN[@]}" --zero

# Overlap: 50 kB buckets (13 of them) started from backward hooks, so that a kill finds
# requests in flight and queued; plain and ZeRO-1 end byte-identical to their own
# failure-free runs (another bucket layout is another sum order, so not to ref's).
run_job "$WORK/bref" 180 "${BASE[@]}" --spares 0 -- "${TRAIN[@]}" --bucket-mb 0.05; rc=$?
if [ $rc -eq 0 ] && [ -s "$WORK/bref/model.pt" ]; then ok "torch_buckets_run"
else notok "torch_buckets_run" "rc $rc" "$(tail -3 "$WORK/bref.log")"; fi
expect_same torch_buckets_kill bref 1 --spares 1 --inject kill:1@8 -- "${TRAIN[@]}" --bucket-mb 0.05
expect_same torch_buckets_two_faults bref 2 --spares 1 --inject kill:2@6 --inject kill:0@15 -- "${TRAIN[@]}" --bucket-mb 0.05
run_job "$WORK/bzref" 180 "${BASE[@]}" --spares 0 -- "${TRAIN[@]}" --bucket-mb 0.05 --zero; rc=$?
expect_same torch_buckets_zero1_kill bzref 1 --spares 1 --inject kill:1@9 -- "${TRAIN[@]}" --bucket-mb 0.05 --zero

# The DDP program (train_gpt2.py --ddp) over the `deadpool` torch.distributed backend:
# DistributedDataParallel's own buckets over DeadPool's collectives; every fault path ends with
# its failure-free model.pt. The program writes model.pt into --out: the job's out directory.
# A model of 1.7 MB in 100 kB buckets: DDP's first bucket is 1 MB, so the 0.12M default would
# be one bucket, and a spare whose buckets differed from the survivors' would go unseen.
DSTEPS=16 DARGS=(--ddp --steps 16 --n-embd 128 --bucket-mb 0.1)
DDP_RUN() { local out=$1; shift; run_job "$out" 180 --workers 3 --steps $DSTEPS "$@" -- "${TRAIN[@]}" "${DARGS[@]}" --out "$out"; }
expect_ddp() {  # NAME MIN_RECOVERED ARGS...: as expect_like, against dref
  local name=$1 n=$2; shift 2
  DDP_RUN "$WORK/$name" "$@"; local rc=$? bad=""
  local got; got=$(grep -c '"event":"recovered"' "$WORK/$name/events.jsonl" 2>/dev/null)
  [ $rc -eq 0 ] || bad="rc $rc"
  [ "${got:-0}" -ge "$n" ] || bad="$bad; $got recovered events, expected >= $n"
  cmp -s "$WORK/dref/model.pt" "$WORK/$name/model.pt" || bad="$bad; model.pt differs from the failure-free run"
  no_leftovers "$WORK/$name" || bad="$bad; processes left behind"
  if [ -z "$bad" ]; then ok "$name ($got recovered)"; else notok "$name" "$bad" "$(tail -5 "$WORK/$name.log")"; fi
}
DDP_RUN "$WORK/dref" --spares 0; rc=$?
DDP_RUN "$WORK/dref2" --spares 2; rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ -s "$WORK/dref/model.pt" ] && cmp -s "$WORK/dref/model.pt" "$WORK/dref2/model.pt"; then
  ok "torch_ddp_deterministic"
else notok "torch_ddp_deterministic" "rc $rc $rc2" "$(tail -3 "$WORK/dref.log")" "$(tail -3 "$WORK/dref2.log")"; fi
expect_ddp torch_ddp_kill 1 --spares 1 --inject kill:1@6
expect_ddp torch_ddp_kill_rank0 1 --spares 1 --inject kill:0@9
expect_ddp torch_ddp_hang 1 --spares 1 --detect-timeout-ms 1000 --inject stop:2@7
expect_ddp torch_ddp_failure_during_recovery 1 --spares 1 --detect-timeout-ms 1000 --inject kill:0@8 --inject rkill:0@3
expect_ddp torch_ddp_two_faults 2 --spares 1 --inject kill:2@4 --inject kill:1@11

# No spare: the state goes to disk, the job stops saying how to resume; the resumed DDP
# program ends with the failure-free model.
DDP_RUN "$WORK/dnospare" --spares 0 --respawn-spares 0 --spare-wait 1 --inject kill:1@9; rc=$?
timeout -k 5 180 "$DP" run --resume "$WORK/dnospare" -- "${TRAIN[@]}" "${DARGS[@]}" --out "$WORK/dnospare" \
  >"$WORK/dnospare.resume.stdout" 2>"$WORK/dnospare.resume.log"; rc2=$?
if [ $rc -ne 0 ] && grep -q 'deadpool run --resume' "$WORK/dnospare.log" && [ $rc2 -eq 0 ] \
   && cmp -s "$WORK/dref/model.pt" "$WORK/dnospare/model.pt" && no_leftovers "$WORK/dnospare"; then
  ok "torch_ddp_no_spare_persist_then_resume"
else notok "torch_ddp_no_spare_persist_then_resume" "rc $rc $rc2" "$(tail -3 "$WORK/dnospare.log")" \
  "$(tail -3 "$WORK/dnospare.resume.log")"; fi

# Ctrl-C, then --resume.
mkdir -p "$WORK/dsigint"
timeout -k 30 180 "$DP" run --out "$WORK/dsigint" --workers 3 --steps $DSTEPS --spares 1 \
  -- "${TRAIN[@]}" "${DARGS[@]}" --out "$WORK/dsigint" >"$WORK/dsigint.stdout" 2>"$WORK/dsigint.log" &
pid=$!
for _ in $(seq 1200); do grep -qE "^step +5/" "$WORK/dsigint.stdout" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
grep -qE "^step +5/" "$WORK/dsigint.stdout" 2>/dev/null || echo "# waited up to 120 s for step 5 in $WORK/dsigint.stdout: not seen," \
  "job $(kill -0 $pid 2>/dev/null && echo running || echo exited) (last: '$(tail -1 "$WORK/dsigint.stdout" 2>/dev/null)')" >&2
kill -INT "$(pgrep -P $pid | head -1)" 2>/dev/null; wait $pid; rc=$?
timeout -k 5 180 "$DP" run --resume "$WORK/dsigint" -- "${TRAIN[@]}" "${DARGS[@]}" --out "$WORK/dsigint" \
  >"$WORK/dsigint.resume.stdout" 2>"$WORK/dsigint.resume.log"; rc2=$?
if [ $rc -eq 130 ] && grep -q '"event":"kept_on_stop"' "$WORK/dsigint/events.jsonl" && [ $rc2 -eq 0 ] \
   && cmp -s "$WORK/dref/model.pt" "$WORK/dsigint/model.pt" && no_leftovers "$WORK/dsigint"; then
  ok "torch_ddp_ctrl_c_then_resume ($(grep -o 'writing step [0-9]*' "$WORK/dsigint.log"))"
else notok "torch_ddp_ctrl_c_then_resume" "rc $rc $rc2; kept $(grep -c kept_on_stop "$WORK/dsigint/events.jsonl")" \
  "$(tail -3 "$WORK/dsigint.log")" "$(tail -3 "$WORK/dsigint.resume.log")"; fi

# cnn_ddp.py put under DeadPool by examples/torch/cnn_ddp_deadpool.patch: at most 8 lines
# changed or added (the patch docs/PYTORCH.md shows), and a kill ends with the failure-free cnn.pt.
CNN_PATCH="$ROOT/examples/torch/cnn_ddp_deadpool.patch"
code=$(grep -c '^+[^+]' "$CNN_PATCH")
patch -s -o "$WORK/cnn_ddp_deadpool.py" "$ROOT/examples/torch/cnn_ddp.py" "$CNN_PATCH"; prc=$?
CNN=("$PY" "$WORK/cnn_ddp_deadpool.py" --steps 20)
run_job "$WORK/cref" 180 --workers 3 --steps 20 --spares 0 -- "${CNN[@]}" --out "$WORK/cref"; rc=$?
run_job "$WORK/ckill" 180 --workers 3 --steps 20 --spares 1 --inject kill:2@7 -- "${CNN[@]}" --out "$WORK/ckill"; rc2=$?
if [ $prc -eq 0 ] && [ "$code" -le 8 ] && [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ -s "$WORK/cref/cnn.pt" ] \
   && cmp -s "$WORK/cref/cnn.pt" "$WORK/ckill/cnn.pt" && grep -q '"event":"recovered"' "$WORK/ckill/events.jsonl"; then
  ok "torch_cnn_ddp_under_deadpool ($code lines changed or added)"
else notok "torch_cnn_ddp_under_deadpool" "patch rc $prc; rc $rc $rc2; $code lines changed" "$(tail -3 "$WORK/ckill.log")"; fi

# A machine lost: 2 simulated machines x 2 ranks and a spare machine (tests/lib_hosts.sh);
# machine 1 crashes with everything on it, the spare machine takes both ranks.
source "$(dirname "$0")/lib_hosts.sh"
if ! hosts_available; then
  echo "ok - torch_machine_crash # SKIP no network namespaces (needs root)"
  exit 0
fi
MACHINES_STEPS=60 MACHINES_MODEL_FILE=model.pt MACHINES_PROGRAM=("${TRAIN[@]}")
source "$(dirname "$0")/lib_machines.sh"
J=tm1; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
if wait_step $J 1 10; then host_kill 2; fi
finish 1 3
host_wait "${LAUNCHER[2]}" 5 >/dev/null
host_restart 2
rec=$(events $J | grep -o '"total_ms":[0-9]*' | head -1)
if same "${HOST_DISK[1]}/$J/model.pt" && [ "$RCS" = " 0 0" ] && [ "$(events $J | grep -c '"event":"recovered"')" -ge 1 ] && clean; then
  ok "torch_machine_crash ($rec)"
else notok "torch_machine_crash" "rcs:$RCS" "$(events $J | grep -E 'failure|decision|recovered')" "$(tail -5 "$WORK/$J.h1.log")"; fi
hosts_destroy >/dev/null || notok "hosts_destroy" "something was left"
