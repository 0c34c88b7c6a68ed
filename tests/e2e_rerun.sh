#!/usr/bin/env bash
# e2e_rerun.sh — the same --job started again on a shared Redis (a rerun, or a requeue the way
# Slurm does it) after its whole earlier run died: the dead run's keys are not picked up as if
# they were the new run's. Without --resume or --fresh the id is refused, saying both; --fresh
# starts afresh; --resume continues from the dead run's checkpoints. Both end byte-identical to
# a run that never died.
source "$(dirname "$0")/lib_e2e.sh"
MLP="$ROOT/build/examples/mlp"
command -v redis-server >/dev/null || { echo "ok - rerun # SKIP no redis-server"; exit 0; }

trap 'kill "$rp" 2>/dev/null; rm -rf "$WORK"' EXIT
redis_private rerun || exit 0
# One machine as a machine of a multi-machine job (--job on a shared Redis); its replicas on
# its spare, so that one machine is enough.
JOB=(--redis "redis://127.0.0.1:$port" --nnodes 1 --nproc-per-node 2 --workers 2 --spares 1 --secret-file "$SECRET_FILE"
     --replica-placement spares --persist-every 10 --steps 800 --seed 5)

run_job "$WORK/ref" 120 "${JOB[@]}" --job ref -- "$MLP"; rc=$?
[ $rc -eq 0 ] && [ -s "$WORK/ref/model.bin" ] && ok "rerun_reference" || notok "rerun_reference" "rc $rc" "$(tail -3 "$WORK/ref.log")"

# die OUT: a run of job J, killed with everything it started (-9, as a node loss would) once it
# has a checkpoint; then its keys are left to expire as a dead run's do.
die() {
  mkdir -p "$1"
  setsid "$DP" run --out "$1" "${JOB[@]}" --job J -- "$MLP" >"$1.stdout" 2>"$1.log" &
  local lp=$!
  for _ in $(seq 600); do compgen -G "$1/ckpt/step_*" >/dev/null && break; sleep 0.05; done
  compgen -G "$1/ckpt/step_*" >/dev/null || echo "# waited 30 s for a checkpoint in $1/ckpt: none (last: '$(tail -1 "$1.log")')" >&2
  kill -9 -- "-$lp" 2>/dev/null; wait "$lp" 2>/dev/null
  for _ in $(seq 300); do [ "$(rcli EXISTS dp:J:launcher)" = 0 ] && [ -z "$(rcli --scan --pattern 'dp:J:hb:*')" ] && break; sleep 0.1; done
  [ "$(rcli EXISTS dp:J:launcher)" = 0 ] && [ -z "$(rcli --scan --pattern 'dp:J:hb:*')" ] \
    || echo "# waited 30 s for the dead run's keys to expire: dp:J:launcher exists '$(rcli EXISTS dp:J:launcher)'," \
      "heartbeats '$(rcli --scan --pattern 'dp:J:hb:*' | tr '\n' ' ')'" >&2
}

die "$WORK/dead1"
start=$(date +%s%N)
run_job "$WORK/again" 60 "${JOB[@]}" --job J -- "$MLP"; rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ $rc -ne 0 ] && grep -q 'earlier run of this id' "$WORK/again.log" && grep -q -- '--resume OUT' "$WORK/again.log" \
   && grep -q -- '--fresh' "$WORK/again.log" && no_leftovers "$WORK/again"; then
  ok "rerun_of_a_dead_job_id_is_refused_saying_resume_or_fresh (${ms} ms)"
else notok "rerun_of_a_dead_job_id_is_refused_saying_resume_or_fresh" "rc $rc" "$(tail -3 "$WORK/again.log")"; fi

run_job "$WORK/fresh" 120 "${JOB[@]}" --job J --fresh -- "$MLP"; rc=$?
if [ $rc -eq 0 ] && grep -q 'starting afresh' "$WORK/fresh.log" && cmp -s "$WORK/ref/model.bin" "$WORK/fresh/model.bin"; then
  ok "rerun_fresh_starts_again_bit_identical"
else notok "rerun_fresh_starts_again_bit_identical" "rc $rc" "$(tail -3 "$WORK/fresh.log")"; fi

die "$WORK/dead2"
timeout -k 5 120 "$DP" run --resume "$WORK/dead2" "${JOB[@]}" --job J -- "$MLP" >"$WORK/dead2.resumed.stdout" \
  2>"$WORK/dead2.resumed.log"; rc=$?
if [ $rc -eq 0 ] && grep -q 'resuming from the checkpoints' "$WORK/dead2.resumed.log" \
   && cmp -s "$WORK/ref/model.bin" "$WORK/dead2/model.bin"; then
  ok "rerun_resume_continues_the_dead_run_bit_identical"
else notok "rerun_resume_continues_the_dead_run_bit_identical" "rc $rc" "$(tail -3 "$WORK/dead2.resumed.log")"; fi
