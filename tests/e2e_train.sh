#!/usr/bin/env bash
# e2e_train.sh — `deadpool run` end to end: outputs, determinism (1 and 4 workers), 4 workers
# == 1 worker with 4-way gradient accumulation, loss falls, clean Ctrl-C, bad input.
source "$(dirname "$0")/lib_e2e.sh"

COMMON=(--model tiny --steps 20 --seed 7 --warmup 2)

# 1 worker, twice: byte-identical model.bin
run_job "$WORK/w1a" 120 --workers 1 --spares 0 "${COMMON[@]}"; rc1=$?
run_job "$WORK/w1b" 120 --workers 1 --spares 0 "${COMMON[@]}"; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$WORK/w1a/model.bin" "$WORK/w1b/model.bin"; then
  ok "deterministic_1_worker"
else
  notok "deterministic_1_worker" "rc $rc1 $rc2" "$(tail -3 "$WORK/w1a.log")"
fi

# 4 workers + 1 spare, twice: byte-identical model.bin
run_job "$WORK/w4a" 240 --workers 4 --spares 1 "${COMMON[@]}"; rc1=$?
run_job "$WORK/w4b" 240 --workers 4 --spares 1 "${COMMON[@]}"; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$WORK/w4a/model.bin" "$WORK/w4b/model.bin"; then
  ok "deterministic_4_workers"
else
  notok "deterministic_4_workers" "rc $rc1 $rc2" "$(tail -3 "$WORK/w4a.log")"
fi

# Outputs of a finished job: one metric per step with the required keys; the job's events.
m="$WORK/w4a/metrics.jsonl"; e="$WORK/w4a/events.jsonl"
bad=""
[ "$(count_lines "$m")" -eq 20 ] || bad="metrics lines $(count_lines "$m")"
for k in step loss step_ms tokens_per_s epoch; do
  [ "$(grep -c "\"$k\":" "$m")" -eq 20 ] || bad="$bad; key $k missing"
done
for ev in start rank_joined spare_joined model_saved finish; do
  grep -q "\"event\":\"$ev\"" "$e" || bad="$bad; event $ev missing"
done
[ "$(grep -c '"event":"rank_joined"' "$e")" -eq 4 ] || bad="$bad; rank_joined count"
grep -q '"status":"done"' "$e" || bad="$bad; finish status"
grep -q '"t":' "$e" || bad="$bad; no t"
grep -qE '^step +20/20 \| loss' "$WORK/w4a.stdout" || bad="$bad; no progress line"
if [ -z "$bad" ]; then ok "outputs_metrics_and_events"; else notok "outputs_metrics_and_events" "$bad"; fi

# The job's secret never shows in its output.
if grep -qiE '[0-9a-f]{64}' "$WORK/w4a.log" "$WORK/w4a.stdout" "$WORK/w4a/events.jsonl"; then
  notok "secret_not_logged" "a 64-hex string appears in the logs"
else
  ok "secret_not_logged"
fi

if no_leftovers "$WORK/w4a" && no_leftovers "$WORK/w1a"; then ok "no_leftover_processes"; else notok "no_leftover_processes"; fi

# 4 workers x 1 micro-batch == 1 worker x 4 accumulated micro-batches (same micro-batches;
# only the order of the fp32 gradient sums differs). Tolerance 2e-5 absolute on parameters
# of size ~0.02-1 after 20 Adam steps of lr 1e-3.
run_job "$WORK/acc" 120 --workers 1 --spares 0 --grad-accum 4 "${COMMON[@]}"; rc=$?
out=$("$MODELDIFF" "$WORK/w4a/model.bin" "$WORK/acc/model.bin" 2e-5 2>&1); drc=$?
if [ $rc -eq 0 ] && [ $drc -eq 0 ]; then ok "4_workers_equal_1_worker_accum_4 ($out)"; else notok "4_workers_equal_1_worker_accum_4" "rc $rc" "$out"; fi

# Loss falls on tinyshakespeare (or the built-in corpus when ../shared is absent).
DATA=(); [ -f "$SHAKESPEARE" ] && DATA=(--data "$SHAKESPEARE")
run_job "$WORK/loss" 180 --workers 2 --spares 0 --model tiny --steps 150 --lr 3e-3 --warmup 10 "${DATA[@]}"; rc=$?
first=$(head -1 "$WORK/loss/metrics.jsonl" | grep -o '"loss":[0-9.]*' | cut -d: -f2)
last=$(tail -10 "$WORK/loss/metrics.jsonl" | grep -o '"loss":[0-9.]*' | cut -d: -f2 | awk '{s+=$1} END {print s/NR}')
if [ $rc -eq 0 ] && awk -v f="$first" -v l="$last" 'BEGIN {exit !(f > 5.0 && l < 3.0)}'; then
  ok "loss_falls (first $first, mean of last 10: $last)"
else
  notok "loss_falls" "rc $rc first $first last $last"
fi

# Ctrl-C (SIGINT to the launcher) stops the whole job: exit 130, nothing left behind.
mkdir -p "$WORK/int"
"$DP" run --out "$WORK/int" --workers 2 --spares 1 --model tiny --steps 100000 >"$WORK/int.stdout" 2>"$WORK/int.log" &
lp=$!
for _ in $(seq 200); do [ "$(count_lines "$WORK/int/metrics.jsonl")" -ge 3 ] && break; sleep 0.1; done
[ "$(count_lines "$WORK/int/metrics.jsonl")" -ge 3 ] \
  || echo "# waited 20 s for 3 steps in $WORK/int/metrics.jsonl: saw $(count_lines "$WORK/int/metrics.jsonl") (last: '$(tail -1 "$WORK/int.log")')" >&2
kill -INT $lp
for _ in $(seq 300); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
if kill -0 $lp 2>/dev/null; then kill -9 $lp; notok "ctrl_c_stops_job" "launcher still running after 30 s"
else
  wait $lp; rc=$?
  sleep 0.2
  if [ $rc -eq 130 ] && no_leftovers "$WORK/int"; then ok "ctrl_c_stops_job"; else notok "ctrl_c_stops_job" "rc $rc" "$(tail -3 "$WORK/int.log")"; fi
fi

# Bad input: clear errors, non-zero exit, nothing left behind.
run_job "$WORK/bad1" 60 --workers 2 --spares 0 --model /nonexistent/model.bin --steps 2; rc=$?
if [ $rc -ne 0 ] && grep -q '/nonexistent/model.bin: cannot open' "$WORK/bad1.log" && no_leftovers "$WORK/bad1"; then
  ok "bad_model_file_reported"
else notok "bad_model_file_reported" "rc $rc" "$(tail -3 "$WORK/bad1.log")"; fi
"$DP" run --steps abc >"$WORK/bad2.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--steps: expected an integer" "$WORK/bad2.out"; then ok "bad_option_reported"; else notok "bad_option_reported" "rc $rc $(cat "$WORK/bad2.out")"; fi
printf 'x' >"$WORK/tiny.txt"
run_job "$WORK/bad3" 60 --workers 1 --spares 0 --data "$WORK/tiny.txt" --steps 2; rc=$?
if [ $rc -ne 0 ] && grep -q "tiny.txt: only 1 tokens" "$WORK/bad3.log"; then ok "bad_data_file_reported"; else notok "bad_data_file_reported" "rc $rc" "$(tail -3 "$WORK/bad3.log")"; fi
