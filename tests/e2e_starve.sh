#!/usr/bin/env bash
# e2e_starve.sh — nobody outside the job can starve its control plane or its /metrics, nor read
# its Redis password, and the spare hint can be followed as printed. The attacker runs as
# `nobody` where the machine allows it (root, setpriv); its scripts come on its command line.
source "$(dirname "$0")/lib_e2e.sh"
BASE=(--model tiny --seed 21)
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
NOBODY=0
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1 && as_nobody true 2>/dev/null; then NOBODY=1; fi
PY=/usr/bin/python3

# wait_for SECONDS CMD... — polls CMD every 0.05 s until it succeeds or the time is up (then
# says so on stderr: the callers go on regardless).
wait_for() {
  local s=$1 n=$(( $1 * 20 )) st=0 a seen=""; shift
  for _ in $(seq "$n"); do "$@" && return 0; st=$?; sleep 0.05; done
  for a in "$@"; do [ -f "$a" ] && seen+="; $a: $(count_lines "$a") lines, last '$(tail -1 "$a")'"; done
  echo "# waited $s s for '$*': still failing (status $st$seen)" >&2
  return 1
}
at_least_lines() { [ "$(count_lines "$1")" -ge "$2" ]; }
# stop_job PID — Ctrl-C, then at most 30 s, then -9. The exit status is in $rc.
stop_job() {
  kill -INT "$1" 2>/dev/null
  for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$1" 2>/dev/null && echo "# waited 30 s for pid $1 to exit after SIGINT: still running, killed" >&2
  kill -9 "$1" 2>/dev/null; wait "$1"; rc=$?
}
# finish_job PID LIMIT_S — waits for the job to end by itself (-9 after LIMIT_S). Status in $rc.
finish_job() {
  for _ in $(seq $(( $2 * 10 ))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$1" 2>/dev/null && echo "# waited $2 s for pid $1 to end: still running, killed" >&2
  kill -9 "$1" 2>/dev/null; wait "$1"; rc=$?
}

# Keeps N connections open to each target (a unix socket path or a TCP port on 127.0.0.1), never
# authenticating, and re-opens every one the server closes (a server at its client limit accepts
# and closes at once), so that a place freed in the server goes to the stranger, not the job.
# Prints "ready OPENED" once the first round is open; runs until killed (at most 120 s).
HOLD='
import os, select, socket, sys, time
n = int(sys.argv[1]); targets = sys.argv[2:]
def conn(t):
    try:
        if t.startswith("/"):
            s = socket.socket(socket.AF_UNIX); s.connect(t)
        else:
            s = socket.create_connection(("127.0.0.1", int(t)), timeout=2)
        return s
    except OSError:
        return None
held = [(t, conn(t)) for t in targets for _ in range(n)]
print("ready", sum(s is not None for _, s in held), flush=True)
end = time.time() + 120
while time.time() < end:
    p = select.poll()
    for _, s in held:
        if s is not None: p.register(s, select.POLLIN)
    r = {fd for fd, _ in p.poll(10)}
    if not r and all(s is not None for _, s in held): continue
    for i, (t, s) in enumerate(held):
        if s is None or s.fileno() in r:
            try:
                if s is not None and s.recv(4096): continue
            except OSError: pass
            if s is not None: s.close()
            held[i] = (t, conn(t))
    time.sleep(0.005)
'

# 1. The embedded Redis cannot be starved (item 3). A stranger opens connections to every TCP
# port the job's redis-server listens on and to its socket, beyond its client limit (the
# launcher runs with 1024 descriptors: redis-server takes 992 clients), then a rank is killed:
# the recovery needs new connections (the next epoch's rendezvous). The server must be out of
# the stranger's reach, and the job must recover to the failure-free model.
if [ $NOBODY -eq 1 ]; then
  run_job "$WORK/ref" 120 --workers 2 --spares 0 "${BASE[@]}" --steps 300
  mkdir -p "$WORK/rs"
  ( ulimit -n 1024; exec "$DP" run --out "$WORK/rs" --workers 2 --spares 1 "${BASE[@]}" --steps 300 ) \
    >"$WORK/rs.stdout" 2>"$WORK/rs.log" &
  lp=$!
  wait_for 60 at_least_lines "$WORK/rs/metrics.jsonl" 5
  rp=$(grep -o 'embedded redis-server on [^ ]* (pid [0-9]*' "$WORK/rs.log" | grep -o '[0-9]*$')
  where=$(grep -o 'embedded redis-server on [^ ]*' "$WORK/rs.log" | cut -d' ' -f4)
  targets=$(ss -ltnpH 2>/dev/null | grep "pid=$rp," | awk '{print $4}' | sed 's/.*://' | sort -u | tr '\n' ' ')
  case "$where" in /*) targets="$targets $where" ;; esac
  as_nobody $PY -c "$HOLD" 1100 $targets >"$WORK/rs.attack" 2>&1 &
  ap=$!
  wait_for 30 grep -q ready "$WORK/rs.attack"
  opened=$(awk '/ready/ {print $2}' "$WORK/rs.attack")
  victim=$(grep '"event":"rank_joined"' "$WORK/rs/events.jsonl" | grep '"rank":1,' | grep -o '"pid":[0-9]*' | cut -d: -f2 | head -1)
  [ -n "$victim" ] && kill -9 "$victim"
  finish_job $lp 120
  kill -9 $ap 2>/dev/null; wait $ap 2>/dev/null
  if [ -n "$rp" ] && [ "${opened:-x}" = 0 ] && [ $rc -eq 0 ] && grep -q '"event":"recovered"' "$WORK/rs/events.jsonl" \
     && cmp -s "$WORK/ref/model.bin" "$WORK/rs/model.bin" && no_leftovers "$WORK/rs"; then
    ok "embedded_redis_out_of_a_strangers_reach (its socket $where; the stranger opened 0 connections)"
  else notok "embedded_redis_out_of_a_strangers_reach" "rc $rc, redis pid '$rp' on '$where' tcp '$targets', stranger opened '$opened'" \
    "$(tail -3 "$WORK/rs.log")"; fi
else
  echo "ok - embedded_redis_out_of_a_strangers_reach # skip needs root and a nobody user"
fi

# 2. /metrics cannot be starved (item 5). 300 connections of a stranger each send one byte of a
# request head a second, and are opened again whenever the server closes one (the old limit was
# 32 connections, each held as long as it trickled). Every scrape must still be answered in 2 s.
TRICKLE='
import select, socket, sys, time
port, n, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100000
def conn():
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2); s.setblocking(False); return [s, 0]
    except OSError:
        return None
cs = [conn() for _ in range(n)]
print("ready", sum(c is not None for c in cs), flush=True)
end = time.time() + secs; reopened = 0
while time.time() < end:
    for i, c in enumerate(cs):
        if c is None:
            cs[i] = conn(); reopened += 1; continue
        try:
            c[0].send(head[c[1]:c[1] + 1]); c[1] += 1
            r, _, _ = select.select([c[0]], [], [], 0)
            if r and not c[0].recv(4096): raise OSError
        except OSError:
            c[0].close(); cs[i] = conn(); reopened += 1
    time.sleep(1)
print("reopened", reopened, flush=True)
'
if [ $NOBODY -eq 1 ] && command -v curl >/dev/null; then
  P=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$WORK/m"
  "$DP" run --out "$WORK/m" --workers 1 --spares 0 "${BASE[@]}" --steps 100000 --metrics-port "$P" \
    >"$WORK/m.stdout" 2>"$WORK/m.log" &
  lp=$!
  wait_for 60 curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$P/metrics"
  as_nobody $PY -c "$TRICKLE" "$P" 300 14 >"$WORK/m.attack" 2>&1 &
  ap=$!
  wait_for 20 grep -q ready "$WORK/m.attack"
  sleep 4 # the trickling connections are well under way (past the old 5 s idle bound's reach)
  good=0; worst=0
  for _ in 1 2 3 4 5 6; do
    t0=$(date +%s%N)
    curl -s --max-time 2 "http://127.0.0.1:$P/metrics" | grep -q '^deadpool_step ' && good=$((good + 1))
    ms=$(( ($(date +%s%N) - t0) / 1000000 )); [ $ms -gt $worst ] && worst=$ms
    sleep 1
  done
  stop_job $lp
  wait $ap 2>/dev/null
  held=$(awk '/ready/ {print $2}' "$WORK/m.attack")
  if [ "$good" -eq 6 ] && [ "${held:-0}" -ge 300 ]; then
    ok "metrics_scraped_while_300_connections_trickle (6 of 6 scrapes, slowest ${worst} ms; $(grep reopened "$WORK/m.attack"))"
  else notok "metrics_scraped_while_300_connections_trickle" "$good of 6 scrapes answered, slowest ${worst} ms, stranger held '$held'" \
    "$(cat "$WORK/m.attack" | tail -2)"; fi
else
  echo "ok - metrics_scraped_while_300_connections_trickle # skip needs root, a nobody user and curl"
fi

# 3. A password given on the command line is gone from it at once, and on no child's (item 10);
# --redis-file takes it from a file of this user's that nobody else can read.
if [ $NOBODY -eq 1 ] && command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  pw=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for _ in 1 2 3; do
    port=$(( 20000 + RANDOM % 20000 ))
    printf 'port %s\nbind 127.0.0.1\nrequirepass %s\nsave ""\nappendonly no\n' "$port" "$pw" | redis-server - >/dev/null 2>&1 &
    rp=$!
    for _ in $(seq 100); do redis-cli -p "$port" -a "$pw" --no-auth-warning ping 2>/dev/null | grep -q PONG && break
      kill -0 $rp 2>/dev/null || break; sleep 0.05; done
    kill -0 $rp 2>/dev/null && break
  done
  pong=$(timeout 2 redis-cli -p "$port" -a "$pw" --no-auth-warning ping 2>&1)
  grep -q PONG <<<"$pong" || echo "# waited up to 5 s for redis-server on port $port: no PONG," \
    "server $(kill -0 $rp 2>/dev/null && echo running || echo exited) (last: '$pong')" >&2
  mkdir -p "$WORK/pw"
  "$DP" run --out "$WORK/pw" --workers 2 --spares 1 "${BASE[@]}" --steps 100000 --redis "redis://:$pw@127.0.0.1:$port" \
    >"$WORK/pw.stdout" 2>"$WORK/pw.log" &
  lp=$!
  wait_for 60 at_least_lines "$WORK/pw/metrics.jsonl" 2
  # what every user can read: each process's command line (the password reaches the reader in
  # its environment, so that the reader's own command line does not show it)
  seen=$(PW=$pw as_nobody $PY -c '
import glob, os
pw = os.environ["PW"].encode()
for f in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        if pw in open(f, "rb").read(): print(f)
    except OSError: pass' | wc -l)
  procs=$(pgrep -f -c "deadpool" )
  stop_job $lp
  # --redis-file: refused while others may read it, used once it is 0600
  printf 'redis://:%s@127.0.0.1:%s\n' "$pw" "$port" >"$WORK/redis.url"
  chmod 644 "$WORK/redis.url"
  timeout 60 "$DP" run --out "$WORK/pf1" --workers 1 --spares 0 "${BASE[@]}" --steps 3 --redis-file "$WORK/redis.url" \
    >"$WORK/pf1.log" 2>&1; rc1=$?
  chmod 600 "$WORK/redis.url"
  run_job "$WORK/pf2" 60 --workers 1 --spares 0 "${BASE[@]}" --steps 3 --redis-file "$WORK/redis.url"; rc2=$?
  kill "$rp" 2>/dev/null; wait "$rp" 2>/dev/null
  if [ "$seen" -eq 0 ] && [ "$procs" -ge 4 ] && grep -q "readable by every user" "$WORK/pw.log" \
     && [ $rc1 -eq 2 ] && grep -q "mode 0644 lets other users read" "$WORK/pf1.log" && [ $rc2 -eq 0 ] \
     && ! grep -q -F "$pw" "$WORK/pf2.log" "$WORK/pw.log"; then
    ok "redis_password_off_every_command_line (launcher and $((procs - 1)) other processes)"
  else notok "redis_password_off_every_command_line" "$seen command lines show it ($procs processes), rc $rc1 $rc2" \
    "$(tail -1 "$WORK/pf1.log")"; fi
else
  echo "ok - redis_password_off_every_command_line # skip needs root, a nobody user, redis-server and redis-cli"
fi

# 4. A --redis-ha launcher killed with -9 leaves a 0700 directory with 0600 files (the sentinels
# rewrite theirs), and the next launcher of this user removes it (item 10), with any other
# directory of a launcher gone (one killed by an earlier test's timeout).
mkdir -p "$WORK/ha"
"$DP" run --out "$WORK/ha" --workers 1 --spares 0 "${BASE[@]}" --steps 100000 --redis-ha >"$WORK/ha.stdout" 2>"$WORK/ha.log" &
lp=$!
wait_for 60 at_least_lines "$WORK/ha/metrics.jsonl" 2
dir=$(grep -o 'sentinels .* in [^ ]*' "$WORK/ha.log" | awk '{print $NF}')
# The servers die with their launcher (SIGTERM on its death); a master may save once more on
# the way out, so the files are looked at once every one of them has exited (zombies count as
# exited: their parent is gone), bounded, not after a fixed second.
kids=$(pgrep -P $lp)
kill -9 $lp; wait $lp 2>/dev/null
servers_gone() { local k; for k in $kids; do [ "$(sed 's/.*) //' /proc/$k/stat 2>/dev/null | cut -d' ' -f1)" != Z ] && [ -e /proc/$k ] && return 1; done; return 0; }
wait_for 60 servers_gone
dmode=$(stat -c %a "$dir" 2>/dev/null)
fmodes=$(find "$dir" -mindepth 1 -printf '%m\n' 2>/dev/null | sort -u | tr '\n' ' ')
nfiles=$(find "$dir" -mindepth 1 -type f 2>/dev/null | wc -l)
run_job "$WORK/ha2" 60 --workers 1 --spares 0 "${BASE[@]}" --steps 3; rc2=$?
if [ -n "$dir" ] && [ "$dmode" = 700 ] && [ "$nfiles" -ge 3 ] && [ "$fmodes" = "600 " ] && [ $rc2 -eq 0 ] && [ ! -e "$dir" ] \
   && grep -qE "removed [0-9]+ private director(y|ies) of launchers that are gone" "$WORK/ha2.log"; then
  ok "ha_directory_private_and_removed_after_kill_9 ($dir: 0$dmode, $nfiles files 0600)"
else notok "ha_directory_private_and_removed_after_kill_9" "dir '$dir' mode '$dmode' files '$fmodes' ($nfiles) rc $rc2" \
  "the next launcher: '$(grep -o 'removed .* gone' "$WORK/ha2.log")'" "$(ls -la "$dir" 2>&1 | head -5)"; fi

# 5. The spare hint can be followed as printed (item 16): a rank dies with no spare; the hint's
# command, run literally, brings a spare that joins, and the job ends with the failure-free model.
[ -f "$WORK/ref/model.bin" ] || run_job "$WORK/ref" 120 --workers 2 --spares 0 "${BASE[@]}" --steps 300
mkdir -p "$WORK/hint"
"$DP" run --out "$WORK/hint" --workers 2 --spares 0 --respawn-spares 0 "${BASE[@]}" --steps 300 --spare-wait 60 \
  --inject kill:1@100 >"$WORK/hint.stdout" 2>"$WORK/hint.log" &
lp=$!
wait_for 60 grep -q "waiting up to" "$WORK/hint.log"
cmd=$(grep -o '(deadpool worker [^)]*)' "$WORK/hint.log" | head -1 | tr -d '()')
sp=""
if [ -n "$cmd" ]; then
  read -r -a words <<<"$cmd"
  timeout 120 "$DP" "${words[@]:1}" >"$WORK/hint.spare.log" 2>&1 &
  sp=$!
fi
finish_job $lp 120
[ -n "$sp" ] && { kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null; }
if [ -n "$cmd" ] && [ $rc -eq 0 ] && grep -q '"event":"recovered"' "$WORK/hint/events.jsonl" \
   && cmp -s "$WORK/ref/model.bin" "$WORK/hint/model.bin" && no_leftovers "$WORK/hint"; then
  ok "spare_hint_followed_literally ($cmd)"
else notok "spare_hint_followed_literally" "rc $rc, hint '$cmd'" "$(tail -3 "$WORK/hint.log")" "$(tail -2 "$WORK/hint.spare.log" 2>/dev/null)"; fi
