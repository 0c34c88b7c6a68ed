#!/usr/bin/env bash
# e2e_untrusted.sh — Redis is storage the job does not trust (issue 34 items 1, 2): whoever
# holds its password (here the test, acting as the attacker) finds neither the job's secret
# nor its key in it, cannot make a spare run another program through a forged config, and a
# forged record of a rank's replica holders is refused (nobody dials the attacker's address):
# the job stops with a checkpoint to resume from, and --resume ends byte-identical to a run
# that was never attacked.
source "$(dirname "$0")/lib_e2e.sh"
command -v redis-server >/dev/null || { echo "ok - untrusted # SKIP no redis-server"; exit 0; }

lp=""; np=""
trap 'kill "$rp" $np 2>/dev/null; [ -n "$lp" ] && kill -9 -- "-$lp" 2>/dev/null; rm -rf "$WORK"' EXIT
redis_private untrusted || exit 0
# One machine of a multi-machine job (a shared Redis, --secret-file), the built-in trainer;
# replicas on the spare, a checkpoint every 50 steps.
JOB=(--redis "redis://127.0.0.1:$port" --nnodes 1 --nproc-per-node 2 --workers 2 --spares 1 --secret-file "$SECRET_FILE"
     --replica-placement spares --persist-every 100 --steps 600 --seed 5)

run_job "$WORK/ref" 120 "${JOB[@]}" --job ref; rc=$?
[ $rc -eq 0 ] && [ -s "$WORK/ref/model.bin" ] && ok "untrusted_reference" || notok "untrusted_reference" "rc $rc" "$(tail -3 "$WORK/ref.log")"

# The attacker's address for a forged holder: a listener that counts who connects.
/usr/bin/python3 - "$WORK/dialed" <<'EOF' &
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1] + ".port", "w").write(str(s.getsockname()[1]))
n = 0
s.settimeout(120)
try:
    while True:
        c, _ = s.accept(); n += 1; open(sys.argv[1], "w").write(str(n)); c.close()
except OSError:
    pass
EOF
np=$!
for _ in $(seq 100); do [ -s "$WORK/dialed.port" ] && break; sleep 0.05; done
evil_port=$(cat "$WORK/dialed.port" 2>/dev/null)

mkdir -p "$WORK/a"
setsid "$DP" run --out "$WORK/a" "${JOB[@]}" --job J --inject kill:1@450 >"$WORK/a.stdout" 2>"$WORK/a.log" &
lp=$!
for _ in $(seq 400); do rcli GET dp:J:metrics:last | grep -q '"step":\([6-9][0-9]\|1[0-4][0-9]\),' && break; sleep 0.05; done
# (the attack below takes about a second: it is done long before step 450)

# 1. Everything in Redis, as the attacker reads it: no secret, no job key.
rcli --scan --pattern 'dp:J:*' >"$WORK/keys"
while read -r k; do
  case $(rcli TYPE "$k") in
    string) echo "GET $k" ;; hash) echo "HGETALL $k" ;; list) echo "LRANGE $k 0 -1" ;; set) echo "SMEMBERS $k" ;;
    zset) echo "ZRANGE $k 0 -1" ;;
  esac
done <"$WORK/keys" | rcli >"$WORK/dump"
worker=$(rcli HGET dp:J:proc:1 pid)
key=$(tr '\0' '\n' <"/proc/$worker/environ" 2>/dev/null | sed -n 's/^DEADPOOL_JOB_KEY=//p')
fields=$(rcli HKEYS dp:J:config | tr '\n' ' ')
if [ ${#key} -eq 64 ] && [ "$(wc -l <"$WORK/dump")" -gt 20 ] && ! grep -qF "$(cat "$SECRET_FILE")" "$WORK/dump" \
   && ! grep -qF "$key" "$WORK/dump" && { [ "$fields" = "config t0_ms " ] || [ "$fields" = "t0_ms config " ]; }; then
  ok "secret_and_job_key_not_in_redis ($(wc -l <"$WORK/keys") keys read; config fields: $fields)"
else notok "secret_and_job_key_not_in_redis" "job key of pid $worker: ${#key} characters; config fields: $fields"; fi

# 2. A forged config (the real one's text, untagged, naming another program): a spare started
#    by hand refuses it and runs nothing.
printf '#!/bin/sh\ntouch %s/pwned\n' "$WORK" >"$WORK/evil.sh"; chmod 755 "$WORK/evil.sh"
real=$(rcli HGET dp:J:config config)
forged=$(printf '%s\n' "${real#*.}" | sed "s|^program=.*|program=$WORK/evil.sh|")
rcli HSET dp:J:config config "$forged" >/dev/null
timeout -k 5 30 "$DP" worker --spare --job J --redis "redis://127.0.0.1:$port" --secret-file "$SECRET_FILE" \
  >"$WORK/spare.stdout" 2>"$WORK/spare.log"; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'refused a value from redis' "$WORK/spare.log" && [ ! -e "$WORK/pwned" ]; then
  ok "forged_config_runs_nothing (rc $rc: $(grep -m1 -o 'config: .*' "$WORK/spare.log" | cut -c1-70))"
else notok "forged_config_runs_nothing" "rc $rc; pwned: $([ -e "$WORK/pwned" ] && echo yes || echo no)" "$(tail -2 "$WORK/spare.log")"; fi
rcli HSET dp:J:config config "$real" >/dev/null # the job's own spares (respawned after the kill) read it again

# 3. A forged record of rank 1's replica holders, pointing at the attacker's listener, before
#    rank 1 is killed (at step 450): refused, so nobody dials it; the job stops with its checkpoint.
epoch=$(rcli GET dp:J:epoch); epoch=${epoch:-0}
rcli SET "dp:J:e$epoch:holders:1" "3@127.0.0.1:$evil_port" >/dev/null
timeout 120 tail --pid="$lp" -f /dev/null; wait "$lp"; rc=$?; lp=""
dialed=$(cat "$WORK/dialed" 2>/dev/null || echo 0)
if [ $rc -ne 0 ] && [ "$dialed" = 0 ] && grep -q 'holders in Redis does not verify' "$WORK/a.log" \
   && grep -q 'refused a value from redis' "$WORK/a.log"; then
  ok "forged_holders_refused_nobody_dials_them (rc $rc)"
else notok "forged_holders_refused_nobody_dials_them" "rc $rc; the attacker's listener was dialed $dialed times" "$(tail -3 "$WORK/a.log")"; fi

timeout -k 5 120 "$DP" run --resume "$WORK/a" "${JOB[@]}" --job J >"$WORK/a.resumed.stdout" 2>"$WORK/a.resumed.log"; rc=$?
if [ $rc -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$WORK/a/model.bin" && no_leftovers "$WORK/a"; then
  ok "attacked_job_resumed_bit_identical"
else notok "attacked_job_resumed_bit_identical" "rc $rc" "$(tail -3 "$WORK/a.resumed.log")"; fi

# 4. A forged job state: "done", then "failed", written over the real one while the job runs.
#    Before the state was sealed every process took it for the end: the ranks left, their state
#    was lost, rc 1. Now it is refused (as if absent, logged once per reader) and the job ends
#    as if never attacked.
mkdir -p "$WORK/s"
setsid "$DP" run --out "$WORK/s" "${JOB[@]}" --job S >"$WORK/s.stdout" 2>"$WORK/s.log" &
lp=$!
for _ in $(seq 400); do rcli GET dp:S:metrics:last | grep -q '"step":\([1-9][0-9][0-9]\),' && break; sleep 0.05; done
rcli SET dp:S:state done >/dev/null; sleep 0.5; rcli SET dp:S:state failed >/dev/null
timeout 120 tail --pid="$lp" -f /dev/null; wait "$lp"; rc=$?; lp=""
refusals=$(grep -c "refused a value from redis: job 'S': state" "$WORK/s.log")
if [ $rc -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$WORK/s/model.bin" && [ "$refusals" -ge 1 ] && [ "$refusals" -le 8 ]; then
  ok "forged_job_state_refused_job_ends_identical (rc 0; refused, logged $refusals times)"
else notok "forged_job_state_refused_job_ends_identical" "rc $rc; model $(cmp -s "$WORK/ref/model.bin" "$WORK/s/model.bin" && echo identical || echo differs); refusals logged $refusals" \
  "$(grep -m2 'refused a value' "$WORK/s.log")" "$(tail -3 "$WORK/s.log")"; fi

# 5. Whether a failed rank had state of its own. That used to be a key whose absence meant
#    "nothing of its own": deleting it made the spare of a rank with a data cursor restore an
#    empty generation, and the job ended rc 0 with another model (examples/mlp.c). Now it is
#    a sealed claim "nothing of its own through step S" that only ranks without state of
#    their own write: deleted, forged or copied from another rank's key, it reads as none, and
#    the spare fetches the rank's state. The attacker deletes and forges both ranks' keys,
#    old name and new, 100 times a second until the job ends.
MLP=("$ROOT/build/examples/mlp")
MJOB=(--redis "redis://127.0.0.1:$port" --workers 3 --spares 1 --steps 400 --seed 7)
run_job "$WORK/mref" 120 "${MJOB[@]}" -- "${MLP[@]}"; rc=$?
before=$(rcli --scan --pattern 'dp:*:config' | sort)
mkdir -p "$WORK/m"
setsid "$DP" run --out "$WORK/m" "${MJOB[@]}" --inject kill:1@300 -- "${MLP[@]}" >"$WORK/m.stdout" 2>"$WORK/m.log" &
lp=$!
job=""
for _ in $(seq 200); do
  job=$(rcli --scan --pattern 'dp:*:config' | sort | comm -13 <(echo "$before") - | head -1 | cut -d: -f2)
  [ -n "$job" ] && break; sleep 0.05
done
(
  while kill -0 "$lp" 2>/dev/null; do
    printf 'DEL dp:%s:own:%d\nSET dp:%s:stateless:%d 400\n' "$job" 0 "$job" 0 "$job" 1 "$job" 1 "$job" 2 "$job" 2; sleep 0.01
  done | rcli >/dev/null
) &
atk=$!
timeout 120 tail --pid="$lp" -f /dev/null; wait "$lp"; rc2=$?; lp=""
kill "$atk" 2>/dev/null; wait "$atk" 2>/dev/null
refused=$(grep -c "refused a value from redis: job '$job': stateless" "$WORK/m.log")
rec=$(grep -c '"event":"recovered"' "$WORK/m/events.jsonl" 2>/dev/null)
if [ -n "$job" ] && [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ "${rec:-0}" -ge 1 ] && cmp -s "$WORK/mref/model.bin" "$WORK/m/model.bin" \
   && ! grep -q "has no state of its own" "$WORK/m.log"; then
  ok "forged_stateless_claims_refused_spare_fetches_its_state (job $job: rc 0, ${rec} recovered, model identical; refusals logged $refused)"
else notok "forged_stateless_claims_refused_spare_fetches_its_state" "job '$job': rc $rc / $rc2; ${rec:-0} recovered; model $(cmp -s "$WORK/mref/model.bin" "$WORK/m/model.bin" && echo identical || echo differs)" \
  "$(grep -m1 'has no state of its own' "$WORK/m.log")" "$(tail -3 "$WORK/m.log")"; fi
