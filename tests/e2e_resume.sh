#!/usr/bin/env bash
# e2e_resume.sh — a process started during a job reads only what the job keeps, and a spare
# never fails a job (issue 47):
# - resume_late_spare_reads_what_the_job_keeps: a job started from a model file stops (its
#   rank's every copy damaged, then killed); the file is gone afterwards (the checkpoint
#   carries its own model.bin). The resume rotates checkpoints (--persist-every 5) past the
#   one it resumed from, and a kill after that has the launcher start a new spare, which
#   reads its model in the resumed checkpoint; a second kill needs that spare. Exit 0, the
#   failure-free model, and the resumed checkpoint still on disk at the end.
# - spare_that_cannot_start_fails_nobody: the model file goes away while a job runs (after
#   its spare started); then a rank is killed. The spare takes the rank; its replacement
#   cannot read the model: it is reported (log, events.jsonl, progress line) and the job
#   goes on to exit 0 with the failure-free model.
# - resume_sweep_short: tests/resume_sweep.sh on 4 of its 160 cases (the 11 that failed
#   before included).
source "$(dirname "$0")/lib_e2e.sh"
COMMON=(--workers 4 --seed 11 --detect-timeout-ms 500)

# A model file of our own: the tiny preset after 3 steps.
run_job "$WORK/init" 120 --workers 1 --model tiny --steps 3 --seed 5 || { notok "model_file" "$(tail -3 "$WORK/init.log")"; exit 1; }
cp "$WORK/init/model.bin" "$WORK/init.bin"
run_job "$WORK/ref" 180 "${COMMON[@]}" --steps 40 --model "$WORK/init.bin" --spares 0 || { notok "reference_run" "$(tail -3 "$WORK/ref.log")"; exit 1; }

# 1. The late spare of a resumed job.
out="$WORK/late" bad=""
run_job "$out" 180 "${COMMON[@]}" --steps 40 --model "$WORK/init.bin" --spares 1 --persist-every 5 --inject corrupt:1@12 --inject kill:1@12
rc=$?
grep -q 'continue from the checkpoint of step 10 with `deadpool run --resume' "$out.log" || bad="the first run did not stop at step 10's checkpoint (rc $rc)"
mv "$WORK/init.bin" "$WORK/init.bin.moved" # the user's file is gone: the job keeps what it needs
timeout -k 5 180 "$DP" run --resume "$out" --inject kill:1@27 --inject kill:2@33 >"$out.resume.stdout" 2>"$out.resume.log"; rc=$?
mv "$WORK/init.bin.moved" "$WORK/init.bin"
[ $rc -eq 0 ] || bad="${bad:+$bad; }the resume exited $rc"
cmp -s "$WORK/ref/model.bin" "$out/model.bin" || bad="${bad:+$bad; }the model differs from the failure-free run"
# the spare started after the first kill (step 27: step 10 is rotated out at step 20) took the second rank
grep -qE 'epoch 2: spare [0-9]+ takes rank 2' "$out.resume.log" || bad="${bad:+$bad; }no spare took rank 2 in epoch 2"
[ -f "$out/ckpt/step_000000010/DONE" ] || bad="${bad:+$bad; }the resumed checkpoint (step 10) was rotated away"
grep -q 'bad job\|could not start' "$out.resume.log" && bad="${bad:+$bad; }a process could not start"
no_leftovers "$out" || bad="${bad:+$bad; }processes left behind"
if [ -z "$bad" ]; then ok "resume_late_spare_reads_what_the_job_keeps (resumed from step 10, rotated to $(ls "$out/ckpt" | tr '\n' ' '| sed 's/ $//'))"
else notok "resume_late_spare_reads_what_the_job_keeps" "$bad" "$(grep -v '^step' "$out.resume.log" | tail -12)"; fi

# 2. A spare that cannot start, while the job runs (long enough to kill a rank mid-run).
run_job "$WORK/ref2" 300 "${COMMON[@]}" --steps 300 --model "$WORK/init.bin" --spares 0 || { notok "reference_run_2" "$(tail -3 "$WORK/ref2.log")"; exit 1; }
out="$WORK/spare" bad=""
cp "$WORK/init.bin" "$WORK/init2.bin"
mkdir -p "$out"
timeout -k 5 300 "$DP" run --out "$out" "${COMMON[@]}" --steps 300 --model "$WORK/init2.bin" --spares 1 >"$out.stdout" 2>"$out.log" &
job=$!
# the spare is up (the progress line counts it) and rank 1's pid is known
pid1="" end=$((SECONDS + 60))
while [ $SECONDS -lt $end ] && kill -0 $job 2>/dev/null; do
  pid1=$(grep -o '"event":"rank_joined"[^}]*"rank":1,[^}]*' "$out/events.jsonl" 2>/dev/null | grep -o '"pid":[0-9]*' | cut -d: -f2 | head -1)
  [ -n "$pid1" ] && grep -q '| spares 1 |' "$out.stdout" && break
  sleep 0.05
done
at=$(grep -oE '^step +[0-9]+' "$out.stdout" | tail -1 | grep -oE '[0-9]+')
if [ -n "$pid1" ] && grep -q '| spares 1 |' "$out.stdout"; then
  rm "$WORK/init2.bin" # a model file removed mid-run: only a process that starts now reads it
  kill -9 "$pid1"
else bad="the spare or rank 1 never showed up (pid '$pid1')"; fi
wait $job; rc=$?
[ $rc -eq 0 ] || bad="${bad:+$bad; }the job exited $rc"
cmp -s "$WORK/ref2/model.bin" "$out/model.bin" || bad="${bad:+$bad; }the model differs from the failure-free run"
grep -q 'spare process [0-9]* could not start' "$out.log" || bad="${bad:+$bad; }no spare was reported as unable to start"
grep -q '"event":"spare_failed"' "$out/events.jsonl" || bad="${bad:+$bad; }no spare_failed event"
grep -q 'spares 0 (1 failed)' "$out.stdout" || bad="${bad:+$bad; }the progress line does not show the failed spare"
grep -q '"event":"recovered"' "$out/events.jsonl" || bad="${bad:+$bad; }the kill was not recovered"
no_leftovers "$out" || bad="${bad:+$bad; }processes left behind"
if [ -z "$bad" ]; then ok "spare_that_cannot_start_fails_nobody (rank 1 killed after step ${at:-?}, the replacement spare reported)"
else notok "spare_that_cannot_start_fails_nobody" "$bad" "$(grep -v '^step' "$out.log" | tail -10)"; fi

# 3. The sweep, short: 4 of its cases, among those that failed before.
CASES="0:11 1:15 3:25 1:32" bash "$(dirname "$0")/resume_sweep.sh" | grep -v '^#'
