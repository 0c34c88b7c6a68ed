#!/usr/bin/env bash
# e2e_example.sh — a training loop of its own (examples/mlp.c: replicated parameters, lazily
# allocated optimizer state, a data cursor that is not a function of the step) under
# `deadpool run -- PROGRAM`: every fault-tolerance path ends with the failure-free model,
# byte for byte.
source "$(dirname "$0")/lib_e2e.sh"
MLP="$ROOT/build/examples/mlp"
BASE=(--workers 3 --steps 200 --seed 7)

run_job "$WORK/ref" 120 "${BASE[@]}" --spares 0 -- "$MLP"; rc=$?
run_job "$WORK/ref2" 120 "${BASE[@]}" --spares 1 -- "$MLP"; rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ -s "$WORK/ref/model.bin" ] && cmp -s "$WORK/ref/model.bin" "$WORK/ref2/model.bin"; then
  ok "example_deterministic"
else notok "example_deterministic" "rc $rc $rc2" "$(tail -3 "$WORK/ref.log")"; fi

# expect_same NAME MIN_RECOVERED ARGS... — expect_like (lib_e2e.sh) against the reference run, with its options.
expect_same() { local name=$1 n=$2; shift 2; expect_like ref "$name" "$n" "${BASE[@]}" "$@"; }

# kill_together OUTDIR "RANKS" SPARES — once the job writing OUTDIR has every rank of RANKS
# and SPARES spares joined and step 100 done (bounded: 60 s), kill -9 those ranks' processes
# in one kill(1); prints 1 when it did. Two --inject kills fire as each rank reaches the step,
# and the load can part them beyond the coordinator's batch window (15 ms, two decisions).
kill_together() {
  local d=$1 ranks=$2 spares=$3 pids r p
  for _ in $(seq 600); do
    pids=""
    for r in $ranks; do
      p=$(grep -o "\"event\":\"rank_joined\".*\"rank\":$r,\"proc\":[0-9]*,\"pid\":[0-9]*" "$d/events.jsonl" 2>/dev/null \
        | head -1 | grep -o '"pid":[0-9]*' | cut -d: -f2)
      [ -n "$p" ] && pids="$pids $p"
    done
    if [ "$(wc -w <<<"$pids")" -eq "$(wc -w <<<"$ranks")" ] \
       && [ "$(grep -c '"event":"spare_joined"' "$d/events.jsonl" 2>/dev/null)" -ge "$spares" ] \
       && grep -q '"step":[0-9]\{3,\},' "$d/metrics.jsonl" 2>/dev/null; then
      # shellcheck disable=SC2086
      kill -9 $pids && echo 1
      return
    fi
    sleep 0.1
  done
}

# run_killed_together NAME "RANKS" SPARES ARGS... — `deadpool run ARGS` into $WORK/NAME, its
# ranks RANKS killed together (kill_together) once under way; sets rc and killed.
run_killed_together() {
  local name=$1 ranks=$2 spares=$3 job; shift 3
  run_job "$WORK/$name" 180 "$@" & job=$!
  killed=$(kill_together "$WORK/$name" "$ranks" "$spares")
  wait $job; rc=$?
}

# A kill, a hang, then a kill whose replacement dies while it recovers (epoch 3 -> 4).
expect_same example_kill_hang_recovery_failure 3 --spares 1 --detect-timeout-ms 1000 \
  --inject kill:1@40 --inject stop:2@90 --inject kill:0@150 --inject rkill:0@3 -- "$MLP"
e="$WORK/example_kill_hang_recovery_failure/events.jsonl"
kinds=$(grep '"event":"recovered"' "$e" | grep -o '"failure_kind":"[a-z]*"' | sort | uniq -c | tr -s ' ' | tr '\n' ' ')
if grep -q '"failure_kind":"crash"' "$e" && grep -q '"failure_kind":"hang"' "$e" && grep -q '"event":"join_failed"\|"epoch":4' "$e"; then
  ok "example_recovered_each_kind ($kinds)"
else notok "example_recovered_each_kind" "$kinds"; fi

# Plain data parallelism (mlp --plain): every rank's state is DP_IDENTICAL and no extra, so a
# rank has nothing of its own and every member keeps the identical state. Two ranks die in one
# step (one decision): (a) ranks 1 and 2, rank 1's only holder dying with it; (b) ranks 0 and
# 2, rank 2's holder being rank 0: rank 1 alone still holds the state, and provides it.
PLAIN_LONG=(--workers 3 --steps 1500 --seed 7)
run_job "$WORK/plain_long_ref" 120 "${PLAIN_LONG[@]}" --spares 0 -- "$MLP" --plain; rc=$?
[ $rc -eq 0 ] && [ -s "$WORK/plain_long_ref/model.bin" ] && ok "example_plain_reference" \
  || notok "example_plain_reference" "rc $rc" "$(tail -3 "$WORK/plain_long_ref.log")"
for pair in 1:2 0:2; do
  a=${pair%:*} b=${pair#*:} name="example_plain_kill_${pair%:*}_and_${pair#*:}_together"
  run_killed_together "$name" "$a $b" 2 "${PLAIN_LONG[@]}" --spares 2 -- "$MLP" --plain
  if [ -n "$killed" ] && [ $rc -eq 0 ] && [ "$(grep -c '"event":"recovered"' "$WORK/$name/events.jsonl")" -ge 2 ] \
     && cmp -s "$WORK/plain_long_ref/model.bin" "$WORK/$name/model.bin" && no_leftovers "$WORK/$name"; then
    ok "$name"
  else notok "$name" "killed '${killed}' rc $rc" "$(tail -3 "$WORK/$name.log")"; fi
  grep -q '"event":"decision".*"failed":2' "$WORK/$name/events.jsonl" \
    && ok "example_plain_kill_${a}_and_${b}_one_decision" \
    || notok "example_plain_kill_${a}_and_${b}_one_decision" "the two failures were not decided together"
done
# ... and a spare whose takeover failed holds no identical state: one rank dies, the survivor
# dies while they recover (rkill), and the next decision names the spare that took the first
# rank again, with a new spare for the other. Neither has the state in its own buffers: rank
# 0's comes from its replica (on a spare), not from a "survivor" that never had it (the job
# used to stop with "no member restored the state every rank holds identically").
PLAIN2=(--workers 2 --steps 60 --seed 7)
run_job "$WORK/plain2_ref" 120 "${PLAIN2[@]}" --spares 0 -- "$MLP" --plain
for pair in 0:1 1:0; do
  a=${pair%:*} b=${pair#*:}
  expect_like plain2_ref "example_plain_kill_${a}_then_${b}_in_recovery_rank_0_from_its_replica" 1 "${PLAIN2[@]}" \
    --spares 3 --replica-placement spares --detect-timeout-ms 1000 --inject "kill:$a@30" --inject "rkill:$b@1" -- "$MLP" --plain
done
# ... and with no spare: the committed state goes to disk, rank 1's (empty: nothing of its own)
# written by rank 0 although its holder died with it, and the resumed job ends the same.
run_killed_together plain_nospare "1 2" 0 "${PLAIN_LONG[@]}" --spares 0 --respawn-spares 0 --spare-wait 1 -- "$MLP" --plain
timeout -k 5 120 "$DP" run --resume "$WORK/plain_nospare" -- "$MLP" --plain >"$WORK/plain_nospare.resume.stdout" 2>"$WORK/plain_nospare.resume.log"; rc2=$?
if [ -n "$killed" ] && [ $rc -ne 0 ] && grep -q 'deadpool run --resume' "$WORK/plain_nospare.log" && [ $rc2 -eq 0 ] \
   && grep -q '"event":"no_spare".*"failed":2' "$WORK/plain_nospare/events.jsonl" \
   && cmp -s "$WORK/plain_long_ref/model.bin" "$WORK/plain_nospare/model.bin" && no_leftovers "$WORK/plain_nospare"; then
  ok "example_plain_no_spare_persist_then_resume"
else notok "example_plain_no_spare_persist_then_resume" "killed '${killed}' rc $rc $rc2" "$(tail -3 "$WORK/plain_nospare.log")" \
  "$(tail -3 "$WORK/plain_nospare.resume.log")"; fi

# A spare's restore lands in memory it faulted in while it waited, even for state that appears
# at the first step: with --hidden 8192 the Adam moments (96 KiB each, allocated lazily) outgrow
# the buffer sized at join, and it grows when the ranks publish their generations' size. The
# spare taking rank 0 fetches them in rank 0's replica, the next one (taking rank 1) receives
# them in the identical state's broadcast.
WIDE=(--workers 3 --steps 150 --seed 7)
run_job "$WORK/wide_ref" 120 "${WIDE[@]}" --spares 0 -- "$MLP" --hidden 8192; rc=$?
[ $rc -eq 0 ] || notok "example_wide_reference" "rc $rc" "$(tail -3 "$WORK/wide_ref.log")"
expect_like wide_ref example_spare_restore_warm 2 "${WIDE[@]}" --spares 1 --inject kill:0@60 --inject kill:1@120 \
  -- "$MLP" --hidden 8192
warm=$(grep '"event":"recovered"' "$WORK/example_spare_restore_warm/events.jsonl" 2>/dev/null | grep -o '"restore_warm":[a-z]*' | tr '\n' ' ')
[ "$(echo "$warm" | grep -o 'true' | wc -l)" -eq 2 ] && ! echo "$warm" | grep -q false \
  && ok "example_spare_restore_lands_in_its_warm_buffer ($warm)" \
  || notok "example_spare_restore_lands_in_its_warm_buffer" "recovered events say: ${warm:-no restore_warm}"

# Replicas on the spares, two of them per rank.
expect_same example_replicas_on_spares 1 --spares 2 --replicas 2 --replica-placement spares --inject kill:2@70 -- "$MLP"

# Two ranks fail at once with one spare in the pool: the launcher starts the spare that is
# missing at once, and the job goes on (it does not wait for a spare nobody will start).
LONG=(--workers 3 --steps 1500 --seed 7)
run_job "$WORK/long_ref" 120 "${LONG[@]}" --spares 0 -- "$MLP"
d="$WORK/example_two_failed_one_spare_starts_another"
run_killed_together example_two_failed_one_spare_starts_another "0 1" 1 "${LONG[@]}" --spares 1 --replicas 2 -- "$MLP"
e="$d/events.jsonl"
nospare=$(grep -o '"event":"no_spare".*"failed":[0-9]*,"spares":[0-9]*' "$e" | grep -o '"failed":[0-9]*,"spares":[0-9]*')
if [ -n "$killed" ] && [ $rc -eq 0 ] && [ "$(grep -c '"event":"recovered"' "$e")" -ge 2 ] \
   && cmp -s "$WORK/long_ref/model.bin" "$d/model.bin" && no_leftovers "$d"; then
  ok "example_two_failed_one_spare_starts_another"
else notok "example_two_failed_one_spare_starts_another" "killed '${killed}' rc $rc" "$(tail -3 "$d.log")"; fi
[ "$nospare" = '"failed":2,"spares":1' ] && [ "$(grep -c '"event":"decision"' "$e")" -eq 1 ] \
  && ok "example_two_failed_one_spare_counted" \
  || notok "example_two_failed_one_spare_counted" "no_spare events: '${nospare}', $(grep -c '"event":"decision"' "$e") decisions"

# The classic baseline: a failure restarts the whole job from the newest disk checkpoint.
expect_same example_ft_disk_restart 1 --spares 0 --ft disk --ckpt-every 25 --inject kill:1@60 -- "$MLP"
[ -s "$(ls -d "$WORK"/example_ft_disk_restart/ckpt/step_*/ 2>/dev/null | tail -1)model.bin" ] \
  && ok "example_checkpoint_has_the_apps_files" || notok "example_checkpoint_has_the_apps_files" "no model.bin in the checkpoint"

# No spare left: the committed state goes to disk (the failed rank's from its replica), the
# job stops telling how to resume, and the resumed job ends with the same model.
# The command it prints is run as printed: it names the program again (a checkpoint never
# names what runs).
run_job "$WORK/nospare" 120 "${BASE[@]}" --spares 0 --respawn-spares 0 --spare-wait 1 --inject kill:1@77 -- "$MLP"; rc=$?
hint=$(grep -o 'continue with `deadpool run --resume [^`]*`' "$WORK/nospare.log" | head -1 | cut -d'`' -f2)
read -ra cmd <<<"${hint#deadpool }"
rc2=-1
[ "${cmd[*]}" = "run --resume $WORK/nospare -- $MLP" ] && {
  timeout -k 5 120 "$DP" "${cmd[@]}" >"$WORK/nospare.resume.stdout" 2>"$WORK/nospare.resume.log"; rc2=$?; }
if [ $rc -ne 0 ] && [ $rc2 -eq 0 ] \
   && cmp -s "$WORK/ref/model.bin" "$WORK/nospare/model.bin" && no_leftovers "$WORK/nospare"; then
  ok "example_no_spare_persist_then_resume"
else notok "example_no_spare_persist_then_resume" "rc $rc $rc2 hint '$hint'" "$(tail -3 "$WORK/nospare.log")" "$(tail -3 "$WORK/nospare.resume.log")"; fi

# A failure while the spare is still starting (a program that takes seconds to import its
# framework): the job waits for that spare instead of starting a second one that would compete
# with it, and with the recovery, for the CPU. The spare records its start and sleeps 3 s.
cat >"$WORK/slow_spare.sh" <<EOF
#!/bin/sh
if [ "\${DEADPOOL_SPARE:-}" = 1 ]; then date +%s%3N >>"$WORK/spare_starts"; sleep 3; fi
exec "$MLP" "\$@"
EOF
chmod +x "$WORK/slow_spare.sh"
run_job "$WORK/slow" 120 "${BASE[@]}" --spares 1 --inject kill:1@20 -- "$WORK/slow_spare.sh"; rc=$?
resumed=$(grep -o '"resumed_wall_ms":[0-9]*' "$WORK/slow/events.jsonl" | head -1 | cut -d: -f2)
before=$(awk -v r="${resumed:-0}" '$1 < r' "$WORK/spare_starts" 2>/dev/null | wc -l)
if [ $rc -eq 0 ] && [ -n "$resumed" ] && [ "$before" -eq 1 ] && grep -q '"event":"no_spare"' "$WORK/slow/events.jsonl" \
   && cmp -s "$WORK/ref2/model.bin" "$WORK/slow/model.bin" && no_leftovers "$WORK/slow"; then
  ok "failure_waits_for_the_spare_still_starting (1 spare started before the recovery)"
else notok "failure_waits_for_the_spare_still_starting" "rc $rc, $before spares started before the recovery (want 1)" \
  "$(grep -E 'spare' "$WORK/slow.log" | tail -3)"; fi

# Bad input: options of the built-in trainer do not apply to a program; a missing program.
"$DP" run --model small -- "$MLP" >"$WORK/bad1.out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q 'do not apply to a program' "$WORK/bad1.out" && ok "trainer_options_refused_for_a_program" \
  || notok "trainer_options_refused_for_a_program" "rc $rc $(cat "$WORK/bad1.out")"
"$DP" run -- "$WORK/no/such/program" >"$WORK/bad2.out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q 'not an executable file' "$WORK/bad2.out" && ok "missing_program_reported" \
  || notok "missing_program_reported" "rc $rc $(cat "$WORK/bad2.out")"
"$MLP" >"$WORK/bad3.out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q 'deadpool run -- PROGRAM' "$WORK/bad3.out" && ok "program_outside_a_job_says_how_to_start_it" \
  || notok "program_outside_a_job_says_how_to_start_it" "rc $rc $(cat "$WORK/bad3.out")"

# The library leaves its host's environment alone (no unsetenv): two processes that inherit
# one launcher-drawn id (DEADPOOL_PROC, here siblings under one shell) get one id each: the
# first to call dp_init claims it, the other draws its own and, its rank being taken, waits as
# a spare. (With the id shared, both took the rank as its owner: two rank 2s in one epoch.)
expect_same example_inherited_process_id_claimed_once 0 --spares 0 \
  -- bash -c '"$0" "$@" & "$0" "$@"; wait' "$MLP"
e="$WORK/example_inherited_process_id_claimed_once/events.jsonl"
procs=$(grep -E '"event":"(rank|spare)_joined"' "$e" | grep -o '"proc":[0-9]*' | sort)
ranks=$(grep '"event":"rank_joined"' "$e" | grep -o '"rank":[0-9]*' | sort -u | wc -l)
# (A sibling that starts after the job ended registers nothing: at least one must have.)
if [ "$(wc -l <<<"$procs")" -ge 4 ] && [ -z "$(uniq -d <<<"$procs")" ] && [ "$ranks" -eq 3 ] \
   && [ "$(grep -c '"event":"rank_joined"' "$e")" -eq 3 ]; then
  ok "example_inherited_process_id_one_owner"
else notok "example_inherited_process_id_one_owner" "procs: $(tr '\n' ' ' <<<"$procs")"; fi

# Every transition the runs above took was one the lifecycle accepts (runtime.c logs a refused
# one as "lifecycle: state S does not accept I"): kills, a hang, failures during recovery,
# spares started late, persist and resume.
refused=$(grep -h 'lifecycle: state' "$WORK"/*.log 2>/dev/null | sort | uniq -c | head -5)
[ -z "$refused" ] && ok "lifecycle_accepted_every_transition ($(ls "$WORK"/*.log | wc -l) logs)" \
  || notok "lifecycle_accepted_every_transition" "$refused"
