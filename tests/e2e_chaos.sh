#!/usr/bin/env bash
# e2e_chaos.sh — random kills and hangs (--chaos) across several seeded runs: at least 20
# faults in all, every one recovered, every final model identical to its failure-free run.
source "$(dirname "$0")/lib_e2e.sh"

total=0; all_ok=1
for seed in 1 2 3 4 5; do
  COMMON=(--workers 4 --model tiny --steps 120 --seed "$seed" --detect-timeout-ms 500)
  run_job "$WORK/ref$seed" 120 "${COMMON[@]}" --spares 0 || { all_ok=0; echo "  reference $seed failed"; }
  run_job "$WORK/chaos$seed" 300 "${COMMON[@]}" --spares 1 --chaos 0.05; rc=$?
  faults=$(grep -c '"event":"fault_injected"' "$WORK/chaos$seed/events.jsonl")
  recovered=$(grep -c '"event":"recovered"' "$WORK/chaos$seed/events.jsonl")
  same=no; cmp -s "$WORK/ref$seed/model.bin" "$WORK/chaos$seed/model.bin" && same=yes
  echo "  seed $seed: rc $rc, $faults faults, $recovered recovered, identical model: $same"
  total=$((total + faults))
  if [ $rc -ne 0 ] || [ "$faults" -ne "$recovered" ] || [ $same != yes ] || ! no_leftovers "$WORK/chaos$seed"; then
    all_ok=0; tail -5 "$WORK/chaos$seed.log"
  fi
done
if [ $all_ok -eq 1 ] && [ $total -ge 20 ]; then ok "chaos ($total faults over 5 seeds, all recovered, all models identical)"
else notok "chaos" "$total faults"; fi

# The long harness's kinds in short: faults from outside (spares, holders, a corrupted replica,
# the redis-server, a full disk, a second failure while a spare restores), a dozen of them.
# The long run (>= 500 faults) is `tests/chaos_long.sh 500 1 docs/chaos.md`; see docs/RELIABILITY.md.
bash "$(dirname "$0")/chaos_long.sh" 12 "${CHAOS_SEED:-42}"
