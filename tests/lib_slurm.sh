# lib_slurm.sh — a Slurm cluster (Debian's slurm-wlm 22.05 + munge) on lib_hosts machines, for
# the end-to-end tests (sourced after lib_e2e.sh and lib_hosts.sh, in the test's main shell;
# needs root and `scripts/install-deps.sh --test`).
#
#   slurm_available || { echo "ok - NAME # SKIP no slurmctld/slurmd/munged"; exit 0; }
#   hosts_create 5 && slurm_create 4 || exit 1  # host 0: munged + slurmctld; hosts 1..4: munged + slurmd
#   slurm_exec sbatch --parsable job.sbatch     # any Slurm command, run inside host 0
#   slurm_wait_state JOBID COMPLETED 120        # bounded; says what it saw when it gives up
#   slurm_explain JOBID                         # scontrol show job + the controller's log of it
#   host_kill 2                                 # node2 crashes (its slurmd and its tasks with it)
#   slurm_node_up 2                             # after host_restart 2: its munged and slurmd again
#   slurm_destroy                               # the daemons, bounded (hosts_destroy does the rest)
#
# Nothing in the root namespace talks to the cluster: every daemon and every command runs in a
# host (host_spawn, host_exec). The configuration is uniform across hosts:
# - munge: one key made here (1024 random bits, owned by the munge user, 0400); in every host
#   its own directories are bind-mounted (in the host's private mount namespace) on /etc/munge,
#   /var/lib/munge, /var/log/munge and /run/munge, so each host's munged runs as the munge user
#   with Debian's default paths and socket, and Slurm finds it there.
# - Slurm: SLURM_CONF=$HOSTS_BASE/slurm/slurm.conf for every daemon and command (sbatch passes
#   it on to the job's environment); slurmctld's state and log are in host 0's private
#   directory; a slurmd's spool, log and pid file are in $HOSTS_BASE/slurm/%n, a link to its
#   host's private directory (so only that host reaches them, and a host_kill leaves them on
#   its disk). proctrack/linuxproc, task/none, no cgroups, SlurmUser=root, select/linear (whole
#   nodes), short timeouts, ReturnToService=2 (a node that comes back is usable again).
#   AuthInfo=cred_expire=10: a requeued job is held back (Reason=BeginTime) until the first
#   run's job credential has expired, cred_expire + 1 s (120 + 1 by default); the tests wait
#   for that hold instead of lifting it. Lifting it (`scontrol update starttime=now`) launched
#   the new run within the wall-clock second in which the slurmds had revoked the old run's
#   credential, and a slurmd refuses every credential created in or before that second:
#   "Killing non-startable batch JobId=4: Job credential revoked" (issue 44).
#   SchedulerParameters=sched_interval=2: a job whose hold ends is started by the main
#   scheduling loop, every 60 s by default (no event wakes it then); every 2 s here.
# - A node-local disk: SLURM_LOCAL ($HOSTS_BASE/local) is, in every host, its own private
#   directory ${HOST_DIR[i]}/local (like a cluster node's /tmp): the same path on every node, no
#   file shared. The root namespace sees host i's at ${HOST_DISK[i]}/local.
# Logs, as the root namespace sees them: ${HOST_DISK[0]}/slurm/slurmctld.log,
# ${HOST_DISK[i]}/slurm/slurmd.log, ${HOST_DISK[i]}/munge/log/munged.log.
set -u

SLURM_NODES=0; SLURM_DIR=; SLURM_LOCAL=; SLURM_CTLD_PID=; SLURMD_PID=(); MUNGED_PID=()

# slurm_available — 0 if slurmctld, slurmd, munged and the client commands are installed.
slurm_available() {
  local c
  for c in slurmctld slurmd munged munge sbatch srun squeue scontrol scancel sinfo runuser; do
    command -v "$c" >/dev/null 2>&1 || return 1
  done
  id munge >/dev/null 2>&1
}

# slurm_exec CMD... — CMD inside host 0 (the controller's machine) with the cluster's SLURM_CONF,
# bounded to 30 s.
slurm_exec() { host_exec 0 env SLURM_CONF="$SLURM_DIR/slurm.conf" timeout -k 2 30 "$@"; }

# _slurm_munge_up I — host I's munge directories mounted, its munged running (5 s bound).
_slurm_munge_up() {
  local i=$1 d="${HOST_DIR[$1]}/munge" k
  mkdir -p /run/munge # the mount point (what the munge package's service would create)
  mkdir -p "${HOST_DISK[$i]}/local"
  host_exec "$i" mount --bind "${HOST_DIR[$i]}/local" "$SLURM_LOCAL" || return 1
  host_exec "$i" sh -c 'set -e; d=$1; key=$2
    mkdir -p "$d/etc" "$d/lib" "$d/log" "$d/run"
    cp "$key" "$d/etc/munge.key"
    chown -R munge:munge "$d"; chmod 0700 "$d/etc" "$d/lib" "$d/log"; chmod 0755 "$d/run"; chmod 0400 "$d/etc/munge.key"
    mount --bind "$d/etc" /etc/munge; mount --bind "$d/lib" /var/lib/munge
    mount --bind "$d/log" /var/log/munge; mount --bind "$d/run" /run/munge' sh "$d" "$SLURM_DIR/munge.key" || return 1
  host_spawn "$i" "$SLURM_DIR/munged.$i.out" runuser -u munge -- munged --foreground --num-threads 2
  MUNGED_PID[$i]=$HOST_SPAWN_PID
  for k in $(seq 100); do
    host_exec "$i" sh -c 'munge -n | unmunge' >/dev/null 2>&1 && return 0
    kill -0 "${MUNGED_PID[$i]}" 2>/dev/null || break
    sleep 0.05
  done
  _hosts_err "host $i: munged did not start: $(tail -3 "$SLURM_DIR/munged.$i.out" "${HOST_DISK[$i]}/munge/log/munged.log" 2>/dev/null)"
  return 1
}

# slurm_node_up I — host I (1..N) as a Slurm node: munged, then slurmd; waits (30 s) until the
# controller sees it idle or allocated. Also after host_restart I.
slurm_node_up() {
  local i=$1 k st
  _slurm_munge_up "$i" || return 1
  mkdir -p "${HOST_DISK[$i]}/slurm/spool"
  host_spawn "$i" "$SLURM_DIR/slurmd.$i.out" env SLURM_CONF="$SLURM_DIR/slurm.conf" slurmd -D -N "node$i"
  SLURMD_PID[$i]=$HOST_SPAWN_PID
  for k in $(seq 300); do
    st=$(slurm_exec sinfo -h -n "node$i" -o %T 2>/dev/null)
    case "$st" in idle|allocated|mixed) return 0 ;; esac # a '*' says it does not answer (yet)
    # a node seen down before its slurmd registered again stays down until told otherwise
    [ $((k % 20)) -eq 19 ] && case "$st" in down*|idle\*|*drain*) slurm_exec scontrol update nodename="node$i" state=resume >/dev/null 2>&1 ;; esac
    kill -0 "${SLURMD_PID[$i]}" 2>/dev/null || break
    sleep 0.1
  done
  _hosts_err "node$i did not come up (state '$st'): $(tail -3 "$SLURM_DIR/slurmd.$i.out" "${HOST_DISK[$i]}/slurm/slurmd.log" 2>/dev/null)"
  return 1
}

# slurm_create N — the cluster on hosts 0..N (hosts_create N+1 first): slurmctld in host 0,
# slurmd node1..nodeN in hosts 1..N. Non-zero with a message when it does not come up (30 s
# per daemon).
slurm_create() {
  local n=${1:-4} i k
  SLURM_NODES=$n
  SLURM_DIR="$HOSTS_BASE/slurm"
  SLURM_LOCAL="$HOSTS_BASE/local"
  mkdir -p "$SLURM_DIR" "$SLURM_LOCAL" "${HOST_DISK[0]}/slurm/state"
  head -c 128 /dev/urandom >"$SLURM_DIR/munge.key"; chmod 0400 "$SLURM_DIR/munge.key"
  for ((i = 1; i <= n; i++)); do ln -sfn "${HOST_DIR[$i]}/slurm" "$SLURM_DIR/node$i"; done
  local nodes=""
  for ((i = 1; i <= n; i++)); do nodes="${nodes}NodeName=node$i NodeAddr=${HOST_ADDR[$i]} State=UNKNOWN
"; done
  cat >"$SLURM_DIR/slurm.conf" <<EOF
ClusterName=dptest
SlurmctldHost=node0(${HOST_ADDR[0]})
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
StateSaveLocation=${HOST_DIR[0]}/slurm/state
SlurmctldLogFile=${HOST_DIR[0]}/slurm/slurmctld.log
SlurmctldPidFile=${HOST_DIR[0]}/slurm/slurmctld.pid
SlurmdSpoolDir=$SLURM_DIR/%n/spool
SlurmdLogFile=$SLURM_DIR/%n/slurmd.log
SlurmdPidFile=$SLURM_DIR/%n/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/linear
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdTimeout=5
SlurmctldTimeout=10
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=300
JobRequeue=1
SlurmctldDebug=info
SlurmdDebug=info
$nodes
PartitionName=test Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd loads a cgroup plugin even when nothing uses cgroups; inside a host /sys is the
  # network namespace's own sysfs, with no cgroup file system to autodetect: name one.
  echo "CgroupPlugin=cgroup/v1" >"$SLURM_DIR/cgroup.conf"
  _slurm_munge_up 0 || return 1
  host_spawn 0 "$SLURM_DIR/slurmctld.out" env SLURM_CONF="$SLURM_DIR/slurm.conf" slurmctld -D -i
  SLURM_CTLD_PID=$HOST_SPAWN_PID
  for k in $(seq 300); do
    slurm_exec scontrol ping 2>/dev/null | grep -q UP && break
    kill -0 "$SLURM_CTLD_PID" 2>/dev/null || break
    sleep 0.1
  done
  if ! slurm_exec scontrol ping 2>/dev/null | grep -q UP; then
    _hosts_err "slurmctld did not start: $(tail -3 "$SLURM_DIR/slurmctld.out" "${HOST_DISK[0]}/slurm/slurmctld.log" 2>/dev/null)"
    return 1
  fi
  for ((i = 1; i <= n; i++)); do slurm_node_up "$i" || return 1; done
}

# slurm_job_state JOBID — the job's state (PENDING, RUNNING, COMPLETED, CANCELLED, ...).
slurm_job_state() { slurm_exec scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

# slurm_wait_state JOBID STATE [TIMEOUT_S=60] — until the job is in STATE (a regex); after the
# timeout, says on stderr what it saw last and returns 1.
slurm_wait_state() {
  local j=$1 want=$2 limit=${3:-60} end st=""
  end=$((SECONDS + limit))
  while [ "$SECONDS" -lt "$end" ]; do
    st=$(slurm_job_state "$j")
    [[ $st =~ ^($want)$ ]] && return 0
    sleep 0.2
  done
  echo "# slurm_wait_state: job $j is '$st' after ${limit} s, not ($want)" >&2
  return 1
}

# slurm_explain JOBID — what Slurm knows of the job, for a failure to explain itself: its
# record (scontrol show job) and the controller's log lines that name it.
slurm_explain() {
  echo "--- scontrol show job $1:"
  slurm_exec scontrol show job "$1" 2>&1 | sed 's/^ */  /'
  echo "--- slurmctld.log, JobId=$1:"
  grep -E "JobId=$1([^0-9]|$)|job_?id[ =]$1([^0-9]|$)" "${HOST_DISK[0]}/slurm/slurmctld.log" 2>/dev/null | tail -40
}

# slurm_wait_idle [TIMEOUT_S=60] — until every node is idle (no job completing on any): what
# a job that needs them all may count on. After the timeout, says on stderr which nodes were
# not and returns 1.
slurm_wait_idle() {
  local limit=${1:-60} end all busy="no answer from sinfo"
  end=$((SECONDS + limit))
  while [ "$SECONDS" -lt "$end" ]; do
    all=$(slurm_exec sinfo -h -N -o '%N %T' 2>/dev/null)
    if [ -n "$all" ]; then busy=$(echo "$all" | grep -v ' idle$'); [ -z "$busy" ] && return 0; fi
    sleep 0.2
  done
  echo "# slurm_wait_idle: after ${limit} s, not idle: $(echo "$busy" | tr '\n' ' ')" >&2
  return 1
}

# slurm_destroy — stops the daemons (TERM, then KILL after 10 s) of the hosts still up.
slurm_destroy() {
  local i p
  for p in "$SLURM_CTLD_PID" "${SLURMD_PID[@]}" "${MUNGED_PID[@]}"; do
    [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
  done
  for p in "$SLURM_CTLD_PID" "${SLURMD_PID[@]}" "${MUNGED_PID[@]}"; do
    [ -n "$p" ] && { host_wait "$p" 10 >/dev/null 2>&1 || kill -KILL "$p" 2>/dev/null; }
  done
  SLURM_CTLD_PID=; SLURMD_PID=(); MUNGED_PID=()
  return 0
}
