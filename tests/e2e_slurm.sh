#!/usr/bin/env bash
# e2e_slurm.sh — DeadPool under a real Slurm (Debian's slurm-wlm 22.05 + munge) on simulated
# machines (tests/lib_slurm.sh on tests/lib_hosts.sh): host 0 runs slurmctld, hosts 1..4 are
# node1..node4. Every job is examples/slurm/deadpool.sbatch as docs/USAGE.md shows it (2 nodes x
# 2 ranks + 1 spare node, no --nnodes, --job or --redis: the control plane comes with the job),
# with the tiny model and few steps. Each case must end with the model byte-identical to the
# one-machine run of the same configuration. Needs root: without namespaces (or without the
# Slurm packages) every case is reported as skipped.
source "$(dirname "$0")/lib_e2e.sh"
source "$(dirname "$0")/lib_hosts.sh"
source "$(dirname "$0")/lib_slurm.sh"

CASES="slurm_usage_shows_the_script slurm_job_identical slurm_node_crash_spare_node_takes_over slurm_redis_master_node_crash \
slurm_signal_then_requeue_resumes slurm_requeue_before_a_checkpoint_starts_fresh slurm_one_node_is_a_one_machine_job \
slurm_ports_taken_before_the_start_get_nothing"
# docs/USAGE.md's Slurm section shows the very script every case below submits.
readme=$(awk '/^### Under Slurm/ {f = 1} f && /^```bash/ {g = 1; next} g && /^```/ {exit} g' "$ROOT/docs/USAGE.md")
if [ -n "$readme" ] && [ "$readme" = "$(cat "$ROOT/examples/slurm/deadpool.sbatch")" ]; then ok "slurm_usage_shows_the_script"
else notok "slurm_usage_shows_the_script" "docs/USAGE.md's 'Under Slurm' script differs from examples/slurm/deadpool.sbatch"; fi
CASES=${CASES#slurm_usage_shows_the_script }
if ! hosts_available; then
  for c in $CASES; do echo "ok - $c # SKIP no network namespaces (needs root)"; done
  exit 0
fi
if ! slurm_available; then
  for c in $CASES; do echo "ok - $c # SKIP no slurmctld/slurmd/munge (scripts/install-deps.sh --test)"; done
  exit 0
fi
hosts_create 5 || { notok "hosts_create" "cannot build the simulated machines"; exit 1; }
slurm_create 4 || { notok "slurm_create" "the Slurm cluster did not come up"; exit 1; }
trap 'slurm_destroy; _hosts_on_exit' EXIT

STEPS=${SLURM_E2E_STEPS:-150}
SCRIPT="$ROOT/examples/slurm/deadpool.sbatch"
# The one-machine reference: the same world (4 ranks), model, seed and steps.
run_job "$WORK/ref" 300 --workers 4 --spares 0 --model tiny --steps "$STEPS" --seed 7
REF="$WORK/ref/model.bin"
[ -s "$REF" ] || { notok "reference_run" "$(tail -3 "$WORK/ref.log")"; exit 1; }

# submit — sbatch of docs/USAGE.md's script (its parameters: this build, the tiny model, few
# steps, the nodes' local disk, also as TMPDIR: what a crashed node leaves there stays on its
# disk); prints the job id.
submit() {
  slurm_exec sbatch --parsable --export="ALL,DEADPOOL=$DP,MODEL=tiny,STEPS=$STEPS,LOCAL=$SLURM_LOCAL,TMPDIR=$SLURM_LOCAL,SLURM_LABELIO=1" \
    -o "$SLURM_DIR/job-%j.out" "$SCRIPT"
}
out_of() { echo "$SLURM_DIR/job-$1.out"; }
# model J HOST — that node's model.bin of job J, as the root namespace sees its disk.
model() { echo "${HOST_DISK[$2]}/local/deadpool-$1/model.bin"; }
# ranks_hosts J — the hosts (1..4) whose launcher ran ranks at the end of job J (a model there).
model_hosts() { local h; for h in 1 2 3 4; do cmp -s "$REF" "$(model "$1" "$h")" && echo "$h"; done; }
# wait_step J N — until job J's output shows step N (90 s bound).
wait_step() {
  local k
  for k in $(seq 900); do
    [ "$(grep -oE '\] step +[0-9]+/|^[0-9]+: step +[0-9]+/' "$(out_of "$1")" 2>/dev/null | grep -oE '[0-9]+/' | tr -d / | sort -n | tail -1)" -ge "$2" ] 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

took() { echo "at ${SECONDS} s"; } # since the test began
echo "# cluster and reference run done: $(took)"

# 1. docs/USAGE.md's script as it is: the job ends with the one-machine model on both nodes that
#    ran ranks, the spare node's launcher leaves with it.
J=$(submit); [ -n "${SLURM_E2E_SHOW:-}" ] && trap "cat $SLURM_DIR/job-*.out >&2; slurm_destroy; _hosts_on_exit" EXIT
if slurm_wait_state "$J" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 180 && [ "$(slurm_job_state "$J")" = COMPLETED ] \
   && [ "$(model_hosts "$J" | wc -l)" -eq 2 ] && grep -q 'spare machine 0' "$(out_of "$J")" \
   && grep -q 'under Slurm: --job' "$(out_of "$J")"; then
  ok "slurm_job_identical (job $J, models on hosts $(model_hosts "$J" | tr '\n' ' '| sed 's/ $//'); $(took))"
else notok "slurm_job_identical" "job $J: $(slurm_job_state "$J")" "$(tail -20 "$(out_of "$J")")" "$(slurm_explain "$J")"; fi

# 1b. One node (issue 34 item 6): `srun -N1 deadpool run` is a one-machine job (a local spare,
#     replicas on the node's other processes) with a warning, not a refusal; a kill is
#     recovered and the model is the one-machine run's.
run_job "$WORK/ref1" 300 --workers 2 --spares 1 --model tiny --steps "$STEPS" --seed 7
J=$(slurm_exec sbatch --parsable -N1 --export="ALL,TMPDIR=$SLURM_LOCAL" -o "$SLURM_DIR/job-%j.out" \
    --wrap "srun -N1 $DP run --nproc-per-node 2 --model tiny --steps $STEPS --seed 7 --inject kill:1@40 --out $SLURM_LOCAL/deadpool-\$SLURM_JOB_ID")
one_host=""
if slurm_wait_state "$J" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 180; then
  for h in 1 2 3 4; do cmp -s "$WORK/ref1/model.bin" "$(model "$J" "$h")" && one_host=$h; done
fi
if [ "$(slurm_job_state "$J")" = COMPLETED ] && [ -n "$one_host" ] && grep -q 'a one-machine job' "$(out_of "$J")" \
   && grep -q 'warning: every replica is on this node' "$(out_of "$J")" && grep -q 'recovery of rank 1' "$(out_of "$J")"; then
  ok "slurm_one_node_is_a_one_machine_job (job $J on host $one_host, a kill recovered, model identical; $(took))"
else notok "slurm_one_node_is_a_one_machine_job" "job $J: $(slurm_job_state "$J")" "$(tail -8 "$(out_of "$J")")"; fi

# 1c. The control plane's ports taken before the start (issue 34 item 4): a user `nobody` on
#     every compute node binds the five ports the next job's control plane had (a function of
#     the job id, 20000 + (id mod 5000) * 8, until they were drawn from the job's secret) and
#     records every connection. The job runs on ports it cannot guess: COMPLETED, the model
#     identical, and no connection (so no password) ever reached the squatter.
cat >"$WORK/squat.py" <<'PY'
import os, select, socket, sys, time
port, log = int(sys.argv[1]), open(sys.argv[2], "w")
os.setgroups([]); os.setgid(65534); os.setuid(65534)
ls = []
for p in range(port, port + 5):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", p)); s.listen(64); ls.append(s)
log.write("listening %d-%d uid %d\n" % (port, port + 4, os.getuid())); log.flush()
conns, end = [], time.time() + 300
while time.time() < end:
    r, _, _ = select.select(ls + conns, [], [], 0.5)
    for s in r:
        if s in ls:
            c, a = s.accept(); conns.append(c)
            log.write("connection on %d from %s\n" % (s.getsockname()[1], a[0])); log.flush()
        else:
            d = s.recv(4096)
            if not d: conns.remove(s); s.close(); continue
            log.write("bytes %d: %r\n" % (len(d), d[:40])); log.flush()
PY
next_job=$((J + 1)); old_port=$((20000 + (next_job % 5000) * 8)); squatters=()
for h in 1 2 3 4; do
  host_spawn "$h" "$WORK/squat$h.out" /usr/bin/python3 "$WORK/squat.py" "$old_port" "${HOST_DIR[$h]}/squat.log"
  squatters+=("$HOST_SPAWN_PID:$HOST_SPAWN_CMD")
done
up() { local h n=0; for h in 1 2 3 4; do grep -qs '^listening' "${HOST_DISK[$h]}/squat.log" && n=$((n + 1)); done; [ $n -eq 4 ]; }
for _ in $(seq 100); do up && break; sleep 0.1; done
J=$(submit)
slurm_wait_state "$J" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 180
listening=0; conns=0
for h in 1 2 3 4; do
  grep -q "^listening .* uid 65534" "${HOST_DISK[$h]}/squat.log" 2>/dev/null && listening=$((listening + 1))
  conns=$((conns + $(grep -c '^connection' "${HOST_DISK[$h]}/squat.log" 2>/dev/null || true)))
done
for sq in "${squatters[@]}"; do kill "${sq#*:}" 2>/dev/null; host_wait "${sq%%:*}" 10 >/dev/null; done
if [ "$J" = "$next_job" ] && [ $listening -eq 4 ] && [ "$(slurm_job_state "$J")" = COMPLETED ] \
   && [ "$(model_hosts "$J" | wc -l)" -eq 2 ] && [ "$conns" -eq 0 ]; then
  ok "slurm_ports_taken_before_the_start_get_nothing (job $J; ports $old_port-$((old_port + 4)) held by nobody on 4 nodes, 0 connections; $(took))"
else notok "slurm_ports_taken_before_the_start_get_nothing" "job $J (expected $next_job): $(slurm_job_state "$J"), $listening squatters listening, $conns connections to them" \
  "$(cat "${HOST_DISK[1]}/squat.log" "${HOST_DISK[2]}/squat.log" 2>/dev/null | head -4)" "$(tail -5 "$(out_of "$J")")"; fi

# host_of_node J PATTERN — the host whose launcher in job J printed PATTERN (from srun's labels:
# task k runs on the k-th node of the job's node list).
nodelist_of() { slurm_exec scontrol show job "$1" 2>/dev/null | grep -oE ' NodeList=[^ ]+' | cut -d= -f2; }
host_of_task() { # J TASK
  local list names
  list=$(nodelist_of "$1")
  names=$(slurm_exec scontrol show hostnames "$list" 2>/dev/null | sed -n "$(( $2 + 1 ))p")
  echo "${names#node}"
}
task_of() { grep -E "^[0-9]+: .*$2" "$(out_of "$1")" | head -1 | cut -d: -f1; }
# crash_case NAME WHICH — a node crashes mid-run (host_kill: its slurmd and every process on it):
# WHICH is "ranks" (a node with ranks that does not run the Redis master) or "master" (the node
# that runs the Redis master, and ranks). The spare node takes its ranks; Slurm keeps the other
# nodes' tasks (both print their end); the model is byte-identical on both nodes with ranks.
crash_case() {
  local name=$1 which=$2 J t h victim survivors="" s
  J=$(submit)
  if ! wait_step "$J" 20; then notok "$name" "job $J did not reach step 20" "$(tail -5 "$(out_of "$J")")" "$(slurm_explain "$J")"; return; fi
  if [ "$which" = master ]; then t=$(task_of "$J" "this node runs the master")
  else t=$(task_of "$J" "machine [0-9]+ of 2 .*ranks" | head -1)
       for s in $(grep -E "^[0-9]+: .*machine [0-9]+ of 2 " "$(out_of "$J")" | cut -d: -f1); do
         grep -qE "^$s: .*this node runs the master" "$(out_of "$J")" || t=$s
       done
  fi
  victim=$(host_of_task "$J" "$t")
  host_kill "$victim"
  slurm_wait_state "$J" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 180
  for s in 0 1 2; do [ "$s" != "$t" ] && survivors="$survivors $s"; done
  local ends=0 models
  for s in $survivors; do grep -qE "^$s: \[deadpool\] done" "$(out_of "$J")" && ends=$((ends + 1)); done
  models=$(model_hosts "$J" | grep -vx "$victim" | wc -l)
  host_restart "$victim" && slurm_node_up "$victim" >/dev/null
  slurm_wait_idle 60
  if [ "$ends" -eq 2 ] && [ "$models" -eq 2 ] && grep -q 'recovery of' "$(out_of "$J")"; then
    ok "$name (job $J, node$victim crashed: task $t; $(grep -oE 'resumed after [0-9]+ ms' "$(out_of "$J")" | head -1); $(took))"
  else notok "$name" "job $J $(slurm_job_state "$J"): node$victim (task $t) crashed; $ends surviving tasks ended, $models models identical" \
    "$(grep -vE '^[0-9]+: step' "$(out_of "$J")" | tail -25)" "$(slurm_explain "$J")"; fi
}
crash_case slurm_node_crash_spare_node_takes_over ranks
crash_case slurm_redis_master_node_crash master

# 4. scancel with the job's signal (USR1, as --signal=USR1@60 sends it before the time limit):
#    every node writes the newest committed step to its own --out and the job ends; `scontrol
#    requeue` runs it again (SLURM_RESTART_COUNT 1, the same job id) on other nodes (node1
#    drained: node2..node4, node4 with an empty disk): it resumes from those local checkpoints,
#    ranks whose state is on another node fetch it, and it ends byte-identical.
J=$(submit)
slurm_wait_state "$J" RUNNING 90
echo "# job $J running: $(took)$(slurm_exec squeue -h -j "$J" -o ' (%r)' 2>/dev/null)"
kept="" resumed="" st1="" models=0 nodes2="" rq="" why=""
if ! wait_step "$J" 70; then why="the first run did not reach step 70"
else
  slurm_exec scancel --signal=USR1 "$J"
  # the first run's end: its state once every node has finished it (no longer COMPLETING)
  slurm_wait_state "$J" "COMPLETED|FAILED|CANCELLED" 90 || why="the first run did not end after USR1"
  st1=$(slurm_job_state "$J")
  cp "$(out_of "$J")" "$WORK/first-$J.out"
  kept=$(grep -oE 'step [0-9]+ is on disk' "$WORK/first-$J.out" | grep -oE '[0-9]+' | head -1)
  # A requeue is refused, or without effect, while the job's nodes are still completing it: so
  # first every node idle (before node1 is drained: drained is not idle), then the requeue,
  # retried until the job is pending again (90 s at most; in the full suite 30 s were once too few)
  slurm_wait_idle 60
  slurm_exec scontrol update nodename=node1 state=drain reason=e2e_slurm
  # Requeued once; Slurm holds it back until the first run's credential has expired
  # (lib_slurm.sh: cred_expire), then starts it on node2..node4.
  if [ -z "$why" ] && ! rq=$(slurm_exec scontrol requeue "$J" 2>&1); then why="scontrol requeue refused it: $rq"; fi
  if [ -z "$why" ]; then
    echo "# job $J: stopped by USR1 and requeued: $(took)"
    slurm_wait_state "$J" "RUNNING|COMPLETED" 60 || why="the requeued job did not start"
    slurm_wait_state "$J" "COMPLETED|FAILED|CANCELLED" 180 || why="the requeued job did not end"
  fi
  nodes2=$(grep -oE 'requeued\), --nnodes 2 \(3 node\(s\) [a-z0-9.]+' "$(out_of "$J")" | head -1 | awk '{print $NF}')
  slurm_exec scontrol update nodename=node1 state=resume
  resumed=$(grep -oE 'resuming from the checkpoint of step [0-9]+' "$(out_of "$J")" | grep -oE '[0-9]+' | head -1)
  models=$(model_hosts "$J" | wc -l)
fi
if [ -z "$why" ] && [ -n "$kept" ] && [ "$kept" -gt 50 ] && [ "$resumed" = "$kept" ] && [ "$models" -ge 2 ] && [ "$nodes2" = "node2..node4" ] \
   && [ "$(slurm_job_state "$J")" = COMPLETED ] && grep -q 'requeued (SLURM_RESTART_COUNT 1)' "$(out_of "$J")"; then
  ok "slurm_signal_then_requeue_resumes (job $J: step $kept kept on USR1, resumed from it on $nodes2 after the requeue; $(took))"
else notok "slurm_signal_then_requeue_resumes" "job $J: ${why:+$why; }first run $st1, kept step '${kept}', resumed from '${resumed}', $models identical models, now $(slurm_job_state "$J") on '$nodes2'" \
  "$(grep -vE '^[0-9]+: step' "$WORK/first-$J.out" 2>/dev/null | tail -12)" "--- requeued:" "$(grep -vE '^[0-9]+: step' "$(out_of "$J")" | tail -15)" \
  "$(slurm_explain "$J")"; fi

# 5. `scontrol requeue` of a running job before its first checkpoint (Slurm kills every task:
#    SIGTERM, SIGKILL after KillWait): no node has a complete checkpoint, so the requeued run
#    (the same job id) starts from step 1, deliberately and saying so, and ends byte-identical.
J=$(submit)
fresh="" models=0 why=""
if ! wait_step "$J" 10; then why="the first run did not reach step 10"
elif ! rq=$(slurm_exec scontrol requeue "$J" 2>&1); then why="scontrol requeue refused it: $rq"
else
  # Slurm ends every task, then holds the job back until the first run's credential expired
  slurm_wait_state "$J" "PENDING" 60 || why="the job was not pending after the requeue"
  cp "$(out_of "$J")" "$WORK/first-$J.out" 2>/dev/null
  slurm_wait_state "$J" "RUNNING|COMPLETED" 60 || why="the requeued job did not start"
  slurm_wait_state "$J" "COMPLETED|FAILED|CANCELLED" 180 || why="the requeued job did not end"
  fresh=$(grep -c "requeued job $J: no complete checkpoint .*starting from step 1" "$(out_of "$J")")
  models=$(model_hosts "$J" | wc -l)
fi
if [ -z "$why" ] && [ "${fresh:-0}" -ge 1 ] && [ "$models" -ge 2 ] && [ "$(slurm_job_state "$J")" = COMPLETED ]; then
  ok "slurm_requeue_before_a_checkpoint_starts_fresh (job $J; $(took))"
else notok "slurm_requeue_before_a_checkpoint_starts_fresh" "job $J: ${why:+$why; }fresh '$fresh', $models identical models, now $(slurm_job_state "$J")" \
  "$(grep -vE '^[0-9]+: step' "$(out_of "$J")" | tail -15)" "$(slurm_explain "$J")"; fi
