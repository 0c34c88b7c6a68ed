#!/usr/bin/env bash
# e2e_files.sh — the job's files against another local user (issue 27, items 6–9 and 17): a
# checkpoint never names the program that runs, no link planted in --out is followed (writing
# or pruning), the disk-full rescue path is private and the last line names it, resume reads
# regular files only, a worker asking for a rank the job lacks is refused at once. The
# attacker's side runs as `nobody` where the machine allows it.
source "$(dirname "$0")/lib_e2e.sh"
BASE=(--model tiny --seed 21 --workers 1 --spares 0)
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
NOBODY=0
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1 && as_nobody true 2>/dev/null; then NOBODY=1; fi
# A directory of nobody's own, for what it writes (the job's $WORK is private).
if [ $NOBODY -eq 1 ]; then
  NWORK=$(as_nobody mktemp -d /tmp/dp_e2e_nobody_XXXXXX)
  trap 'rm -rf "$NWORK"; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
fi

# manifest_fix DIR — recomputes DIR/MANIFEST after a file in DIR was changed, as anybody can
# (CRC32C is no secret).
manifest_fix() {
  python3 - "$1" <<'PY'
import os, sys
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8): c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF
d = sys.argv[1]; lines = open(d + "/MANIFEST").read().splitlines(); out = [lines[0]]
for l in lines[1:]:
    crc, size, name = l.split()
    data = open(os.path.join(d, name), "rb").read()
    out.append("%08x %d %s" % (crc32c(data), len(data), name))
open(d + "/MANIFEST", "w").write("\n".join(out) + "\n")
PY
}

# A checkpoint to tamper with: 4 steps, one at steps 2 and 4.
run_job "$WORK/ck" 120 "${BASE[@]}" --steps 4 --persist-every 2; rc=$?
last="$WORK/ck/ckpt/step_000000004"
[ $rc -eq 0 ] && [ -f "$last/DONE" ] || notok "checkpoint_for_the_tests" "rc $rc" "$(tail -2 "$WORK/ck.log")"
cp -a "$WORK/ck" "$WORK/ck.orig"

# 6. --resume never runs what a file names: the checkpoint's config.txt names a script (here
# nobody's), the MANIFEST recomputed. The resumed job must refuse, and the script never runs.
evil_dir=$WORK
[ $NOBODY -eq 1 ] && evil_dir=$NWORK
printf '#!/bin/sh\ntouch %s/pwned\nexit 0\n' "$WORK" >"$WORK/evil.sh"
if [ $NOBODY -eq 1 ]; then as_nobody sh -c "cat >'$NWORK/evil.sh'" <"$WORK/evil.sh"; as_nobody chmod 755 "$NWORK/evil.sh"
else chmod 755 "$WORK/evil.sh"; fi
chmod 711 "$WORK" # the script may write its marker only as root; nobody may reach the marker's directory
sed -i "s|^program=.*|program=$evil_dir/evil.sh|" "$last/config.txt"
manifest_fix "$last"
timeout -k 5 60 "$DP" run --resume "$WORK/ck" >"$WORK/p6.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ ! -e "$WORK/pwned" ] && grep -q "never runs a program named in a checkpoint" "$WORK/p6.out"; then
  ok "resume_never_runs_the_program_a_checkpoint_names"
else notok "resume_never_runs_the_program_a_checkpoint_names" "rc $rc, marker $(ls "$WORK/pwned" 2>&1)" "$(tail -2 "$WORK/p6.out")"; fi
# ... and given after --, another program than the checkpoint's is refused too.
rm -rf "$WORK/ck" && cp -a "$WORK/ck.orig" "$WORK/ck"
timeout -k 5 60 "$DP" run --resume "$WORK/ck" -- "$evil_dir/evil.sh" >"$WORK/p6b.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ ! -e "$WORK/pwned" ] && grep -q "written by the program '(the built-in trainer)'" "$WORK/p6b.out"; then
  ok "resume_refuses_another_program_than_the_checkpoints"
else notok "resume_refuses_another_program_than_the_checkpoints" "rc $rc" "$(tail -2 "$WORK/p6b.out")"; fi
chmod 700 "$WORK"

# 9. Resume reads regular files only: a FIFO or a link to /dev/zero where a state file belongs
# is refused at once, naming it (it used to hang forever). Only that checkpoint is left, so the
# resume cannot fall back to an older one.
for kind in fifo zero; do
  rm -rf "$WORK/ck" && cp -a "$WORK/ck.orig" "$WORK/ck" && rm -r "$WORK/ck/ckpt/step_000000002"
  rm "$last/rank_00000.state"
  if [ $kind = fifo ]; then mkfifo "$last/rank_00000.state"; want="is a FIFO"
  else ln -s /dev/zero "$last/rank_00000.state"; want="is a symbolic link"; fi
  timeout -k 5 30 "$DP" run --resume "$WORK/ck" >"$WORK/p9$kind.out" 2>&1; rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank_00000.state: $want; expected a regular file" "$WORK/p9$kind.out"; then
    ok "resume_refuses_a_state_file_that_is_a_$kind"
  else notok "resume_refuses_a_state_file_that_is_a_$kind" "rc $rc (124: hung)" "$(tail -2 "$WORK/p9$kind.out")"; fi
done

# 7. No link planted in --out is followed. Root-owned victims: a file and a directory.
printf 'secret\n' >"$WORK/victim"; chmod 600 "$WORK/victim"
mkdir -p "$WORK/victimdir" && printf 'keep\n' >"$WORK/victimdir/precious"
# (a) an --out that nobody created and planted: refused, nothing written through its links.
if [ $NOBODY -eq 1 ]; then
  as_nobody mkdir -m 755 "$NWORK/out"
  as_nobody ln -s "$WORK/victim" "$NWORK/out/events.jsonl"
  as_nobody mkdir -m 755 "$NWORK/out/ckpt"
  as_nobody ln -s "$WORK/victimdir" "$NWORK/out/ckpt/step_000000001"
  chmod 711 "$WORK"
  timeout -k 5 60 "$DP" run --out "$NWORK/out" "${BASE[@]}" --steps 6 --persist-every 2 >"$WORK/p7a.out" 2>&1; rc=$?
  chmod 700 "$WORK"
  if [ $rc -ne 0 ] && grep -q "owned by uid $(id -u nobody), not by this user" "$WORK/p7a.out" \
     && [ "$(cat "$WORK/victim")" = secret ] && [ -f "$WORK/victimdir/precious" ]; then
    ok "out_of_another_user_refused"
  else notok "out_of_another_user_refused" "rc $rc victim '$(head -c 60 "$WORK/victim")'" "$(ls "$WORK/victimdir")" "$(tail -2 "$WORK/p7a.out")"; fi
  # (b) our own --out that every user may write, planted by nobody: refused the same way.
  mkdir -m 777 "$WORK/o7b" && chmod 777 "$WORK/o7b" && chmod 711 "$WORK"
  as_nobody ln -s "$WORK/victim" "$WORK/o7b/events.jsonl"
  timeout -k 5 60 "$DP" run --out "$WORK/o7b" "${BASE[@]}" --steps 2 >"$WORK/p7b.out" 2>&1; rc=$?
  chmod 700 "$WORK"
  if [ $rc -ne 0 ] && grep -q "writable by every user (mode 0777)" "$WORK/p7b.out" && [ "$(cat "$WORK/victim")" = secret ]; then
    ok "world_writable_out_refused"
  else notok "world_writable_out_refused" "rc $rc victim '$(head -c 60 "$WORK/victim")'" "$(tail -2 "$WORK/p7b.out")"; fi
else
  echo "ok - out_of_another_user_refused # skip needs root and a nobody user"
  echo "ok - world_writable_out_refused # skip needs root and a nobody user"
fi
# (c) a link left in our own --out as a step directory: pruning removes the link, never what it
# points to. (d) a log file that is a link: refused, nothing written through it.
mkdir -m 700 -p "$WORK/o7c/ckpt"
ln -s "$WORK/victimdir" "$WORK/o7c/ckpt/step_000000001"
run_job "$WORK/o7c" 120 "${BASE[@]}" --steps 6 --persist-every 2; rc=$?
if [ $rc -eq 0 ] && [ -f "$WORK/victimdir/precious" ] && [ ! -e "$WORK/o7c/ckpt/step_000000001" ]; then
  ok "pruning_removes_a_link_not_its_target"
else notok "pruning_removes_a_link_not_its_target" "rc $rc victimdir: $(ls "$WORK/victimdir" | tr '\n' ' ')" \
  "$(ls -l "$WORK/o7c/ckpt")" "$(tail -2 "$WORK/o7c.log")"; fi
mkdir -m 700 -p "$WORK/o7d"
ln -s "$WORK/victim" "$WORK/o7d/metrics.jsonl"
run_job "$WORK/o7d" 120 "${BASE[@]}" --steps 2; rc=$?
if [ $rc -ne 0 ] && [ "$(cat "$WORK/victim")" = secret ] && grep -q "metrics.jsonl: is a symbolic link" "$WORK/o7d.log"; then
  ok "log_file_link_in_out_refused"
else notok "log_file_link_in_out_refused" "rc $rc victim '$(head -c 60 "$WORK/victim")'" "$(tail -2 "$WORK/o7d.log")"; fi

# 8. The disk-full rescue: a new private directory of an unpredictable name in TMPDIR, and the
# last line names where the model went; (17) the checkpoints that failed for want of room leave
# no empty step directory behind. (Root: a tiny tmpfs as --out.)
if [ "$(id -u)" -eq 0 ] && mkdir -p "$WORK/full" && mount -t tmpfs -o size=300k,mode=700 tmpfs "$WORK/full" 2>/dev/null; then
  mkdir -m 1777 "$WORK/tmp"
  TMPDIR="$WORK/tmp" run_job "$WORK/full" 120 "${BASE[@]}" --steps 4 --persist-every 2; rc=$?
  empty=$(find "$WORK/full" -type d -empty -name 'step_*' | tr '\n' ' ')
  rescue=$(grep -o "written to [^ ]* instead" "$WORK/full.log" | cut -d' ' -f3)
  dir=$(dirname "$rescue")
  last_line=$(grep "done:" "$WORK/full.log" | tail -1)
  if [ $rc -eq 0 ] && [ -f "$rescue" ] && [ "$(stat -c %a "$dir")" = 700 ] && [[ "$(basename "$dir")" =~ ^deadpool-model-......$ ]] \
     && [[ "$last_line" == *"model in $rescue"* ]]; then
    ok "full_disk_rescue_private_and_named ($rescue)"
  else notok "full_disk_rescue_private_and_named" "rc $rc rescue '$rescue' mode $(stat -c %a "$dir" 2>&1)" "$last_line"; fi
  if [ $rc -eq 0 ] && grep -q "persist step 2: .*No space left" "$WORK/full.log" && [ -z "$empty" ]; then
    ok "failed_checkpoints_leave_no_empty_step_directory"
  else notok "failed_checkpoints_leave_no_empty_step_directory" "rc $rc empty: $empty" "$(grep persist "$WORK/full.log" | head -2)"; fi
  umount "$WORK/full"
else
  echo "ok - full_disk_rescue_private_and_named # skip needs root and tmpfs"
  echo "ok - failed_checkpoints_leave_no_empty_step_directory # skip needs root and tmpfs"
fi

# 17. An --out that is a file is named as such, not as "in use by another running job".
printf x >"$WORK/afile"
timeout -k 5 30 "$DP" run --out "$WORK/afile" "${BASE[@]}" --steps 2 >"$WORK/p17.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "afile: is not a directory" "$WORK/p17.out" && ! grep -q "in use" "$WORK/p17.out"; then
  ok "out_that_is_a_file_named_as_such"
else notok "out_that_is_a_file_named_as_such" "rc $rc" "$(tail -2 "$WORK/p17.out")"; fi
# 17. Resuming a finished run says it is done without a made-up loss.
rm -rf "$WORK/ck" && cp -a "$WORK/ck.orig" "$WORK/ck"
timeout -k 5 60 "$DP" run --resume "$WORK/ck" >"$WORK/p17b.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "done: 4 steps" "$WORK/p17b.out" && ! grep -q "final loss 0.0000" "$WORK/p17b.out"; then
  ok "resume_of_a_finished_run_prints_no_made_up_loss"
else notok "resume_of_a_finished_run_prints_no_made_up_loss" "rc $rc" "$(grep done: "$WORK/p17b.out")"; fi
# 17. `deadpool worker --rank R` beyond the job's ranks is refused at once, naming the ranks
# (it used to fail later, in the collectives, as "comm_create: invalid arguments").
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  pw=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for _ in 1 2 3; do # a port another program holds: the server exits, try another
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
  mkdir -p "$WORK/wr"
  "$DP" run --out "$WORK/wr" --model tiny --steps 100000 --seed 3 --workers 3 --spares 0 \
    --secret-file "$SECRET_FILE" --redis "redis://:$pw@127.0.0.1:$port" >"$WORK/wr.stdout" 2>"$WORK/wr.log" &
  lp=$!
  for _ in $(seq 600); do [ "$(count_lines "$WORK/wr/metrics.jsonl")" -ge 2 ] && break; sleep 0.05; done
  [ "$(count_lines "$WORK/wr/metrics.jsonl")" -ge 2 ] \
    || echo "# waited 30 s for 2 steps in $WORK/wr/metrics.jsonl: saw $(count_lines "$WORK/wr/metrics.jsonl") (last: '$(tail -1 "$WORK/wr.log")')" >&2
  job=$(grep -o '"job":"[0-9a-f]*"' "$WORK/wr/events.jsonl" | head -1 | cut -d'"' -f4)
  t0=$(date +%s)
  DEADPOOL_REDIS_PASSWORD=$pw timeout 60 "$DP" worker --redis "redis://127.0.0.1:$port" --job "$job" --secret-file "$SECRET_FILE" --rank 7 \
    >"$WORK/wr.worker.log" 2>&1; wrc=$?; secs=$(( $(date +%s) - t0 ))
  kill $lp 2>/dev/null
  for _ in $(seq 300); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
  kill -9 $lp 2>/dev/null; wait $lp 2>/dev/null
  kill "$rp" 2>/dev/null; wait "$rp" 2>/dev/null
  if [ -n "$job" ] && [ $wrc -ne 0 ] && [ $wrc -ne 124 ] && [ $secs -le 10 ] && grep -q -- "--rank 7: job '$job' has 3 ranks (0 to 2)" "$WORK/wr.worker.log"; then
    ok "worker_rank_beyond_the_job_refused_at_once (${secs}s)"
  else notok "worker_rank_beyond_the_job_refused_at_once" "job '$job' rc $wrc ${secs}s" "$(tail -3 "$WORK/wr.worker.log")"; fi
else
  echo "ok - worker_rank_beyond_the_job_refused_at_once # skip needs redis-server and redis-cli"
fi
