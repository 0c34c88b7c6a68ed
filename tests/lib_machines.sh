# lib_machines.sh — a job across simulated machines for the end-to-end tests (sourced after
# lib_e2e.sh and lib_hosts.sh, in the test's main shell): host 0 runs Redis (with a password),
# hosts 1.. are machines; the single-machine reference model of the same world; helpers to
# start a machine's launcher, wait for a step, collect the launchers and check that nothing is
# left. Needs root (hosts_available).
hosts_create "${MACHINES_HOSTS:-4}" || { notok "hosts_create" "cannot build the simulated machines"; exit 1; }

# The job's program: the built-in trainer's tiny model, or MACHINES_PROGRAM (an array: the
# program after --, writing MACHINES_MODEL_FILE) for MACHINES_STEPS steps.
STEPS=${MACHINES_STEPS:-240}
MODEL_FILE=${MACHINES_MODEL_FILE:-model.bin}
if [ -n "${MACHINES_PROGRAM+x}" ]; then TRAIN=(); PROG=(-- "${MACHINES_PROGRAM[@]}"); else TRAIN=(--model tiny); PROG=(); fi
COMMON=(--nnodes 2 --nproc-per-node 2 "${TRAIN[@]}" --steps "$STEPS" --seed 7 --secret-file "$SECRET_FILE")
export DEADPOOL_REDIS_PASSWORD="e2e-$$-$RANDOM"
REDIS_PORT=6399
host_spawn 0 "$WORK/redis.log" redis-server --port "$REDIS_PORT" --bind "${HOST_ADDR[0]}" --save '' \
  --appendonly no --requirepass "$DEADPOOL_REDIS_PASSWORD"
REDIS_URL="redis://${HOST_ADDR[0]}:$REDIS_PORT"
redis_up() { host_exec 0 redis-cli -h "${HOST_ADDR[0]}" -p "$REDIS_PORT" --no-auth-warning -a "$DEADPOOL_REDIS_PASSWORD" ping 2>/dev/null | grep -q PONG; }
for _ in $(seq 100); do redis_up && break; sleep 0.05; done
redis_up || { notok "redis" "redis-server did not start in host 0" "$(tail -3 "$WORK/redis.log")"; exit 1; }

# The single-machine reference: the same world (4 ranks), seed and steps, on loopback.
run_job "$WORK/ref" 300 --workers 4 --spares 0 "${TRAIN[@]}" --steps "$STEPS" --seed 7 "${PROG[@]}"
REF="$WORK/ref/$MODEL_FILE"
[ -s "$REF" ] || { notok "reference_run" "$(tail -3 "$WORK/ref.log")"; exit 1; }

LAUNCHER=()  # HOST_SPAWN_PID of each machine's launcher, by host
# start_machine HOST JOB [ARGS] — `deadpool run` on that host with its private --out; waits
# (30 s) until it has joined, so that machines join in the order they are started.
start_machine() {
  local h=$1 job=$2 k; shift 2
  host_spawn "$h" "$WORK/$job.h$h.log" timeout -k 5 240 "$DP" run "${COMMON[@]}" --redis "$REDIS_URL" --job "$job" \
    --out "${HOST_DIR[$h]}/$job" --bind "${HOST_ADDR[$h]}" "$@" "${PROG[@]}"
  LAUNCHER[$h]=$HOST_SPAWN_PID
  for k in $(seq 600); do
    grep -q 'joined job' "$WORK/$job.h$h.log" 2>/dev/null && return 0
    kill -0 "$HOST_SPAWN_PID" 2>/dev/null || break
    sleep 0.05
  done
  # the callers go on regardless: say what was seen
  echo "# start_machine: waited up to 30 s for host $h to join job $job: launcher $(kill -0 "$HOST_SPAWN_PID" 2>/dev/null && echo running || echo exited) (last: '$(tail -1 "$WORK/$job.h$h.log" 2>/dev/null)')" >&2
  return 1
}
# wait_step JOB HOST N — until that machine's launcher printed step N (60 s bound).
wait_step() {
  local f="$WORK/$1.h$2.log" k
  for k in $(seq 1200); do
    grep -qE "^step +[0-9]+/" "$f" 2>/dev/null && [ "$(grep -oE '^step +[0-9]+' "$f" | tail -1 | grep -oE '[0-9]+')" -ge "$3" ] && return 0
    sleep 0.05
  done
  echo "# wait_step: waited 60 s for host $2 to print step $3 of job $1: last step '$(grep -oE '^step +[0-9]+' "$f" 2>/dev/null | tail -1 | grep -oE '[0-9]+')', launcher $(kill -0 "${LAUNCHER[$2]:-}" 2>/dev/null && echo running || echo exited)" >&2
  return 1
}
# finish HOST... — waits (bounded) for those launchers; their statuses in RCS.
finish() { RCS=""; local h; for h in "$@"; do host_wait "${LAUNCHER[$h]}" 120; RCS="$RCS $?"; done; }
# clean — no process left in any machine (the hosts' init aside).
clean() {
  local h p left=""
  for ((h = 1; h < ${#HOST_INIT[@]}; h++)); do
    for p in $(host_procs "$h"); do
      [ "$p" = "${HOST_INIT[$h]}" ] && continue
      # init's own `sleep` (it waits on it to reap orphans)
      [ "$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null)" = "${HOST_INIT[$h]}" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sleep ] && continue
      left="$left $h:$p"
    done
  done
  [ -z "$left" ] || { echo "  left:$left"; ps -o pid,args -p "$(echo "$left" | sed 's/ [0-9]*:/,/g; s/^,//')" 2>/dev/null; return 1; }
}
same() { cmp -s "$REF" "$1"; }
# events JOB [HOST] — the job's events as the coordinating machine (host 1 by default) wrote them.
events() { cat "${HOST_DISK[${2:-1}]}/$1/events.jsonl" 2>/dev/null; }

