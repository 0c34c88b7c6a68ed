#!/usr/bin/env bash
# resume_sweep.sh — a stop, then the `--resume` DeadPool itself advises, over a grid of ranks
# and steps (issue 47). Each case (R, A): every copy of rank R's newest state is damaged at
# step A, then R is killed; the job must stop as designed ("continue from the checkpoint of
# step N with `deadpool run --resume OUT`"), and that resume must exit 0 with the model of the
# failure-free run byte for byte. --persist-every 5 rotates checkpoints while the resumed job
# runs, and its 2 spares start at nice 19, some after the rotation: the case the sweep was
# made for (a spare that read a rotated-away checkpoint failed the job in 11 of 160).
#
# usage: tests/resume_sweep.sh [RANKS] [FROM] [TO]   every R in RANKS ("0 1 2 3") and every A in
#        FROM..TO (default: 0-3 x 10-49, 160 cases, about 20 minutes on 2 cores);
#        CASES="R:A R:A ..." instead of the grid (tests/e2e_resume.sh runs a short one).
# Prints "ok - resume_sweep R@A" or "not ok - ..." per case and a summary line.
source "$(dirname "$0")/lib_e2e.sh"
RANKS=${1:-0 1 2 3}
FROM=${2:-10}
TO=${3:-49}
# A private copy of the binary: a rebuild during a long run must not change what runs.
cp "$DP" "$WORK/deadpool" && DP="$WORK/deadpool"
COMMON=(--workers 4 --model tiny --steps 60 --seed 11 --detect-timeout-ms 500)
run_job "$WORK/ref" 300 "${COMMON[@]}" --spares 0 || { notok "resume_sweep" "the failure-free run failed: $(tail -3 "$WORK/ref.log")"; exit 1; }

cases=${CASES:-}
if [ -z "$cases" ]; then
  for r in $RANKS; do for ((a = FROM; a <= TO; a++)); do cases+="$r:$a "; done; done
fi
n=0 stopped=0 resumed=0 t0=$SECONDS
for c in $cases; do
  r=${c%:*} a=${c#*:} out="$WORK/s$r-$a" bad=""
  n=$((n + 1))
  run_job "$out" 300 "${COMMON[@]}" --spares 2 --persist-every 5 --inject "corrupt:$r@$a" --inject "kill:$r@$a"
  rc=$?
  ck=$(grep -oE 'continue from the checkpoint of step [0-9]+ with `deadpool run --resume' "$out.log" | grep -oE '[0-9]+' | head -1)
  if [ $rc -eq 0 ] || [ $rc -ge 124 ] || [ -z "$ck" ]; then
    bad="the stop: rc $rc, checkpoint '${ck}'"
  else
    stopped=$((stopped + 1))
    timeout -k 5 300 "$DP" run --resume "$out" >"$out.resume.stdout" 2>"$out.resume.log"; rc=$?
    if [ $rc -ne 0 ]; then bad="the resume from step $ck: rc $rc"
    elif ! cmp -s "$WORK/ref/model.bin" "$out/model.bin"; then bad="the resume from step $ck: model differs"
    elif grep -q 'bad job' "$out.resume.log"; then bad="the resume from step $ck: a process stopped on a bad job"
    else resumed=$((resumed + 1)); fi
  fi
  no_leftovers "$out" || bad="${bad:+$bad; }processes left behind"
  if [ -z "$bad" ]; then ok "resume_sweep $r@$a (stopped, resumed from step $ck)"
  else notok "resume_sweep $r@$a" "$bad" "$(tail -4 "$out.log")" "--- resume:" "$(tail -6 "$out.resume.log" 2>/dev/null)"; fi
  rm -rf "$out" # a long sweep keeps only the logs
done
echo "# resume_sweep: $n cases, $stopped stopped cleanly, $resumed resumed to the failure-free model; $((SECONDS - t0)) s"
