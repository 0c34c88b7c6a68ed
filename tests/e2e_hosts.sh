#!/usr/bin/env bash
# e2e_hosts.sh — checks tests/lib_hosts.sh: three simulated hosts (network, UTS, pid and
# mount namespaces, a bridge in a namespace of its own), isolation, reachability only between
# hosts, a link cut, a host crash, and a teardown that leaves nothing. Needs root; 10 s idle, about 25 s on a loaded 2-core machine.
# Everything that connects to a host's address runs inside a host.
set -u
source "$(dirname "$0")/lib_hosts.sh"
WORK=$(mktemp -d /tmp/dph_selftest_XXXXXX)
trap 'rm -rf "$WORK"' EXIT          # hosts_create puts its teardown before this one
t_start=$SECONDS

ok() { echo "ok - $1"; }
notok() { echo "not ok - $1"; shift; for l in "$@"; do echo "  $l"; done; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else notok "$name" "${DETAIL:-}"; fi; DETAIL=; }
DETAIL=

TESTS=(hosts_created hostnames_differ same_kernel_other_pid_namespace proc_shows_only_the_host
       no_default_route addresses_only_on_host_interfaces private_directory repo_and_usr_visible
       redis_between_hosts spawn_wait_and_signal link_down_times_out link_up_restores host_kill_leaves_no_process
       killed_host_refuses_connections other_hosts_survive_a_kill host_restart
       destroy_leaves_nothing destroy_idempotent)
if ! hosts_available; then
  for t in "${TESTS[@]}"; do echo "ok - $t # SKIP no network namespaces"; done
  exit 0
fi

# connect I ADDR PORT TIMEOUT_S — a TCP connect from inside host I. Sets CONN ("connected",
# "timeout" or the error) and CONN_MS (the connect's duration, measured inside the host); status
# 0 only when connected.
connect() {
  local out rc
  out=$(host_exec "$1" timeout "$4" bash -c 't0=${EPOCHREALTIME//[.,]/}
    if : 3<>"/dev/tcp/$0/$1"; then echo connected; fi
    echo "ms $(( (${EPOCHREALTIME//[.,]/} - t0) / 1000 ))"' "$2" "$3" 2>&1)
  rc=$?
  CONN_MS=$(sed -n 's/^ms //p' <<<"$out"); CONN_MS=${CONN_MS:-$(( $4 * 1000 ))}
  CONN=$(grep -v '^ms ' <<<"$out" | tail -1); CONN=${CONN##*: }
  [ $rc -eq 124 ] && CONN=timeout
  [ "$CONN" = connected ]
}

if hosts_create 3; then ok "hosts_created (${HOST_NS[*]} + $HOSTS_BRIDGE_NS, inits ${HOST_INIT[*]})"
else notok "hosts_created"; exit 1; fi

# Hostnames: each host its own, none the root namespace's.
names=(); good=1
for i in 0 1 2; do names[$i]=$(host_exec $i hostname); [ "${names[$i]}" = "${HOST_NAME[$i]}" ] || good=0; done
[ "$(printf '%s\n' "${names[@]}" | sort -u | wc -l)" -eq 3 ] && [ "${names[0]}" != "$(hostname)" ] || good=0
DETAIL="hostnames: ${names[*]} (root $(hostname))"; check "hostnames_differ (${names[*]})" [ $good -eq 1 ]

# Same kernel (boot id), different pid namespaces.
boot=(); pidns=(); good=1
for i in 0 1 2; do
  boot[$i]=$(host_exec $i cat /proc/sys/kernel/random/boot_id); pidns[$i]=$(host_exec $i readlink /proc/self/ns/pid)
done
[ "${boot[0]}" = "$(cat /proc/sys/kernel/random/boot_id)" ] && [ "${boot[1]}" = "${boot[0]}" ] && [ "${boot[2]}" = "${boot[0]}" ] || good=0
[ "$(printf '%s\n' "${pidns[@]}" "$(readlink /proc/self/ns/pid)" | sort -u | wc -l)" -eq 4 ] || good=0
DETAIL="boot ${boot[*]} pidns ${pidns[*]}"; check "same_kernel_other_pid_namespace (${pidns[*]})" [ $good -eq 1 ]

# /proc inside a host shows its processes only: its init as pid 1, and the command itself.
procs=$(host_exec 1 sh -c 'ls -d /proc/[0-9]* | wc -l'); init1=$(host_exec 1 cat /proc/1/cmdline | tr '\0' ' ')
DETAIL="$procs processes, pid 1: $init1"
check "proc_shows_only_the_host ($procs entries)" eval '[ "$procs" -le 6 ] && [[ $init1 == *dph-init* ]]'

# Only the connected /24 route (and loopback); no default route, IPv4 or IPv6.
good=1; routes=
for i in 0 1 2; do
  r=$(host_exec $i ip -4 route show); routes+="[$r] "
  [ "$r" = "$HOSTS_NET.0/24 dev eth0 proto kernel scope link src ${HOST_ADDR[$i]} " ] || [ "$r" = "$HOSTS_NET.0/24 dev eth0 proto kernel scope link src ${HOST_ADDR[$i]}" ] || good=0
  [ -z "$(host_exec $i ip -4 route show default)$(host_exec $i ip -6 route show default)" ] || good=0
done
DETAIL="routes: $routes"; check "no_default_route" [ $good -eq 1 ]

# The addresses exist in the hosts only: not in the root namespace, nor on the bridge.
good=1
for i in 0 1 2; do
  a=$(host_exec $i ip -4 -o addr show | awk '{print $2, $4}' | tr '\n' ' ')
  [ "$a" = "lo 127.0.0.1/8 eth0 ${HOST_ADDR[$i]}/24 " ] || { good=0; DETAIL+="host $i: $a; "; }
done
[ -z "$(ip -4 -o addr show | grep -F " $HOSTS_NET.")" ] || { good=0; DETAIL+="root has an address in $HOSTS_NET.0/24; "; }
[ -z "$(ip -n "$HOSTS_BRIDGE_NS" -4 -o addr show | grep -v ' lo ')" ] || { good=0; DETAIL+="bridge namespace has IPv4 addresses: $(ip -n "$HOSTS_BRIDGE_NS" -4 -o addr show); "; }
ip -n "$HOSTS_BRIDGE_NS" -o link show br0 >/dev/null 2>&1 || { good=0; DETAIL+="no br0 in the bridge namespace; "; }
[ "$(ip -n "$HOSTS_BRIDGE_NS" -o link show master br0 | wc -l)" -eq 3 ] || { good=0; DETAIL+="bridge ports: $(ip -n "$HOSTS_BRIDGE_NS" -o link show master br0); "; }
check "addresses_only_on_host_interfaces ($HOSTS_NET.0/24)" [ $good -eq 1 ]

# Private directory: host 0's file is in its disk (root view) but not seen by host 1 nor at the
# same path in the root namespace.
good=1
host_exec 0 sh -c 'echo secret >"$0/f"' "${HOST_DIR[0]}" || good=0
[ "$(cat "${HOST_DISK[0]}/f" 2>/dev/null)" = secret ] || { good=0; DETAIL+="not in HOST_DISK[0]; "; }
[ "$(host_exec 0 cat "${HOST_DIR[0]}/f")" = secret ] || { good=0; DETAIL+="host 0 cannot read it back; "; }
host_exec 1 test ! -e "${HOST_DIR[0]}/f" || { good=0; DETAIL+="host 1 sees it; "; }
[ -z "$(host_exec 1 ls -A "$HOSTS_BASE/disk")" ] || { good=0; DETAIL+="host 1 sees the disks; "; }
[ ! -e "${HOST_DIR[0]}/f" ] || { good=0; DETAIL+="root sees it at HOST_DIR[0]; "; }
host_exec 1 sh -c 'echo mine >"$0/g"' "${HOST_DIR[1]}" && [ "$(cat "${HOST_DISK[1]}/g")" = mine ] || { good=0; DETAIL+="host 1 cannot write its own; "; }
check "private_directory" [ $good -eq 1 ]

ROOT=$(cd "$(dirname "$0")/.." && pwd)
check "repo_and_usr_visible" host_exec 2 sh -c 'test -f "$0/README.md" && test -x /usr/bin/env && test -d "$1"' "$ROOT" "$WORK"

# redis-server in host 0 with a password; redis-cli in host 1 reaches it.
PASS=selftest$RANDOM
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  host_spawn 0 "$WORK/redis0.log" redis-server --bind "${HOST_ADDR[0]}" --port 6390 --requirepass "$PASS" \
    --save '' --appendonly no --dir "${HOST_DIR[0]}" --daemonize no
  rpid=$HOST_SPAWN_PID; rcmd=$HOST_SPAWN_CMD
  pong=
  for _ in $(seq 50); do
    pong=$(host_exec 1 timeout 2 redis-cli -h "${HOST_ADDR[0]}" -p 6390 -a "$PASS" --no-auth-warning ping 2>&1)
    [ "$pong" = PONG ] && break; sleep 0.1
  done
  # the server's pid (global) is in host 0's pid namespace
  DETAIL="ping: $pong; $(tail -2 "$WORK/redis0.log")"
  check "redis_between_hosts (host 1 -> ${HOST_ADDR[0]}:6390 $pong, server pid $rcmd)" \
    eval '[ "$pong" = PONG ] && host_procs 0 | grep -qx "$rcmd"'
else
  echo "ok - redis_between_hosts # SKIP no redis-server"; rpid=
fi

# host_spawn: the wrapper pid is this shell's child; wait gives the command's status; TERM to
# the wrapper reaches the command; HOST_SPAWN_CMD is the command, inside the host.
host_spawn 1 "$WORK/trap1.log" sh -c 'trap "echo got TERM; exit 7" TERM; echo started; sleep 100 & wait'
tp=$HOST_SPAWN_PID; tc=$HOST_SPAWN_CMD
for _ in $(seq 100); do grep -q started "$WORK/trap1.log" && break; sleep 0.05; done
host_wait "$tp" 1 2>/dev/null; early=$? # 124 expected: no note of the timeout
kill -TERM "$tp"; host_wait "$tp" 5; trc=$?
host_spawn 2 "$WORK/exit3.log" sh -c 'exit 3'; wait "$HOST_SPAWN_PID"; erc=$?
DETAIL="early $early, after TERM $trc ($(cat "$WORK/trap1.log" | tr '\n' ' ')), cmd $tc in host 1: $(host_procs 1 | tr '\n' ' '), exit 3 -> $erc"
check "spawn_wait_and_signal (host_wait bound $early, TERM -> $trc, exit 3 -> $erc)" \
  eval '[ $early -eq 124 ] && [ $trc -eq 7 ] && grep -q "got TERM" "$WORK/trap1.log" && [ $erc -eq 3 ] && [ -n "$tc" ]'

# A listener in host 2; cutting host 2's link makes a connect from host 1 time out, restoring
# it makes the connect work again; the listener lives on meanwhile.
host_spawn 2 "$WORK/listen2.log" python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000)); s.listen(64)
while True:
    c, _ = s.accept(); c.close()' "${HOST_ADDR[2]}"
lpid=$HOST_SPAWN_PID; lcmd=$HOST_SPAWN_CMD
for _ in $(seq 50); do connect 1 "${HOST_ADDR[2]}" 7000 2 && break; sleep 0.1; done
before=$CONN
host_link_down 2
connect 1 "${HOST_ADDR[2]}" 7000 2; down="$CONN after $CONN_MS ms"
alive=$(kill -0 "$lcmd" 2>/dev/null && echo alive || echo dead)
DETAIL="before: $before; down: $down; listener $alive"
check "link_down_times_out ($before, then $down, listener $alive)" \
  eval '[ "$before" = connected ] && [ "$CONN" = timeout ] && [ $alive = alive ]'
host_link_up 2
connect 1 "${HOST_ADDR[2]}" 7000 3; up=$CONN
DETAIL="after up: $up"; check "link_up_restores ($up in $CONN_MS ms)" [ "$up" = connected ]

# host_kill: every process of host 1 dies at once; nothing of its pid namespace is left.
host_spawn 1 "$WORK/sleep1.log" sleep 1000
spid=$HOST_SPAWN_PID; scmd=$HOST_SPAWN_CMD; init1=${HOST_INIT[1]}
pst() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
scmd_st=$(pst "$scmd"); init1_st=$(pst "$init1")
before=$(host_procs 1 | wc -l)
t0=$(date +%s%N); host_kill 1; krc=$?; t1=$(date +%s%N)
wait "$spid"; src=$?
after=$(host_procs 1 | wc -l)
DETAIL="kill rc $krc, procs $before -> $after, sleep status $src, cmd $scmd start $scmd_st now $(pst "$scmd")"
check "host_kill_leaves_no_process ($before -> $after processes in $(( (t1 - t0) / 1000000 )) ms, sleep exit $src)" \
  eval '[ $krc -eq 0 ] && [ $before -ge 2 ] && [ $after -eq 0 ] && [ $src -eq 137 ] && [ -n "$scmd_st" ] && [ "$(pst "$scmd")" != "$scmd_st" ] && [ "$(pst "$init1")" != "$init1_st" ]'
down_exec=$(host_exec 1 true 2>&1); derc=$?

# The killed host's namespace still answers: a connect from host 0 is refused at once.
connect 0 "${HOST_ADDR[1]}" 7000 3; ref=$CONN; ms=$CONN_MS
DETAIL="connect: $ref in $ms ms; host_exec on the dead host: rc $derc $down_exec"
check "killed_host_refuses_connections ($ref in $ms ms; host_exec on it: rc $derc)" \
  eval '[ "$ref" = "Connection refused" ] && [ $ms -lt 1000 ] && [ $derc -eq 125 ]'

good=1
if [ -n "$rpid" ]; then
  p=$(host_exec 2 timeout 2 redis-cli -h "${HOST_ADDR[0]}" -p 6390 -a "$PASS" --no-auth-warning ping 2>&1); [ "$p" = PONG ] || good=0
fi
connect 0 "${HOST_ADDR[2]}" 7000 2 || good=0
DETAIL="redis from host 2: ${p:-}; host 0 -> host 2: $CONN"; check "other_hosts_survive_a_kill" [ $good -eq 1 ]

# A killed host boots again: same address, name and disk, a new init.
good=1
host_restart 1 || good=0
[ "${HOST_INIT[1]}" != "$init1" ] && [ "$(host_exec 1 hostname)" = node1 ] && [ "$(host_exec 1 cat "${HOST_DIR[1]}/g")" = mine ] || good=0
if [ -n "$rpid" ]; then
  p=$(host_exec 1 timeout 2 redis-cli -h node0 -p 6390 -a "$PASS" --no-auth-warning ping 2>&1); [ "$p" = PONG ] || good=0
fi
DETAIL="init ${HOST_INIT[1]} (was $init1), redis via name node0: ${p:-}"; check "host_restart (init ${HOST_INIT[1]})" [ $good -eq 1 ]

# Teardown: no namespace of ours, no process of the hosts, no launcher, no wrapper.
prefix=$HOSTS_PREFIX; base=$HOSTS_BASE
host_spawn 2 "$WORK/sleep2.log" sleep 1000; s2=$HOST_SPAWN_PID; s2cmd=$HOST_SPAWN_CMD
netinos=("${_HOST_NETINO[@]}" "$(stat -L -c %i "/run/netns/$HOSTS_BRIDGE_NS")")
ticks=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%d", $1 * hz}' /proc/uptime) # processes started before this
starttime() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
watch=() # pid:start time, so that a recycled pid is not taken for a leftover
for p in "${HOST_INIT[@]}" "${_HOST_LAUNCHER[@]}" "$s2" "$s2cmd" "$lpid" "$lcmd" "${rpid:-}" "${rcmd:-}"; do
  [ -n "$p" ] && st=$(starttime "$p") && [ -n "$st" ] && watch+=("$p:$st")
done
t0=$(date +%s%N); hosts_destroy 2>"$WORK/destroy.err"; drc=$?; t1=$(date +%s%N)
wait "$s2" 2>/dev/null; wait "$lpid" 2>/dev/null; [ -n "$rpid" ] && wait "$rpid" 2>/dev/null
leftns=$(ip netns list | grep -c "^$prefix-")
leftp=
for w in "${watch[@]}"; do [ "$(starttime "${w%:*}")" = "${w#*:}" ] && leftp+="${w%:*} "; done
pat=(); for ino in "${netinos[@]}"; do [ ${#pat[@]} -gt 0 ] && pat+=(-o); pat+=(-lname "net:\\[$ino\\]"); done
# any process, of any pid namespace, still in a host's or the bridge's network namespace (a
# process of a later run that got a recycled namespace inode started after $ticks)
for d in $(find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/net' \( "${pat[@]}" \) -printf '%h\n' 2>/dev/null); do
  p=${d#/proc/}; p=${p%/ns}; st=$(starttime "$p")
  [ -n "$st" ] && [ "$st" -le "$ticks" ] && leftp+="$p(in a host network namespace) "
done
DETAIL="rc $drc, watched ${#watch[@]} pids, namespaces left $leftns, processes left '$leftp', dir $( [ -e "$base" ] && echo kept || echo removed); $(cat "$WORK/destroy.err")"
check "destroy_leaves_nothing ($(( (t1 - t0) / 1000000 )) ms, ${#watch[@]} processes watched)" \
  eval '[ $drc -eq 0 ] && [ $leftns -eq 0 ] && [ -z "$leftp" ] && [ ! -e "$base" ] && [ ${#watch[@]} -ge 9 ]'
hosts_destroy; check "destroy_idempotent" [ $? -eq 0 ]
echo "# $(( SECONDS - t_start )) s"
