#!/usr/bin/env bash
# e2e_hotswap.sh — hot-swap recovery end to end. For each failure mode the final model.bin
# must equal the failure-free run's byte for byte, nothing may be left running, and every
# run is bounded by a timeout.
source "$(dirname "$0")/lib_e2e.sh"

BASE=(--workers 4 --model tiny --steps 30 --seed 21)
run_job "$WORK/ref" 120 "${BASE[@]}" --spares 0; rc=$?
[ $rc -eq 0 ] || notok "reference_run" "rc $rc" "$(tail -3 "$WORK/ref.log")"

# expect_recovered NAME N_RECOVERED ARGS... — a run that must recover N times and match ref.
expect_recovered() {
  local name=$1 n=$2; shift 2
  run_job "$WORK/$name" 180 "${BASE[@]}" "$@"; local rc=$?
  local e="$WORK/$name/events.jsonl" got bad=""
  got=$(grep -c '"event":"recovered"' "$e" 2>/dev/null)
  [ $rc -eq 0 ] || bad="rc $rc"
  [ "${got:-0}" -ge "$n" ] || bad="$bad; $got recovered events, expected >= $n"
  cmp -s "$WORK/${REF:-ref}/model.bin" "$WORK/$name/model.bin" || bad="$bad; model differs from the failure-free run"
  no_leftovers "$WORK/$name" || bad="$bad; processes left behind"
  for k in rank spare failure_kind rollback_step detect_ms decide_ms rebuild_ms restore_ms total_ms steps_recomputed; do
    grep '"event":"recovered"' "$e" | grep -q "\"$k\":" || bad="$bad; recovered lacks $k"
  done
  if [ -z "$bad" ]; then
    ok "$name ($(grep '"event":"recovered"' "$e" | grep -o '"failure_kind":"[a-z]*"\|"total_ms":[0-9]*\|"steps_recomputed":-*[0-9]*' | tr '\n' ' '))"
  else
    notok "$name" "$bad" "$(tail -5 "$WORK/$name.log")"
  fi
}

expect_recovered crash_kill9 1 --spares 1 --inject kill:2@10
grep -q '"failure_kind":"crash"' "$WORK/crash_kill9/events.jsonl" || notok "crash_kind_reported"

expect_recovered hang_sigstop 1 --spares 1 --inject stop:1@8 --detect-timeout-ms 1000
if grep -q '"failure_kind":"hang"' "$WORK/hang_sigstop/events.jsonl" && grep -q '"event":"fenced"' "$WORK/hang_sigstop/events.jsonl"; then
  ok "hung_worker_fenced_when_it_wakes"
else notok "hung_worker_fenced_when_it_wakes" "$(grep -E 'fenced|failure' "$WORK/hang_sigstop/events.jsonl")"; fi

# A snapshot every 3 steps: the rollback lands on a captured step, further back, same model.
expect_recovered snapshot_every_3 1 --spares 1 --snapshot-every 3 --inject kill:2@11
rb=$(grep -o '"event":"recovered".*' "$WORK/snapshot_every_3/events.jsonl" | grep -o '"rollback_step":[0-9]*' | cut -d: -f2)
commits=$(grep '"event":"snapshot_stats"' "$WORK/snapshot_every_3/events.jsonl" | grep -o '"commits":[0-9]*' | cut -d: -f2 | sort -u | tr '\n' ' ')
if [ "$rb" = 9 ]; then ok "snapshot_every_3_rolls_back_to_step_9 (commits per rank and epoch: $commits)"
else notok "snapshot_every_3_rolls_back_to_step_9" "rollback_step '$rb', commits $commits"; fi
# ... and no rank copied its state for a snapshot: the steps between two snapshots update in
# place, the snapshot's successor writes the other buffer (gen_block), so the snapshot is
# replicated where it lies, the restore point after the recovery too.
copied=$(grep '"event":"snapshot_stats"' "$WORK/snapshot_every_3/events.jsonl" | grep -o '"bytes_copied":[0-9]*' | cut -d: -f2 | sort -u | tr '\n' ' ')
if [ "$copied" = "0 " ]; then ok "snapshot_every_3_copies_nothing"
else notok "snapshot_every_3_copies_nothing" "bytes_copied per rank and epoch: '$copied'"; fi

expect_recovered two_nonadjacent_same_step 2 --spares 2 --inject kill:0@10 --inject kill:2@10
expect_recovered failure_during_recovery 1 --spares 2 --inject kill:2@10 --inject rkill:2@1

# A member dies as the job starts (rkill:R@0: it claimed its rank, it has not reached epoch
# 0's rendezvous): the others' rendezvous is aborted, they wait as survivors and follow the
# decision that replaces it. Before, they exited as a bad job and the job stopped.
expect_recovered kill_as_the_job_starts 1 --spares 1 --inject rkill:1@0
if grep -q "joining the communicator failed" "$WORK/kill_as_the_job_starts.log" && ! grep -q "bad job" "$WORK/kill_as_the_job_starts.log"; then
  ok "kill_as_the_job_starts_the_others_wait_as_survivors"
else notok "kill_as_the_job_starts_the_others_wait_as_survivors" "$(grep -v '^step' "$WORK/kill_as_the_job_starts.log" | tail -8)"; fi

# A process dies before it claims its rank (killed as it starts, here by its own wrapper):
# nobody's failure to the coordinator, which knows epoch 0's members once every rank is
# claimed, while the others wait for it in the rendezvous. The launcher starts another process
# for the rank (before, the job waited --start-timeout-ms and failed); one that dies so every
# time stops the job after 3 tries, saying why.
WRAP="$WORK/die_before_claiming.sh"
cat >"$WRAP" <<'WRAPPER'
#!/usr/bin/env bash
if [ "${DEADPOOL_RANK:-}" = 1 ] && { [ -z "$DIE_MARK" ] || mkdir "$DIE_MARK" 2>/dev/null; }; then kill -9 $$; fi
exec "$DP_BIN" train "$@"
WRAPPER
chmod +x "$WRAP"
name=unclaimed_rank_started_again
DIE_MARK="$WORK/died_once" DP_BIN="$DP" run_job "$WORK/$name" 180 --workers 4 --steps 30 --seed 21 --spares 1 -- "$WRAP" --model tiny; rc=$?
if [ $rc -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$WORK/$name/model.bin" && grep -q "before it claimed the rank: starting another" "$WORK/$name.log" \
   && no_leftovers "$WORK/$name"; then ok "$name"
else notok "$name" "rc $rc" "$(grep -v '^step' "$WORK/$name.log" | tail -6)"; fi
name=unclaimed_rank_dying_every_time_stops_the_job
t0=$SECONDS
DIE_MARK="" DP_BIN="$DP" run_job "$WORK/$name" 120 --workers 4 --steps 30 --seed 21 --spares 1 -- "$WRAP" --model tiny; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "3 processes died so\|4 processes died so" "$WORK/$name.log" && grep -q "the job cannot start" "$WORK/$name.log" \
   && no_leftovers "$WORK/$name"; then ok "$name (rc $rc, $((SECONDS - t0)) s)"
else notok "$name" "rc $rc" "$(grep -v '^step' "$WORK/$name.log" | tail -6)"; fi
expect_recovered owner_and_holder_with_2_replicas 2 --spares 2 --replicas 2 --inject kill:1@10 --inject kill:2@10
expect_recovered replicas_on_spares 1 --spares 2 --replica-placement spares --inject kill:3@12

# A spare dies while waiting; the other one takes the failed rank later.
mkdir -p "$WORK/spare_dies"
"$DP" run --out "$WORK/spare_dies" "${BASE[@]}" --steps 200 --spares 2 --respawn-spares 0 --inject kill:1@150 \
  >"$WORK/spare_dies.stdout" 2>"$WORK/spare_dies.log" &
lp=$!
sp=""
for _ in $(seq 200); do
  sp=$(grep -m1 '"event":"spare_joined"' "$WORK/spare_dies/events.jsonl" 2>/dev/null | grep -o '"pid":[0-9]*' | cut -d: -f2)
  [ -n "$sp" ] && break; sleep 0.05
done
[ -n "$sp" ] && kill -9 "$sp"
for _ in $(seq 600); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
kill -0 $lp 2>/dev/null && echo "# waited 60 s for the launcher to exit: still running, killed (last: '$(tail -1 "$WORK/spare_dies.log")')" >&2
kill -9 $lp 2>/dev/null; wait $lp; rc=$?
run_job "$WORK/ref200" 120 "${BASE[@]}" --steps 200 --spares 0
if [ $rc -eq 0 ] && grep -q '"event":"spare_lost"' "$WORK/spare_dies/events.jsonl" \
   && grep -q '"event":"recovered"' "$WORK/spare_dies/events.jsonl" && cmp -s "$WORK/ref200/model.bin" "$WORK/spare_dies/model.bin" \
   && no_leftovers "$WORK/spare_dies"; then
  ok "spare_fails_while_waiting"
else notok "spare_fails_while_waiting" "rc $rc spare $sp" "$(tail -3 "$WORK/spare_dies.log")"; fi

# No spare left: the committed generation is persisted, the job waits --spare-wait, exits
# non-zero with how to resume, and the resumed job ends bit-identical.
run_job "$WORK/nospare" 120 "${BASE[@]}" --spares 0 --respawn-spares 0 --spare-wait 1 --inject kill:1@13; rc=$?
msg=$(grep -o 'continue with `deadpool run --resume [^`]*`' "$WORK/nospare.log")
timeout -k 5 120 "$DP" run --resume "$WORK/nospare" >"$WORK/nospare.resume.stdout" 2>"$WORK/nospare.resume.log"; rc2=$?
if [ $rc -ne 0 ] && [ -n "$msg" ] && grep -q '"event":"no_spare"' "$WORK/nospare/events.jsonl" && [ $rc2 -eq 0 ] \
   && cmp -s "$WORK/ref/model.bin" "$WORK/nospare/model.bin" && no_leftovers "$WORK/nospare"; then
  ok "no_spare_persists_then_resume_bit_identical"
else notok "no_spare_persists_then_resume_bit_identical" "rc $rc $rc2 msg '$msg'" "$(tail -3 "$WORK/nospare.log")"; fi

# No spare left after a failed join: the spare that took rank 1 dies while recovering, so
# every survivor's join fails and they wait (RETRYING), their snapshots of the old epoch
# still the only copy. They answer the persist request from those: the checkpoint the stop
# names is on disk, and the resumed job ends bit-identical. (They wrote nothing before, and
# the stop still said "Nothing committed is lost ... checkpoint of step 12".) The step is 12, or
# 11 when step 12's commit was still in flight on a rank as rank 1 died mid-step 13.
# --spare-wait 5: the one spare may still be starting when rank 1 dies (1.4 s on a loaded
# machine, past the 1 s this case waited: it stopped at once, "no spare joined", and never
# came to the failed join); the wait is for that spare, and then for none after the rkill.
run_job "$WORK/joinfail" 120 "${BASE[@]}" --spares 1 --respawn-spares 0 --spare-wait 5 --inject kill:1@13 \
  --inject rkill:1@1; rc=$?
persisted=$(ls "$WORK/joinfail/ckpt" 2>/dev/null | tr '\n' ' ')
named=$(grep -o 'checkpoint of step [0-9]*)' "$WORK/joinfail.log" | grep -o '[0-9]*')
timeout -k 5 120 "$DP" run --resume "$WORK/joinfail" >"$WORK/joinfail.resume.stdout" 2>"$WORK/joinfail.resume.log"; rc2=$?
if [ $rc -ne 0 ] && grep -q 'joining epoch 1 failed' "$WORK/joinfail.log" && [ "$named" = 11 -o "$named" = 12 ] \
   && [ -e "$WORK/joinfail/ckpt/$(printf 'step_%09d' "$named")" ] && [ $rc2 -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$WORK/joinfail/model.bin" && no_leftovers "$WORK/joinfail"; then
  ok "no_spare_after_a_failed_join_persists_then_resume_bit_identical (persisted: $persisted)"
else notok "no_spare_after_a_failed_join_persists_then_resume_bit_identical" "rc $rc $rc2 persisted '$persisted'" \
  "$(grep -v '^step' "$WORK/joinfail.log" | tail -4; tail -2 "$WORK/joinfail.resume.log")"; fi

# The persisted step cannot be written (--out/ckpt turned into a file while the job runs):
# the stop waits for it (30 s after --spare-wait), then says so and names no checkpoint,
# instead of "Nothing committed is lost: continue with ... (checkpoint of step N)".
mkdir -p "$WORK/nockpt"
timeout -k 5 120 "$DP" run --out "$WORK/nockpt" --workers 2 --model tiny --steps 1000 --seed 21 --spares 0 --respawn-spares 0 \
  --spare-wait 1 --inject kill:1@400 >"$WORK/nockpt.stdout" 2>"$WORK/nockpt.log" &
job=$!
for _ in $(seq 600); do [ "$(count_lines "$WORK/nockpt/metrics.jsonl")" -ge 1 ] && break; sleep 0.05; done
[ "$(count_lines "$WORK/nockpt/metrics.jsonl")" -ge 1 ] \
  || echo "# waited 30 s for 1 step in $WORK/nockpt/metrics.jsonl: saw $(count_lines "$WORK/nockpt/metrics.jsonl") (last: '$(tail -1 "$WORK/nockpt.log")')" >&2
[ -e "$WORK/nockpt/ckpt" ] || : >"$WORK/nockpt/ckpt"
wait $job; rc=$?
if [ $rc -ne 0 ] && grep -q 'was not written to .*ckpt within 30 s.*no checkpoint exists' "$WORK/nockpt.log" \
   && ! grep -q 'Nothing committed is lost' "$WORK/nockpt.log" && no_leftovers "$WORK/nockpt"; then
  ok "no_spare_checkpoint_not_written_is_said"
else notok "no_spare_checkpoint_not_written_is_said" "rc $rc" "$(grep -v '^step' "$WORK/nockpt.log" | tail -4)"; fi

# The same with a snapshot every 2 steps: what is persisted is a zero-copy snapshot whose
# block the steps after it no longer write (gen_block), the survivors' from their own blocks.
run_job "$WORK/nospare2" 120 "${BASE[@]}" --spares 0 --respawn-spares 0 --spare-wait 1 --snapshot-every 2 \
  --inject kill:1@13; rc=$?
persisted=$(ls "$WORK/nospare2/ckpt" 2>/dev/null | tr '\n' ' ')
timeout -k 5 120 "$DP" run --resume "$WORK/nospare2" >"$WORK/nospare2.resume.stdout" 2>"$WORK/nospare2.resume.log"; rc2=$?
if [ $rc -ne 0 ] && [ $rc2 -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$WORK/nospare2/model.bin" && no_leftovers "$WORK/nospare2"; then
  ok "no_spare_snapshot_every_2_resume_bit_identical (persisted: $persisted)"
else notok "no_spare_snapshot_every_2_resume_bit_identical" "rc $rc $rc2 persisted '$persisted'" "$(tail -3 "$WORK/nospare2.log")"; fi

# A failed rank and its only replica holder die together: the job stops with a clear message
# and resumes from the persistent tier, bit-identical. Both deaths in one decision: "together
# with every holder"; when the load parts them by more than the batch window (15 ms), the
# spare that took rank 1 finds no copy and the job stops as its state is "lost from memory".
run_job "$WORK/lost" 120 "${BASE[@]}" --spares 2 --persist-every 5 --inject kill:1@13 --inject kill:2@13; rc=$?
timeout -k 5 120 "$DP" run --resume "$WORK/lost" >"$WORK/lost.resume.stdout" 2>"$WORK/lost.resume.log"; rc2=$?
if [ $rc -ne 0 ] && grep -qE "rank [0-9]+ failed .* together with every holder of its replicas|rank [0-9]+'s state of step [0-9]+ could not be restored .* lost from memory; continue from the checkpoint" "$WORK/lost.log" \
   && [ $rc2 -eq 0 ] \
   && cmp -s "$WORK/ref/model.bin" "$WORK/lost/model.bin"; then
  ok "owner_and_only_holder_lost_resume_from_disk"
else notok "owner_and_only_holder_lost_resume_from_disk" "rc $rc $rc2" "$(tail -3 "$WORK/lost.log")" \
  "resume: $(tail -8 "$WORK/lost.resume.log")" "$(ls "$WORK/lost/ckpt" 2>&1 | tr '\n' ' ')"; fi

# A new spare joins from "another host" (deadpool worker --spare) while the job waits.
if command -v redis-server >/dev/null; then
  port=$(( 20000 + RANDOM % 20000 )); pw=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf 'port %s\nbind 127.0.0.1\nrequirepass %s\nsave ""\nappendonly no\n' "$port" "$pw" | redis-server - >/dev/null 2>&1 &
  rp=$!
  for _ in $(seq 100); do redis-cli -p "$port" -a "$pw" --no-auth-warning ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  pong=$(timeout 2 redis-cli -p "$port" -a "$pw" --no-auth-warning ping 2>&1)
  grep -q PONG <<<"$pong" || echo "# waited 5 s for redis-server on port $port: no PONG," \
    "server $(kill -0 $rp 2>/dev/null && echo running || echo exited) (last: '$pong')" >&2
  mkdir -p "$WORK/join"
  "$DP" run --out "$WORK/join" "${BASE[@]}" --spares 0 --respawn-spares 0 --spare-wait 60 --inject kill:3@12 \
    --secret-file "$SECRET_FILE" --redis "redis://:$pw@127.0.0.1:$port" >"$WORK/join.stdout" 2>"$WORK/join.log" &
  lp=$!
  for _ in $(seq 300); do grep -q '"event":"no_spare"' "$WORK/join/events.jsonl" 2>/dev/null && break; sleep 0.05; done
  grep -q '"event":"no_spare"' "$WORK/join/events.jsonl" 2>/dev/null \
    || echo "# waited 15 s for a no_spare event in $WORK/join/events.jsonl: none (last: '$(tail -1 "$WORK/join.log")')" >&2
  job=$(grep -o '"job":"[0-9a-f]*"' "$WORK/join/events.jsonl" | head -1 | cut -d'"' -f4)
  DEADPOOL_REDIS_PASSWORD=$pw timeout 120 "$DP" worker --redis "redis://127.0.0.1:$port" --job "$job" --secret-file "$SECRET_FILE" --spare \
    >"$WORK/join.spare.log" 2>&1 &
  wp=$!
  for _ in $(seq 600); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
  kill -0 $lp 2>/dev/null && echo "# waited 60 s for the launcher to exit: still running, killed (last: '$(tail -1 "$WORK/join.log")')" >&2
  kill -9 $lp 2>/dev/null; wait $lp; rc=$?
  wait $wp
  kill "$rp" 2>/dev/null; wait "$rp" 2>/dev/null
  if [ $rc -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$WORK/join/model.bin" && ! grep -q "$pw" "$WORK/join.log" "$WORK/join.stdout"; then
    ok "spare_joins_from_outside_while_job_waits"
  else notok "spare_joins_from_outside_while_job_waits" "rc $rc job $job" "$(tail -3 "$WORK/join.log")"; fi
fi

# A worker loses its network (root only: it runs in a network namespace whose link it cuts at
# the injected step); the link comes back after the recovery and the worker finds itself fenced.
if [ "$(id -u)" -eq 0 ] && ip netns add dp_probe_$$ 2>/dev/null; then
  ip netns del dp_probe_$$
  # 80 steps, not BASE's 30: the cut-off worker learns it is fenced only once its link is back
  # (after the decision) and its Redis client reconnects; 20 tiny steps (0.8 s) after the
  # recovery were once too few on a loaded machine, and the job ended first.
  run_job "$WORK/ref80" 120 "${BASE[@]}" --steps 80 --spares 0
  REF=ref80 expect_recovered network_loss 1 --steps 80 --spares 1 --inject netdown:3@10 --detect-timeout-ms 1000
  e="$WORK/network_loss/events.jsonl"
  if grep -q '"failure_kind":"network"' "$e" && grep -q '"event":"fenced"' "$e" && ! ip netns list | grep -q '^dp[0-9a-f]\{8\}r'; then
    ok "network_loss_detected_fenced_and_cleaned_up"
  else notok "network_loss_detected_fenced_and_cleaned_up" "$(grep -E 'failure|fenced' "$e")" "$(ip netns list)"; fi
else
  echo "# network_loss: skipped (needs root and network namespaces)"
fi

# A job that starts from a model file and loses a rank in its first step (before anything is
# committed) rolls back to that file's parameters, not to the preset's random initialisation;
# also with --tp 2, where each rank holds a slice of the file's model.
run_job "$WORK/mf0" 120 --workers 2 --spares 0 --model tiny --steps 10 --seed 4; rc0=$?
for v in "dp:" "tp2:--tp 2"; do
  n=${v%%:*}; a=${v#*:}
  # shellcheck disable=SC2086
  run_job "$WORK/mf_$n" 120 --workers 2 --spares 1 --model "$WORK/mf0/model.bin" --steps 5 --seed 3 $a; rc1=$?
  # shellcheck disable=SC2086
  run_job "$WORK/mf_${n}_k" 120 --workers 2 --spares 1 --model "$WORK/mf0/model.bin" --steps 5 --seed 3 $a --inject kill:1@1; rc2=$?
  rb=$(grep -o '"rollback_step":-*[0-9]*' "$WORK/mf_${n}_k/events.jsonl" | head -1 | cut -d: -f2)
  if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$rb" = 0 ] && cmp -s "$WORK/mf_$n/model.bin" "$WORK/mf_${n}_k/model.bin"; then
    ok "failure_before_first_commit_resets_to_the_model_file_$n"
  else notok "failure_before_first_commit_resets_to_the_model_file_$n" "rc $rc0 $rc1 $rc2 rollback ${rb:-none}"; fi
done
