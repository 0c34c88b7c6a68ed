#!/usr/bin/env bash
# e2e_failover.sh — the coordinator is not a single point of failure (simulated machines, as in
# e2e_multinode.sh): host 1 is the job's first machine, which coordinates; host 2 the second;
# host 3 a spare machine. Each case ends with the model byte-identical to the single-machine
# run, nothing left in any machine, bounded in time. Needs root (else skipped).
source "$(dirname "$0")/lib_e2e.sh"
source "$(dirname "$0")/lib_hosts.sh"

CASES="coordinating_machine_lost_another_takes_over coordinating_launcher_stopped_past_its_lease \
failover_while_a_failure_waits_for_its_decision"
if ! hosts_available; then
  for c in $CASES; do echo "ok - $c # SKIP no network namespaces (needs root)"; done
  exit 0
fi
source "$(dirname "$0")/lib_machines.sh"

# signal_launcher HOST SIG — to that machine's `deadpool run` (the launcher, not its processes).
signal_launcher() { host_exec "$1" sh -c "pkill -$2 -f '^[^ ]*deadpool run'"; }

# 1. The coordinating machine (its launcher and its two ranks) crashes: another machine's
#    launcher takes the lease, decides the loss, and the spare machine takes ranks 0 and 1.
J=fo1; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
killed=none
if wait_step $J 1 60; then host_kill 1; killed="after step $(grep -oE '^step +[0-9]+' "$WORK/$J.h1.log" | tail -1 | grep -oE '[0-9]+')"; fi
finish 2 3
host_wait "${LAUNCHER[1]}" 5 >/dev/null
host_restart 1
# either surviving machine may win the lease: its events.jsonl is the job's from then on
took=$(cat "$WORK/$J.h2.log" "$WORK/$J.h3.log" | grep -c 'coordinates the job from now on')
ev=$(cat "${HOST_DISK[2]}/$J/events.jsonl" "${HOST_DISK[3]}/$J/events.jsonl" 2>/dev/null)
if same "${HOST_DISK[2]}/$J/model.bin" && same "${HOST_DISK[3]}/$J/model.bin" && [ "$RCS" = " 0 0" ] && [ "$took" -eq 1 ] \
   && [ "$(echo "$ev" | grep '"event":"decision"' | grep -c '"failed":2')" -eq 1 ] && clean; then
  ok "coordinating_machine_lost_another_takes_over ($(echo "$ev" | grep -o '"total_ms":[0-9]*' | head -1))"
else notok "coordinating_machine_lost_another_takes_over" "rcs:$RCS took:$took killed:$killed" "$(grep -v '^step' "$WORK/$J.h1.log" | tail -3)" \
  "$(echo "$ev" | grep -E 'failure|decision|recovered|coordinator')" "$(tail -4 "$WORK/$J.h2.log")"; fi

# 2. The coordinating launcher is stopped (SIGSTOP) for longer than its lease (a quarter of the
#    detect timeout: 0.5 s) but not as long as the job: another machine coordinates; when it
#    wakes up it finds the lease gone and follows the job to its end. No rank fails.
J=fo2; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
if wait_step $J 1 60; then
  signal_launcher 1 STOP; sleep 1.2; signal_launcher 1 CONT
fi
finish 1 2 3
if same "${HOST_DISK[1]}/$J/model.bin" && same "${HOST_DISK[2]}/$J/model.bin" && [ "$RCS" = " 0 0 0" ] \
   && grep -q 'coordinates the job from now on' "$WORK/$J.h2.log" "$WORK/$J.h3.log" \
   && grep -q 'lease has passed to another machine' "$WORK/$J.h1.log" \
   && ! grep -q "the job's state is gone" "$WORK/$J.h1.log" && clean; then
  ok "coordinating_launcher_stopped_past_its_lease"
else notok "coordinating_launcher_stopped_past_its_lease" "rcs:$RCS" "$(tail -3 "$WORK/$J.h1.log")" "$(tail -3 "$WORK/$J.h2.log")"; fi

# 3. A failure with no coordinator to decide it: the coordinating launcher is stopped, then
#    rank 2 (machine 1) is killed. The next coordinator finds the exit its machine reported and
#    decides; the stopped one wakes up as a follower. The 3 s stop may outlast the job (about
#    4 s on an idle machine): then its keys are gone when it wakes, and this machine's
#    processes' exits say that the job is done.
J=fo3; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
if wait_step $J 1 60; then
  signal_launcher 1 STOP; sleep 0.2
  host_exec 2 pkill -KILL -o -f "deadpool train"
  sleep 3; signal_launcher 1 CONT
fi
finish 1 2 3
all_events=$(cat "${HOST_DISK[2]}/$J/events.jsonl" "${HOST_DISK[3]}/$J/events.jsonl" 2>/dev/null)
if same "${HOST_DISK[1]}/$J/model.bin" && [ "$RCS" = " 0 0 0" ] && echo "$all_events" | grep -q '"event":"recovered"' && clean; then
  ok "failover_while_a_failure_waits_for_its_decision ($(echo "$all_events" | grep -o '"total_ms":[0-9]*' | head -1))"
else notok "failover_while_a_failure_waits_for_its_decision" "rcs:$RCS" "$(echo "$all_events" | grep -E 'failure|decision|recovered|coordinator')" \
  "$(tail -3 "$WORK/$J.h1.log")" "$(tail -3 "$WORK/$J.h2.log")"; fi

hosts_destroy >/dev/null || notok "hosts_destroy" "something was left"
