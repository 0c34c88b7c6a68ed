#!/usr/bin/env bash
# e2e_multinode.sh — jobs across simulated machines (tests/lib_hosts.sh: network, pid, uts and
# mount namespaces on a private bridge, no route anywhere else). Host 0 runs Redis; hosts 1
# and 2 are the job's two machines (2 ranks each); host 3 (and host 2 again, restarted) join
# as spare machines. Every case must end with the model byte-identical to the single-machine
# run of the same world size, and with no process left in any host. Needs root: without
# namespaces every case is reported as skipped.
source "$(dirname "$0")/lib_e2e.sh"
source "$(dirname "$0")/lib_hosts.sh"

CASES="two_machines_and_a_spare_machine_identical machine_crash_one_decision machine_link_cut \
two_processes_of_a_machine_killed fewer_spares_than_lost_ranks_then_a_spare_machine_joins \
checkpoint_on_private_disks_resumed_across_machines machine_of_a_pipeline_stage_crashes_3d"
if ! hosts_available; then
  for c in $CASES; do echo "ok - $c # SKIP no network namespaces (needs root)"; done
  exit 0
fi
source "$(dirname "$0")/lib_machines.sh"

# 1. Two machines x 2 ranks and a spare machine: the same model as one machine, on both
#    machines' disks; the spare machine's processes leave with the job.
J=mn1; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
finish 1 2 3
if same "${HOST_DISK[1]}/$J/model.bin" && same "${HOST_DISK[2]}/$J/model.bin" && [ "$RCS" = " 0 0 0" ] && clean \
   && grep -q 'spare machine 0' "$WORK/$J.h3.log"; then
  ok "two_machines_and_a_spare_machine_identical"
else notok "two_machines_and_a_spare_machine_identical" "rcs:$RCS" "$(tail -3 "$WORK/$J.h1.log")" "$(tail -3 "$WORK/$J.h2.log")"; fi

# 2. Machine 1 (host 2) crashes: its pid 1 dies with everything in it. The survivors' peers
#    reset; the coordinator confirms by probing, decides both ranks at once, and the spare
#    machine takes them.
J=mn2; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
if wait_step $J 1 60; then host_kill 2; fi
finish 1 3
host_wait "${LAUNCHER[2]}" 5 >/dev/null
host_restart 2
dec=$(events $J | grep -c '"event":"decision"'); rec=$(events $J | grep -o '"total_ms":[0-9]*' | head -1)
if same "${HOST_DISK[1]}/$J/model.bin" && same "${HOST_DISK[3]}/$J/model.bin" && [ "$RCS" = " 0 0" ] && [ "$dec" -eq 1 ] \
   && [ "$(events $J | grep '"event":"decision"' | grep -c '"failed":2')" -eq 1 ] && clean; then
  ok "machine_crash_one_decision ($rec)"
else notok "machine_crash_one_decision" "rcs:$RCS decisions:$dec" "$(events $J | grep -E 'failure|decision|recovered')" "$(tail -3 "$WORK/$J.h1.log")"; fi

# 3. Machine 1's link is cut: its processes live on, unreachable. After the detect timeout
#    both of its ranks fail in one decision; once the spare machine has them the link comes
#    back and the cut-off processes find themselves replaced.
J=mn3; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
if wait_step $J 1 60; then host_link_down 2; fi
for _ in $(seq 400); do events $J | grep -q '"event":"recovered"' && break; sleep 0.05; done
events $J | grep -q '"event":"recovered"' \
  || echo "# waited 20 s for a recovered event of job $J: none (last: '$(events $J | tail -1)')" >&2
host_link_up 2
finish 1 3 2
dec=$(events $J | grep -c '"event":"decision"'); rec=$(events $J | grep -o '"total_ms":[0-9]*' | head -1)
if same "${HOST_DISK[1]}/$J/model.bin" && [ "$(echo $RCS | cut -d' ' -f1-2)" = "0 0" ] && [ "$dec" -eq 1 ] \
   && [ "$(events $J | grep '"event":"decision"' | grep -c '"failed":2')" -eq 1 ] && clean; then
  ok "machine_link_cut ($rec)"
else notok "machine_link_cut" "rcs:$RCS decisions:$dec" "$(events $J | grep -E 'failure|decision|recovered')" "$(tail -3 "$WORK/$J.h2.log")"; fi

# 4. Both rank processes of machine 1 killed in one call: its launcher reports both exits,
#    one decision.
J=mn4; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
if wait_step $J 1 60; then host_exec 2 pkill -KILL -f "deadpool train"; fi
finish 1 2 3
dec=$(events $J | grep -c '"event":"decision"'); rec=$(events $J | grep -o '"total_ms":[0-9]*' | head -1)
if same "${HOST_DISK[1]}/$J/model.bin" && same "${HOST_DISK[3]}/$J/model.bin" && [ "$RCS" = " 0 0 0" ] && [ "$dec" -eq 1 ] \
   && [ "$(events $J | grep '"event":"decision"' | grep -c '"failed":2')" -eq 1 ] && clean; then
  ok "two_processes_of_a_machine_killed ($rec)"
else notok "two_processes_of_a_machine_killed" "rcs:$RCS decisions:$dec" "$(events $J | grep -E 'failure|decision|recovered')"; fi

# 5. One spare process left (the spare machine lost one) when machine 1 crashes with two
#    ranks: the job persists what is committed and waits; a new spare machine (host 2 again,
#    rebooted) joins while it waits and takes both ranks.
J=mn5; start_machine 1 $J; start_machine 2 $J; start_machine 3 $J
if wait_step $J 1 40; then
  host_exec 3 pkill -KILL -o -f "deadpool train" # the spare machine's oldest spare
  sleep 0.5; host_kill 2
fi
for _ in $(seq 400); do events $J | grep -q '"event":"no_spare"' && break; sleep 0.05; done
waited=$(events $J | grep -c '"event":"no_spare"')
host_wait "${LAUNCHER[2]}" 5 >/dev/null
# a machine rebooted in place keeps its hostname and (here, not in life) its boot id: a new id
host_restart 2; start_machine 2 $J --node-id node2-rebooted
finish 1 3 2
if same "${HOST_DISK[1]}/$J/model.bin" && [ "$waited" -ge 1 ] && [ "$RCS" = " 0 0 0" ] && clean \
   && grep -q 'spare machine 1' "$WORK/$J.h2.log"; then
  ok "fewer_spares_than_lost_ranks_then_a_spare_machine_joins"
else notok "fewer_spares_than_lost_ranks_then_a_spare_machine_joins" "rcs:$RCS no_spare:$waited" \
  "$(events $J | grep -E 'failure|decision|recovered|no_spare')" "$(tail -3 "$WORK/$J.h2.log")"; fi

# 6. Checkpoints without a shared filesystem: every machine writes its ranks' states to its
#    own disk. Both machines crash after a checkpoint; the job resumes with the machines in
#    the other order (machine 0 is now host 2), so that every rank's state must come over the
#    network from the other machine's disk.
J=mn6; start_machine 1 $J --persist-every 40; start_machine 2 $J --persist-every 40
for _ in $(seq 1200); do [ "$(events $J | grep -c '"event":"checkpoint"')" -ge 2 ] && break; sleep 0.05; done
ck=$(events $J | grep -c '"event":"checkpoint"')
host_kill 1; host_kill 2
host_wait "${LAUNCHER[1]}" 5 >/dev/null; host_wait "${LAUNCHER[2]}" 5 >/dev/null
host_restart 1; host_restart 2
R=(--resume "${HOST_DIR[2]}/$J" --out "${HOST_DIR[2]}/$J" --node-id node2-second)
start_machine 2 mn6r "${R[@]}"
start_machine 1 mn6r --resume "${HOST_DIR[1]}/$J" --out "${HOST_DIR[1]}/$J" --node-id node1-second
finish 2 1
if same "${HOST_DISK[1]}/$J/model.bin" && same "${HOST_DISK[2]}/$J/model.bin" && [ "$ck" -ge 2 ] && [ "$RCS" = " 0 0" ] \
   && grep -q 'serving 2 rank state' "$WORK/mn6r.h1.log" && grep -q 'serving 2 rank state' "$WORK/mn6r.h2.log" && clean; then
  ok "checkpoint_on_private_disks_resumed_across_machines ($(grep -o 'resuming from the checkpoint of step [0-9]*' "$WORK/mn6r.h2.log"))"
else notok "checkpoint_on_private_disks_resumed_across_machines" "rcs:$RCS checkpoints:$ck" "$(tail -5 "$WORK/mn6r.h2.log")" \
  "$(tail -5 "$WORK/mn6r.h1.log")"; fi

# 7. 3D: --tp 2 --pp 2 on 2 machines x 2 ranks: each machine is one tensor-parallel group,
#    machine 1 the whole last stage (replicas of its ranks on machine 0, the other stage). It
#    crashes; the spare machine takes both coordinates; the model equals the same layout's
#    single-machine run.
run_job "$WORK/ref3d" 300 --workers 4 --spares 0 --model tiny --steps "$STEPS" --seed 7 --tp 2 --pp 2 --grad-accum 2
J=mn7; start_machine 1 $J --tp 2 --pp 2 --grad-accum 2; start_machine 2 $J --tp 2 --pp 2 --grad-accum 2
start_machine 3 $J --tp 2 --pp 2 --grad-accum 2
if wait_step $J 1 60; then host_kill 2; fi
finish 1 3
host_wait "${LAUNCHER[2]}" 5 >/dev/null
host_restart 2
rec=$(events $J | grep -o '"total_ms":[0-9]*' | head -1)
if cmp -s "$WORK/ref3d/model.bin" "${HOST_DISK[1]}/$J/model.bin" && cmp -s "$WORK/ref3d/model.bin" "${HOST_DISK[3]}/$J/model.bin" \
   && [ "$RCS" = " 0 0" ] && [ "$(events $J | grep '"event":"decision"' | grep -c '"failed":2')" -eq 1 ] && clean; then
  ok "machine_of_a_pipeline_stage_crashes_3d ($rec)"
else notok "machine_of_a_pipeline_stage_crashes_3d" "rcs:$RCS" "$(events $J | grep -E 'failure|decision|recovered')" \
  "$(tail -3 "$WORK/$J.h1.log")" "$(tail -3 "$WORK/$J.h3.log")"; fi

hosts_destroy >/dev/null || notok "hosts_destroy" "something was left"
