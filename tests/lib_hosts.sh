# lib_hosts.sh — simulated hosts for multi-node tests (sourced; needs root).
#
# Each host is a network namespace with its own UTS (hostname), PID and mount namespace and a
# private directory; the hosts hang off a bridge that lives in a network namespace of its own;
# each host has one veth (eth0 inside, hN on the bridge) and one IPv4 address in a private /24,
# no default route. Nothing in the root namespace has an address in that /24: whatever talks to
# a host must run inside a host (host_exec, host_spawn).
#
#   source tests/lib_hosts.sh            # after lib_e2e.sh: HOSTS_BASE goes under its WORK
#   hosts_available || { echo "ok - NAME # SKIP no network namespaces"; exit 0; }
#   hosts_create 3 || exit 1
#   host_exec 1 redis-cli -h "${HOST_ADDR[0]}" ping          # or -h node0
#   host_spawn 0 "$WORK/h0.log" redis-server --bind "${HOST_ADDR[0]}"; pid=$HOST_SPAWN_PID
#   host_kill 0                          # the machine crashes: everything in it dies at once
#   wait "$pid"                          # 137
#   hosts_destroy                        # also run on EXIT
#
# API (each function's comment below has the details):
#   hosts_available        0 if namespaces can be made here (root, tools, a trial run); cached
#   hosts_create N         hosts 0..N-1: HOST_NS[i] HOST_INIT[i] HOST_ADDR[i] HOST_NAME[i]
#                          HOST_DIR[i] HOST_DISK[i]; HOSTS_NET (a.b.c of the /24), HOSTS_BRIDGE_NS,
#                          HOSTS_BASE, HOSTS_PREFIX. Host i: eth0 = HOSTS_NET.(10+i), name nodeI.
#   host_exec I CMD...     CMD in host I, foreground; its status
#   host_spawn I LOG CMD.. CMD in host I, background; sets HOST_SPAWN_PID (wait for it) and
#                          HOST_SPAWN_CMD (CMD's own global pid); prints nothing
#   host_wait PID [S]      bounded wait (default 30 s): the status, 124 on timeout
#   host_kill I            SIGKILL to host I's pid 1; waits until its pid namespace is empty
#   host_restart I         boots a killed host again (same netns, address, name, disk)
#   host_link_down I / host_link_up I   its bridge port down / up
#   host_procs I           global pids of host I's processes
#   hosts_destroy          everything down and deleted; 1 and a list if anything is left
#   hosts_clean_stale      deletes namespaces left by a run killed with SIGKILL
#
# Call hosts_create, host_spawn and hosts_destroy from the test's main shell (not in $(...) or a
# pipeline): they keep processes that must be children of that shell. Never signal HOST_INIT or
# HOST_SPAWN_CMD pids after their host died: global pids are recycled quickly (pid_max 32768).
#
# How a host is built: `ip netns add NS` (the network namespace outlives its processes), then
#   setpriv --pdeathsig KILL ip netns exec NS unshare --pid --uts --mount --fork
#           --kill-child=SIGKILL --mount-proc --propagation private bash -c SETUP
# in the background (disowned). unshare's forked child is the host's pid 1 ("init", HOST_INIT[i]
# is its global pid); it sets the hostname, mounts the private directory and a /etc/hosts that
# names every host, then loops `sleep 3600 & wait` (it reaps orphans; ignores TERM/INT/HUP).
# If the test's shell dies, even by SIGKILL, unshare gets SIGKILL (pdeathsig) and so does init
# (--kill-child): no host process outlives the test (only the namespace names would).
# Commands enter a host with `nsenter --target INIT --pid --uts --mount --net`, which forks (a
# process cannot move itself into a pid namespace, only its children), so the command runs in
# the host's pid namespace and sees the host's /proc.
#
# Private directory: the backing directory HOST_DISK[i] (under HOSTS_BASE, visible to the root
# namespace for inspection, survives host_kill like a disk survives a crash) is bind-mounted on
# HOST_DIR[i] inside host i's mount namespace only, and HOSTS_BASE/disk is covered by an empty
# read-only tmpfs there: in host i, HOST_DIR[i] holds its files; HOST_DIR[j] (j != i) is an
# empty directory; the other disks are not reachable. Everything else (/work, /usr, /tmp, WORK)
# is the same file system as in the root namespace.
set -u

if [ -z "${_HOSTS_SOURCED:-}" ]; then # sourcing it again keeps the state of live hosts
  HOST_NS=(); HOST_INIT=(); HOST_ADDR=(); HOST_NAME=(); HOST_DIR=(); HOST_DISK=()
  HOST_SPAWN_PID=; HOST_SPAWN_CMD=
  HOSTS_BRIDGE_NS=; HOSTS_PREFIX=; HOSTS_NET=; HOSTS_BASE=
  _HOST_PIDNS=(); _HOST_NETINO=(); _HOST_LAUNCHER=(); _HOST_UP=(); _HOSTS_MADE=()
  _HOSTS_N=0; _HOSTS_AVAILABLE=; _HOSTS_TRAPPED=; _HOSTS_PREV_EXIT=; _HOSTS_BRNETINO=
  _HOSTS_SOURCED=1
fi

_hosts_err() { echo "lib_hosts: $*" >&2; }

# _hosts_now_us — wall clock in microseconds.
_hosts_now_us() { if [ -n "${EPOCHREALTIME:-}" ]; then echo "${EPOCHREALTIME//[.,]/}"; else echo $(( $(date +%s%N) / 1000 )); fi; }

# _hosts_until TIMEOUT_S CMD... — runs CMD every 20 ms until it succeeds; 1 after TIMEOUT_S
# seconds of wall-clock time.
_hosts_until() {
  local limit=$1; shift
  local end=$(( $(_hosts_now_us) + limit * 1000000 ))
  while :; do
    "$@" && return 0
    [ "$(_hosts_now_us)" -lt "$end" ] || return 1
    sleep 0.02
  done
}

# hosts_available — 0 if network, pid, uts and mount namespaces can be made here (root, ip,
# unshare, nsenter, setpriv, a bridge and a veth pair). The result is cached.
hosts_available() {
  if [ -n "$_HOSTS_AVAILABLE" ]; then return "$_HOSTS_AVAILABLE"; fi
  _HOSTS_AVAILABLE=1
  [ "$(id -u)" -eq 0 ] || return 1
  local c
  for c in ip unshare nsenter setpriv pgrep find; do command -v "$c" >/dev/null 2>&1 || return 1; done
  local p="dph$$probe$RANDOM" ok=1
  if ip netns add "$p" 2>/dev/null; then
    ip -n "$p" link add dphbr type bridge 2>/dev/null \
      && ip -n "$p" link add dphv0 type veth peer name dphv1 2>/dev/null \
      && ip -n "$p" link set dphv0 master dphbr 2>/dev/null \
      && timeout 5 ip netns exec "$p" unshare --pid --uts --mount --fork --kill-child=SIGKILL --mount-proc \
           --propagation private sh -c 'hostname dphprobe' >/dev/null 2>&1 \
      && ok=0
    ip netns del "$p" 2>/dev/null
  fi
  _HOSTS_AVAILABLE=$ok
  return "$ok"
}

# hosts_clean_stale — deletes the namespaces (dphPID-*, dphPIDrN-*) left by a run whose shell
# PID is gone (killed with SIGKILL: its host processes died with it, its names stayed) and that
# no process uses any more. hosts_create calls it.
hosts_clean_stale() {
  local ns pid ino
  for ns in $(ip netns list 2>/dev/null | cut -d' ' -f1); do
    [[ $ns =~ ^dph([0-9]+)(r[0-9]+)?-(br|[0-9]+)$ ]] || continue
    pid=${BASH_REMATCH[1]}
    [ -d "/proc/$pid" ] && continue
    ino=$(stat -L -c %i "/run/netns/$ns" 2>/dev/null) || continue
    [ -z "$(find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/net' -lname "net:\\[$ino\\]" -print -quit 2>/dev/null)" ] || continue
    ip netns del "$ns" 2>/dev/null && echo "# lib_hosts: deleted stale network namespace $ns" >&2
  done
  return 0
}

# _hosts_up I — host I's init is running and is the one we started (guards against pid reuse).
_hosts_up() {
  [ "${_HOST_UP[$1]:-0}" = 1 ] || return 1
  [ "$(readlink "/proc/${HOST_INIT[$1]}/ns/pid" 2>/dev/null)" = "${_HOST_PIDNS[$1]}" ]
}

# _hosts_child_alive PID — PID is a live (not zombie) child of this shell.
_hosts_child_alive() {
  [ -n "${1:-}" ] || return 1
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  set -- $st
  [ "$1" != Z ] && [ "$2" = "$$" ]
}

_hosts_check() {
  local i=${1:-}
  if ! [[ $i =~ ^[0-9]+$ ]] || [ "$i" -ge "$_HOSTS_N" ]; then _hosts_err "no host '$i'"; return 2; fi
  if ! _hosts_up "$i"; then _hosts_err "host $i is down"; return 125; fi
}

# _hosts_boot I — starts host I's init in its (existing) network namespace; sets HOST_INIT[I].
_hosts_boot() {
  local i=$1 setup
  rm -f "$HOSTS_BASE/ready.$i"
  # Runs as the host's pid 1. $1 hostname, $2 private dir, $3 its backing dir, $4 disks, $5 hosts file, $6 ready file.
  setup='hostname "$1" && mount --bind "$3" "$2" && mount -t tmpfs -o ro,size=4k,mode=0755 dph-hidden "$4" \
    && mount --bind "$5" /etc/hosts && echo ready >"$6" || exit 1
    trap "" TERM INT HUP
    while :; do sleep 3600 & wait; done'
  setpriv --pdeathsig KILL ip netns exec "${HOST_NS[$i]}" \
    unshare --pid --uts --mount --fork --kill-child=SIGKILL --mount-proc --propagation private \
    bash -c "$setup" dph-init "${HOST_NAME[$i]}" "${HOST_DIR[$i]}" "${HOST_DISK[$i]}" "$HOSTS_BASE/disk" \
    "$HOSTS_BASE/hosts" "$HOSTS_BASE/ready.$i" </dev/null >>"$HOSTS_BASE/init.$i.log" 2>&1 &
  _HOST_LAUNCHER[$i]=$!
  disown "$!"
  local l=$! init=
  _hosts_init_of() { init=$(pgrep -P "$l" 2>/dev/null | head -1); [ -n "$init" ]; }
  if ! _hosts_until 5 _hosts_init_of; then
    _hosts_err "host $i: init did not start: $(tail -3 "$HOSTS_BASE/init.$i.log" 2>/dev/null)"; return 1
  fi
  HOST_INIT[$i]=$init
  _HOST_PIDNS[$i]=$(readlink "/proc/$init/ns/pid" 2>/dev/null)
  if ! _hosts_until 5 test -s "$HOSTS_BASE/ready.$i" || [ -z "${_HOST_PIDNS[$i]}" ] \
     || [ "${_HOST_PIDNS[$i]}" = "$(readlink /proc/self/ns/pid)" ]; then
    _hosts_err "host $i: init not ready: $(tail -3 "$HOSTS_BASE/init.$i.log" 2>/dev/null)"; return 1
  fi
  _HOST_UP[$i]=1
}

# hosts_create N — hosts 0..N-1 and the bridge namespace; sets HOST_NS[i] (netns name),
# HOST_INIT[i] (global pid of the host's pid 1), HOST_ADDR[i] (IPv4), HOST_NAME[i] (hostname
# nodeI, also in the hosts' /etc/hosts), HOST_DIR[i] (private directory, same path inside the
# host), HOST_DISK[i] (its backing directory as the root namespace sees it), HOSTS_NET (the /24),
# HOSTS_BRIDGE_NS. Non-zero with a message on failure, after cleaning up.
hosts_create() {
  local n=${1:-3} i
  if [ "$_HOSTS_N" -gt 0 ]; then _hosts_err "hosts already created"; return 1; fi
  if [ "$BASHPID" != "$$" ]; then _hosts_err "hosts_create must run in the test's main shell"; return 1; fi
  if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then _hosts_err "bad host count '$n'"; return 1; fi
  hosts_available || { _hosts_err "network namespaces unavailable"; return 1; }
  hosts_clean_stale
  HOST_NS=(); HOST_INIT=(); HOST_ADDR=(); HOST_NAME=(); HOST_DIR=(); HOST_DISK=()
  _HOST_PIDNS=(); _HOST_NETINO=(); _HOST_LAUNCHER=(); _HOST_UP=(); _HOSTS_BRNETINO=; _HOSTS_MADE=()
  HOSTS_PREFIX="dph$$"
  _hosts_taken() { local k; [ -e "/run/netns/$HOSTS_PREFIX-br" ] && return 0
    for ((k = 0; k < n; k++)); do [ -e "/run/netns/$HOSTS_PREFIX-$k" ] && return 0; done; return 1; }
  while _hosts_taken; do HOSTS_PREFIX="dph$$r$RANDOM"; done
  HOSTS_NET="10.213.$(( $$ % 254 + 1 ))"
  if [ -n "${WORK:-}" ] && [ -d "${WORK:-}" ]; then HOSTS_BASE=$(mktemp -d "$WORK/hosts.XXXXXX")
  else HOSTS_BASE=$(mktemp -d /tmp/dph_hosts_XXXXXX); fi
  mkdir -p "$HOSTS_BASE/disk"
  HOSTS_BRIDGE_NS="$HOSTS_PREFIX-br"
  # teardown on EXIT, then whatever EXIT trap was there (an EXIT trap set after this replaces
  # ours: such a trap must call hosts_destroy itself)
  if [ -z "$_HOSTS_TRAPPED" ] || [[ $(trap -p EXIT) != *_hosts_on_exit* ]]; then
    _HOSTS_PREV_EXIT=$(trap -p EXIT)
    [[ $_HOSTS_PREV_EXIT == *_hosts_on_exit* ]] && _HOSTS_PREV_EXIT=
    trap '_hosts_on_exit' EXIT
    _HOSTS_TRAPPED=1
  fi
  _HOSTS_N=$n
  { cat /etc/hosts 2>/dev/null || echo "127.0.0.1 localhost"; } >"$HOSTS_BASE/hosts"
  for ((i = 0; i < n; i++)); do
    HOST_NS[$i]="$HOSTS_PREFIX-$i"; HOST_NAME[$i]="node$i"; HOST_ADDR[$i]="$HOSTS_NET.$(( i + 10 ))"
    HOST_DIR[$i]="$HOSTS_BASE/h$i"; HOST_DISK[$i]="$HOSTS_BASE/disk/h$i"; HOST_INIT[$i]=0; _HOST_UP[$i]=0
    mkdir -p "${HOST_DIR[$i]}" "${HOST_DISK[$i]}"
    echo "${HOST_ADDR[$i]} ${HOST_NAME[$i]}" >>"$HOSTS_BASE/hosts"
  done
  local b=$HOSTS_BRIDGE_NS
  if ! { ip netns add "$b" && _HOSTS_MADE+=("$b") && ip -n "$b" link set lo up \
         && ip -n "$b" link add br0 type bridge stp_state 0 forward_delay 0 && ip -n "$b" link set br0 up; }; then
    _hosts_err "cannot create the bridge namespace"; hosts_destroy >/dev/null 2>&1; return 1
  fi
  for ((i = 0; i < n; i++)); do
    local ns=${HOST_NS[$i]}
    if ! { ip netns add "$ns" && _HOSTS_MADE+=("$ns") \
           && ip -n "$b" link add "h$i" type veth peer name eth0 netns "$ns" \
           && ip -n "$b" link set "h$i" master br0 && ip -n "$b" link set "h$i" up \
           && ip -n "$ns" link set lo up \
           && ip -n "$ns" addr add "${HOST_ADDR[$i]}/24" dev eth0 && ip -n "$ns" link set eth0 up; }; then
      _hosts_err "cannot create host $i's network"; hosts_destroy >/dev/null 2>&1; return 1
    fi
    _HOST_NETINO[$i]=$(stat -L -c %i "/run/netns/$ns")
  done
  for ((i = 0; i < n; i++)); do
    if ! _hosts_boot "$i"; then hosts_destroy >/dev/null 2>&1; return 1; fi
  done
  return 0
}

# The nsenter command line that enters host I; the command starts in the caller's directory.
_hosts_enter() {
  local i=$1; shift
  _HOSTS_CMD=(setpriv --pdeathsig KILL nsenter --target "${HOST_INIT[$i]}" --pid --uts --mount --net --
              setpriv --pdeathsig KILL sh -c 'cd -- "$0" 2>/dev/null || cd /; exec "$@"' "$PWD" "$@")
}
# Wrappers between the calling shell and nsenter. They reap nsenter and exit with its status
# (128+N when the command died of signal N) with their own stderr on /dev/null, so the calling
# shell prints no "Killed" line when a host crashes under a command. The one for host_spawn runs
# nsenter in the background with SIGINT/SIGQUIT back to default (a plain `cmd &` would ignore
# them) and forwards TERM, HUP, USR1, USR2 it gets to the command (the child of nsenter).
_HOSTS_WRAP='exec 3>&2 2>/dev/null; "$@" 2>&3 3>&-; exit $?'
_HOSTS_WRAP_BG='exec 3>&2 2>/dev/null
env --default-signal=INT,QUIT "$@" 2>&3 3>&- & n=$!
fwd() { got=1; local c; c=$(pgrep -P "$n" 2>/dev/null | head -1); kill -s "$1" "${c:-$n}" 2>/dev/null; }
for s in TERM HUP USR1 USR2; do trap "fwd $s" "$s"; done
rc=
while :; do # a wait cut short by a forwarded signal returns >128: wait again
  got=0; wait "$n"; r=$?
  if [ $r -eq 127 ] && [ -n "$rc" ]; then break; fi
  rc=$r
  if [ $got = 1 ] && [ $r -gt 128 ]; then continue; fi
  break
done
exit $rc'

# host_exec I CMD... — runs CMD in host I in the foreground (stdin, stdout, stderr passed
# through); returns its status (128+N if killed by signal N; 125 if the host is down). Not
# bounded by itself: bound it inside, e.g. host_exec 1 timeout 5 CMD.
host_exec() {
  if [ $# -lt 2 ]; then _hosts_err "usage: host_exec I CMD..."; return 2; fi
  local i=$1; shift
  _hosts_check "$i" || return
  _hosts_enter "$i" "$@"
  sh -c "$_HOSTS_WRAP" dph-exec "${_HOSTS_CMD[@]}"
}

# host_spawn I LOGFILE CMD... — runs CMD in host I in the background, stdin from /dev/null,
# stdout+stderr to LOGFILE (opened by the calling shell, root-namespace path). Sets
#   HOST_SPAWN_PID — global pid of a wrapper (bash) that is a child of the calling shell:
#                    `wait $HOST_SPAWN_PID` (or host_wait) gives CMD's exit status (128+N if
#                    killed by signal N, 137 when its host was killed). TERM, HUP, USR1, USR2 sent
#                    to it are forwarded to CMD; SIGKILL to it SIGKILLs CMD (parent-death signals
#                    along wrapper -> nsenter -> CMD), not CMD's children. SIGINT: see below.
#   HOST_SPAWN_CMD — global pid of CMD itself (in the host's pid namespace), for any signal,
#                    SIGINT included (the wrapper cannot trap INT: a background job of a script
#                    starts with INT ignored); empty if CMD already ended.
# and prints nothing. Call it from the shell that will wait (not in $(...)).
host_spawn() {
  HOST_SPAWN_PID=; HOST_SPAWN_CMD=
  if [ $# -lt 3 ]; then _hosts_err "usage: host_spawn I LOGFILE CMD..."; return 2; fi
  local i=$1 log=$2; shift 2
  _hosts_check "$i" || return
  if [ "$BASHPID" != "$$" ]; then _hosts_err "warning: host_spawn in a subshell: only that subshell can wait for it"; fi
  _hosts_enter "$i" "$@"
  bash -c "$_HOSTS_WRAP_BG" dph-spawn "${_HOSTS_CMD[@]}" </dev/null >"$log" 2>&1 &
  HOST_SPAWN_PID=$!
  local w=$! ns= c=
  _hosts_cmd_of() {
    [ -n "$ns" ] || ns=$(pgrep -P "$w" 2>/dev/null | head -1)
    [ -n "$ns" ] && c=$(pgrep -P "$ns" 2>/dev/null | head -1)
    [ -n "$c" ] && [ "$(readlink "/proc/$c/ns/pid" 2>/dev/null)" = "${_HOST_PIDNS[$i]}" ] && return 0
    ! kill -0 "$w" 2>/dev/null
  }
  if ! _hosts_until 5 _hosts_cmd_of; then # HOST_SPAWN_CMD stays empty: say what was seen
    echo "# lib_hosts: host_spawn on host $i: waited 5 s for the command in the host's pid namespace: not seen (nsenter '${ns:-none}', its child '${c:-none}')" >&2
  fi
  if [ -n "$c" ] && kill -0 "$c" 2>/dev/null; then HOST_SPAWN_CMD=$c; fi
  return 0
}

# host_wait PID [TIMEOUT_S=30] — bounded wait for a child of this shell (e.g. HOST_SPAWN_PID):
# its exit status, or 124 if it still runs after TIMEOUT_S (it is left running; a "# " line on
# stderr says so).
host_wait() {
  local p=$1 limit=${2:-30}
  _hosts_gone() { ! kill -0 "$p" 2>/dev/null || [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" = Z ]; }
  if ! _hosts_until "$limit" _hosts_gone; then # the caller sees only 124: say what still runs
    echo "# lib_hosts: host_wait: waited $limit s for pid $p to exit: still running (state $(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null); ...$(tr '\0\n' '  ' <"/proc/$p/cmdline" 2>/dev/null | tail -c 160))" >&2
    return 124
  fi
  wait "$p"
}

# host_procs I — global pids of the processes in host I's pid namespace (one a line; init
# included while it lives). Matched on pid namespace and network namespace together, so a
# recycled namespace inode of another run is not counted.
host_procs() {
  local i=${1:-}
  if ! [[ $i =~ ^[0-9]+$ ]] || [ "$i" -ge "$_HOSTS_N" ]; then _hosts_err "no host '$i'"; return 2; fi
  [ -n "${_HOST_PIDNS[$i]:-}" ] || return 0
  local pat d p
  pat=${_HOST_PIDNS[$i]//[/\\[}; pat=${pat//]/\\]}
  for d in $(find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/pid' -lname "$pat" -printf '%h\n' 2>/dev/null); do
    p=${d#/proc/}; p=${p%/ns}
    [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" = "net:[${_HOST_NETINO[$i]}]" ] && echo "$p"
  done
  return 0
}

# _hosts_netns_procs — pids of processes (any pid namespace) in one of our network namespaces.
_hosts_netns_procs() {
  local ino pat=() d p
  for ino in "${_HOST_NETINO[@]}" ${_HOSTS_BRNETINO:-}; do
    [ ${#pat[@]} -gt 0 ] && pat+=(-o)
    pat+=(-lname "net:\\[$ino\\]")
  done
  [ ${#pat[@]} -gt 0 ] || return 0
  for d in $(find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/net' \( "${pat[@]}" \) -printf '%h\n' 2>/dev/null); do
    p=${d#/proc/}; echo "${p%/ns}"
  done
}

# host_kill I — SIGKILL to host I's pid 1: every process of the host dies at once (a machine
# crash); its network namespace and address stay, so peers get resets / refusals. Waits (5 s)
# until no process of that pid namespace remains; non-zero (and the leftovers) otherwise.
host_kill() {
  local i=${1:-}
  _hosts_check "$i" || return
  kill -KILL "${HOST_INIT[$i]}" 2>/dev/null
  _HOST_UP[$i]=0
  _hosts_empty() { [ -z "$(host_procs "$i")" ] && ! _hosts_child_alive "${_HOST_LAUNCHER[$i]:-}"; }
  if ! _hosts_until 5 _hosts_empty; then
    _hosts_err "host $i: still running after kill: $(host_procs "$i" | tr '\n' ' ')"; return 1
  fi
}

# host_restart I — boots host I again after host_kill (same namespace, address, name, disk):
# a machine that comes back. HOST_INIT[I] changes.
host_restart() {
  local i=${1:-}
  if ! [[ $i =~ ^[0-9]+$ ]] || [ "$i" -ge "$_HOSTS_N" ]; then _hosts_err "no host '$i'"; return 2; fi
  if _hosts_up "$i"; then _hosts_err "host $i is up"; return 1; fi
  _hosts_boot "$i"
}

# host_link_down I / host_link_up I — cuts / restores host I's link on the bridge (its port,
# inside the bridge namespace): its processes live on but nothing reaches them, nor they anything.
host_link_down() {
  local i=${1:-}
  if ! [[ $i =~ ^[0-9]+$ ]] || [ "$i" -ge "$_HOSTS_N" ]; then _hosts_err "no host '$i'"; return 2; fi
  ip -n "$HOSTS_BRIDGE_NS" link set "h$i" down
}
host_link_up() {
  local i=${1:-}
  if ! [[ $i =~ ^[0-9]+$ ]] || [ "$i" -ge "$_HOSTS_N" ]; then _hosts_err "no host '$i'"; return 2; fi
  ip -n "$HOSTS_BRIDGE_NS" link set "h$i" up || return
  _hosts_port_up() { ip -n "$HOSTS_BRIDGE_NS" -o link show "h$i" 2>/dev/null | grep -q 'state UP'; }
  _hosts_until 3 _hosts_port_up && return 0
  echo "# lib_hosts: waited 3 s for host $i's bridge port h$i to be UP (last: '$(ip -n "$HOSTS_BRIDGE_NS" -o link show "h$i" 2>&1 | grep -o 'state [A-Z]*')')" >&2
  return 1
}

# hosts_destroy — kills every host's init (everything inside dies), waits (5 s), deletes the
# host and bridge namespaces (their veths and the bridge go with them) and HOSTS_BASE (unless
# KEEP_WORK is set). Idempotent. Prints what is left and returns 1 if anything is.
hosts_destroy() {
  [ "$_HOSTS_N" -gt 0 ] || [ -n "$HOSTS_BASE" ] || return 0
  local i left=() ns p
  for ((i = 0; i < _HOSTS_N; i++)); do
    if _hosts_up "$i"; then kill -KILL "${HOST_INIT[$i]}" 2>/dev/null; fi
    _HOST_UP[$i]=0
  done
  _HOSTS_BRNETINO=$(stat -L -c %i "/run/netns/$HOSTS_BRIDGE_NS" 2>/dev/null)
  _hosts_all_gone() {
    local j
    for ((j = 0; j < _HOSTS_N; j++)); do
      [ -z "$(host_procs "$j")" ] || return 1
      ! _hosts_child_alive "${_HOST_LAUNCHER[$j]:-}" || return 1
    done
    [ -z "$(_hosts_netns_procs)" ]
  }
  if ! _hosts_until 5 _hosts_all_gone; then
    for ((i = 0; i < _HOSTS_N; i++)); do
      for p in $(host_procs "$i"); do left+=("host $i process $p ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null))"); done
    done
    for p in $(_hosts_netns_procs); do left+=("process $p in a host network namespace ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null))"); done
  fi
  for ns in "${_HOSTS_MADE[@]}"; do # only the ones hosts_create added
    [ -e "/run/netns/$ns" ] && ip netns del "$ns" 2>/dev/null
  done
  for ns in "${_HOSTS_MADE[@]}"; do
    [ -e "/run/netns/$ns" ] && left+=("network namespace $ns")
  done
  _HOSTS_MADE=()
  if [ -n "$HOSTS_BASE" ] && [ -d "$HOSTS_BASE" ]; then
    if [ -n "${KEEP_WORK:-}" ]; then echo "# keeping $HOSTS_BASE" >&2
    else rm -rf "$HOSTS_BASE" 2>/dev/null || left+=("directory $HOSTS_BASE"); fi
  fi
  _HOSTS_N=0; HOSTS_BASE=
  if [ ${#left[@]} -gt 0 ]; then
    _hosts_err "left after hosts_destroy:"; printf '  %s\n' "${left[@]}" >&2
    return 1
  fi
  return 0
}

_hosts_on_exit() {
  local rc=$? prev=()
  hosts_destroy || true
  if [ -n "$_HOSTS_PREV_EXIT" ]; then eval "prev=($_HOSTS_PREV_EXIT)"; eval "${prev[2]}"; fi
  return $rc
}
