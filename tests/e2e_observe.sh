#!/usr/bin/env bash
# e2e_observe.sh — seeing what happened: `deadpool report` (malformed logs are clear errors;
# a run with two failures shows both in every plot; the page renders in headless Chromium),
# `--metrics-port` (/metrics answers during the run, its values match metrics.jsonl, it listens
# on loopback only, it survives malformed and slow requests, it stops with the job), and the
# progress and recovery lines. Every wait is bounded; only processes started here are killed;
# the network is 127.0.0.1 only.
source "$(dirname "$0")/lib_e2e.sh"

# --- deadpool report on malformed logs: an error naming file and line, never a crash --------
good_m='{"step":1,"loss":5.5,"lr":0.001,"grad_norm":1,"step_ms":40,"tokens_per_s":9000,"epoch":0,"committed_step":0,"snapshot_wait_ms":0,"t":0.5}'
good_e='{"event":"start","t":0.000,"job":"abcd","workers":2,"spares":1,"program":"@gpt2","steps":2,"seed":1}'
# bad_logs NAME FILE WANT LINE... — FILE (metrics or events) gets the lines after a good one;
# `deadpool report` must exit 1 and say FILE.jsonl:WANT.
bad_logs() {
  local name=$1 file=$2 want=$3; shift 3
  local d="$WORK/bad_$name" out rc
  mkdir -p "$d"; echo "$good_m" >"$d/metrics.jsonl"; echo "$good_e" >"$d/events.jsonl"
  printf '%s\n' "$@" >>"$d/$file.jsonl"
  out=$(timeout 20 "$DP" report "$d" 2>&1); rc=$?
  if [ $rc -eq 1 ] && grep -q "$d/$file.jsonl:$want" <<<"$out" && [ ! -e "$d/report.html" ]; then
    ok "report_rejects_$name ($(sed "s|$d/||" <<<"$out" | head -1))"
  else notok "report_rejects_$name" "rc $rc" "$out"; fi
}
bad_logs truncated_line metrics 2 '{"step":2,"loss":5.4,"t":0.6' 
bad_logs not_an_object events 2 '[1,2,3]'
bad_logs step_not_a_number metrics 3 '{"step":2,"loss":5.4,"t":0.6}' '{"step":"three","loss":5.3,"t":0.7}'
bad_logs event_without_name events 2 '{"t":1.0,"rank":1}'
bad_logs recovery_field_wrong_type events 2 '{"event":"recovered","t":1.5,"rank":1,"total_ms":"fast"}'
bad_logs duplicate_member metrics 2 '{"step":2,"step":3,"t":0.6}'
bad_logs binary_garbage metrics 2 "$(head -c 300 /dev/urandom | tr -d '\n\000')"
d="$WORK/bad_missing"; mkdir -p "$d"; echo "$good_e" >"$d/events.jsonl"
out=$(timeout 20 "$DP" report "$d" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q "$d/metrics.jsonl: cannot open" <<<"$out"; then ok "report_missing_file_named"
else notok "report_missing_file_named" "rc $rc" "$out"; fi
# A diverged loss is printed as nan: not JSON, but the report still comes out, without it.
d="$WORK/nan_loss"; mkdir -p "$d"; echo "$good_e" >"$d/events.jsonl"
printf '%s\n{"step":2,"loss":nan,"step_ms":41,"t":0.6}\n{"step":3,"loss":-inf,"step_ms":42,"t":0.7}\n' "$good_m" >"$d/metrics.jsonl"
out=$(timeout 20 "$DP" report "$d" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q 'not finite' "$d/report.html"; then ok "report_reads_nan_loss"
else notok "report_reads_nan_loss" "rc $rc" "$out"; fi

# --- a run with two failures, watched through /metrics --------------------------------------
free_port() {
  local p
  for _ in $(seq 50); do
    p=$(( 20000 + RANDOM % 20000 ))
    [ -z "$(ss -Hltn "sport = :$p" 2>/dev/null)" ] && { echo "$p"; return; }
  done
  echo "# free_port: 50 random ports in 20000-39999 all taken (last: $p), using 0" >&2
  echo 0
}
P=$(free_port)
URL="http://127.0.0.1:$P/metrics"
OUT="$WORK/run"
mkdir -p "$OUT"
# STEPS of the tiny model: long enough (here about 25 s on 2 cores) to probe the server while
# it runs; the probes take about 8 s.
STEPS=600
timeout -k 5 240 "$DP" run --out "$OUT" --workers 4 --spares 2 --model tiny --steps $STEPS --seed 5 \
  --inject kill:1@10 --inject kill:2@25 --metrics-port "$P" --report >"$OUT.stdout" 2>"$OUT.log" &
JP=$!
running() { kill -0 $JP 2>/dev/null; }
scrape() { curl -s --max-time 5 -o "$1" -w '%{http_code}' "$URL" 2>/dev/null; }
metric() { awk -v n="$1" '$1 == n { print $2 }' "$2"; }

# The first scrape with a step in it.
code=""; got=""
for _ in $(seq 400); do
  running || break
  code=$(scrape "$WORK/s1.txt")
  [ "$code" = 200 ] && got=$(metric deadpool_step "$WORK/s1.txt") && [ -n "$got" ] && break
  sleep 0.05
done
if [ "$code" = 200 ] && [ -n "$got" ] && grep -q '^# TYPE deadpool_loss gauge' "$WORK/s1.txt"; then
  ok "metrics_answer_during_the_run (step $got)"
else notok "metrics_answer_during_the_run" "http '$code' step '$got' running $(running && echo yes || echo no)" "$(tail -3 "$OUT.log")"; fi

# compare_scrape FILE — the scrape's step, epoch, loss, step time, tokens/s and committed step
# are those of the metrics.jsonl line of that step and epoch.
compare_scrape() {
  local s=$1 step epoch line
  step=$(metric deadpool_step "$s"); epoch=$(metric deadpool_epoch "$s")
  line=$(grep "\"step\":$step,.*\"epoch\":$epoch," "$OUT/metrics.jsonl" | tail -1)
  [ -n "$line" ] || { echo "no metrics.jsonl line for step $step epoch $epoch"; return 1; }
  local jl js jt jc
  jl=$(grep -o '"loss":[-0-9.e+]*' <<<"$line" | cut -d: -f2)
  js=$(grep -o '"step_ms":[-0-9.e+]*' <<<"$line" | cut -d: -f2)
  jt=$(grep -o '"tokens_per_s":[-0-9.e+]*' <<<"$line" | cut -d: -f2)
  jc=$(grep -o '"committed_step":[-0-9]*' <<<"$line" | cut -d: -f2)
  awk -v a="$(metric deadpool_loss "$s")" -v b="$jl" -v c="$(metric deadpool_step_duration_seconds "$s")" -v d="$js" \
      -v e="$(metric deadpool_tokens_per_second "$s")" -v f="$jt" -v g="$(metric deadpool_committed_step "$s")" -v h="$jc" '
    function near(x, y) { return (x - y) <= 1e-6 * (1 + (y < 0 ? -y : y)) && (y - x) <= 1e-6 * (1 + (y < 0 ? -y : y)) }
    BEGIN { ok = a != "" && near(a, b) && near(c * 1000, d) && near(e, f) && g == h
            if (!ok) printf "loss %s/%s step_s %s/%s tok %s/%s committed %s/%s\n", a, b, c, d, e, f, g, h
            exit !ok }' || return 1
  echo "step $step epoch $epoch loss $jl"
}
if why=$(compare_scrape "$WORK/s1.txt"); then ok "metrics_match_metrics_jsonl ($why)"
else notok "metrics_match_metrics_jsonl" "$why" "$(head -40 "$WORK/s1.txt")"; fi

# Loopback only, unless --bind says otherwise.
listen=$(ss -Hltn "sport = :$P" 2>/dev/null | awk '{ print $4 }')
if [ "$listen" = "127.0.0.1:$P" ]; then ok "metrics_listen_on_loopback"
else notok "metrics_listen_on_loopback" "listening on '$listen'"; fi

# A second job asking for the same port stops at once, saying why, before starting anything.
timeout -k 5 30 "$DP" run --out "$WORK/busy" --workers 2 --spares 0 --model tiny --steps 5 --metrics-port "$P" \
  >"$WORK/busy.stdout" 2>"$WORK/busy.log"; rc=$?
if [ $rc -eq 1 ] && grep -q -- "--metrics-port: .*cannot listen on 127.0.0.1:$P" "$WORK/busy.log" && [ ! -e "$WORK/busy/events.jsonl" ]; then
  ok "metrics_port_in_use_is_a_clear_error"
else notok "metrics_port_in_use_is_a_clear_error" "rc $rc" "$(tail -2 "$WORK/busy.log")"; fi

# raw NAME STATUS_RE — sends $WORK/req (bounded) and checks the first line of the answer;
# the server must then still answer /metrics.
raw() {
  local name=$1 want=$2 first code
  first=$(timeout 8 bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"$P"' || exit 9; cat "$1" >&3 2>/dev/null; head -c 300 <&3 | head -1 | tr -d "\r"' _ "$WORK/req")
  code=$(scrape "$WORK/after.txt")
  if grep -qE "$want" <<<"$first" && [ "$code" = 200 ]; then ok "metrics_survive_$name (${first:-connection closed})"
  else notok "metrics_survive_$name" "answer '$first', then /metrics http '$code'"; fi
}
printf 'GARBAGE\r\n\r\n' >"$WORK/req";                               raw garbage_request_line '^$|^HTTP/1\.[01] 400'
head -c 65536 /dev/urandom >"$WORK/req";                             raw binary_junk '^$|^HTTP/1\.[01] 4[0-9][0-9]'
{ printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: '; head -c 100000 /dev/zero | tr '\0' a; printf '\r\n\r\n'; } >"$WORK/req"
raw oversized_header '^$|^HTTP/1\.[01] 4(13|31)'
printf 'POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello' >"$WORK/req"; raw post '^HTTP/1\.[01] 405'
printf 'GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n' >"$WORK/req";               raw unknown_path '^HTTP/1\.[01] (400|404)'
printf 'GET /metrics HTTP/7.3\r\nHost: x\r\n\r\n' >"$WORK/req";                        raw bad_version '^$|^HTTP/1\.[01] (400|505)'
printf 'HEAD /metrics HTTP/1.0\r\n\r\n' >"$WORK/req";                                  raw head '^HTTP/1\.[01] 200'

# Slow clients: 8 connections each send half a request and stall. /metrics must answer
# meanwhile, and the server must close a stalled connection by itself (its idle timeout is 5 s).
fds=()
for _ in $(seq 8); do
  exec {fd}<>"/dev/tcp/127.0.0.1/$P" && { printf 'GET /metrics HTTP/1.1\r\nHost: slow\r\n' >&$fd; fds+=("$fd"); }
done
t0=$(date +%s%N)
code=$(scrape "$WORK/slow.txt")
t1=$(date +%s%N)
timeout 12 cat <&"${fds[0]}" >/dev/null 2>&1; closed=$?
t2=$(date +%s%N)
for fd in "${fds[@]}"; do exec {fd}>&-; done
if [ ${#fds[@]} -eq 8 ] && [ "$code" = 200 ] && [ $closed -eq 0 ]; then
  ok "metrics_survive_slow_clients (/metrics in $(( (t1 - t0) / 1000000 )) ms with 8 stalled; a stalled one closed after $(( (t2 - t0) / 1000000 )) ms)"
else notok "metrics_survive_slow_clients" "connections ${#fds[@]}, http '$code', stalled connection closed: rc $closed"; fi

# Both recoveries counted, while the job still runs.
n=""
for _ in $(seq 600); do
  running || break
  scrape "$WORK/s2.txt" >/dev/null
  n=$(metric 'deadpool_recoveries_total{kind="crash"}' "$WORK/s2.txt")
  [ "$n" = 2 ] && break
  sleep 0.1
done
if [ "$n" = 2 ] && [ -n "$(metric deadpool_last_recovery_seconds "$WORK/s2.txt")" ] \
   && [ -n "$(metric 'deadpool_last_recovery_phase_seconds{phase="restore"}' "$WORK/s2.txt")" ] \
   && [ -n "$(metric deadpool_spares_available "$WORK/s2.txt")" ] && [ "$(metric 'deadpool_failures_total{kind="crash"}' "$WORK/s2.txt")" = 2 ] \
   && why=$(compare_scrape "$WORK/s2.txt"); then
  ok "metrics_count_recoveries_by_kind ($why)"
else notok "metrics_count_recoveries_by_kind" "crash recoveries '$n' running $(running && echo yes || echo no) ${why:-}" "$(grep -E 'recover|spares' "$WORK/s2.txt")"; fi

for _ in $(seq 2400); do running || break; sleep 0.1; done
running && echo "# waited 240 s for the job to end: still running, killed (last: '$(tail -1 "$OUT.log")')" >&2
kill -9 $JP 2>/dev/null; wait $JP; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '"event":"recovered"' "$OUT/events.jsonl")" = 2 ] && no_leftovers "$OUT"; then ok "run_with_two_failures"
else notok "run_with_two_failures" "rc $rc" "$(tail -5 "$OUT.log")"; fi
code=$(curl -s --max-time 3 -o /dev/null -w '%{http_code}' "$URL" 2>/dev/null)
if [ "$code" = 000 ]; then ok "metrics_server_stops_with_the_job"; else notok "metrics_server_stops_with_the_job" "http '$code'"; fi

# --- the progress and recovery lines ----------------------------------------------------------
if grep -qE "^step +$STEPS/$STEPS \| loss [0-9.]+ \| +[0-9]+ tok/s \| +[0-9.]+ ms/step \| committed +($((STEPS - 1))|$STEPS) \| spares [0-9]+ \| ETA 0:00 \|" "$OUT.stdout" \
   && grep -qE "^step +$((STEPS / 2))/$STEPS .*\| ETA [0-9]+:[0-9]{2} \|" "$OUT.stdout"; then
  ok "progress_line_has_eta_spares_committed"
else notok "progress_line_has_eta_spares_committed" "$(grep -E "^step +($((STEPS / 2))|$STEPS)/" "$OUT.stdout")"; fi
rec=$(grep -cE '^\[deadpool\] recovery of rank [12] \(crash, spare [0-9]+\): detect [0-9.]+ \+ decide [0-9.]+ \+ restore [0-9.]+ \+ rebuild [0-9.]+ \+ re-snapshot [0-9.]+ ms -> resumed after [0-9]+ ms' "$OUT.stdout")
if [ "$rec" = 2 ]; then ok "recovery_line_with_phases ($(grep -m1 '^\[deadpool\] recovery of' "$OUT.stdout" | cut -c 12-))"
else notok "recovery_line_with_phases" "$rec lines" "$(grep deadpool "$OUT.stdout")"; fi

# --- the report of that run -------------------------------------------------------------------
R="$OUT/report.html"
bad=""
[ -s "$R" ] || bad="no report.html"
for plot in plot-loss plot-steptime plot-recovery plot-snapshot; do
  svg=$(sed -n "/<svg id=\"$plot\"/,/<\/svg>/p" "$R")
  [ -n "$svg" ] || { bad="$bad; no $plot"; continue; }
  for k in 1 2; do grep -q "class=\"failure\" data-failure=\"$k\"" <<<"$svg" || bad="$bad; $plot lacks failure $k"; done
  grep -q 'data-failure="3"' <<<"$svg" && bad="$bad; $plot shows a third failure"
done
# The recovery timeline: each failure's phases stacked (detect .. first step).
rsvg=$(sed -n '/<svg id="plot-recovery"/,/<\/svg>/p' "$R")
for k in 1 2; do
  row=$(sed -n "/<g class=\"failure\" data-failure=\"$k\">/,/<\/g>/p" <<<"$rsvg")
  for ph in detect decide restore rebuild re-snapshot 'first step'; do
    grep -q "data-phase=\"$ph\"" <<<"$row" || bad="$bad; failure $k lacks phase $ph"
  done
done
# The failures table names ranks 1 and 2, the job table the run.
ranks=$(grep -o '<tr data-failure="[0-9]*"><td>[0-9]*</td><td>[0-9.]*</td><td>[0-9]*</td><td>crash</td>' "$R" | sed 's/.*<td>\([0-9]*\)<\/td><td>crash.*/\1/' | tr '\n' ' ')
[ "$ranks" = "1 2 " ] || bad="$bad; failures table ranks '$ranks'"
grep -q "$STEPS of $STEPS done" "$R" || bad="$bad; job table lacks the steps"
grep -q '<td>spares used</td><td>2</td>' "$R" || bad="$bad; job table lacks spares used"
grep -qE '<td>time lost to failures</td><td>[0-9.]+ s' "$R" || bad="$bad; job table lacks time lost"
if [ -z "$bad" ]; then ok "report_shows_both_failures_in_every_plot ($(stat -c %s "$R") bytes)"
else notok "report_shows_both_failures_in_every_plot" "$bad"; fi
if ! grep -vE 'https?://www\.w3\.org/' "$R" | grep -qiE '<script|<link|<img|<iframe|src=|https?://'; then ok "report_is_self_contained"
else notok "report_is_self_contained" "$(grep -vE 'https?://www\.w3\.org/' "$R" | grep -oiE '<script|<link|<img|<iframe|src=|https?://[^"]*' | head -3)"; fi

# --- the report renders in headless Chromium ---------------------------------------------------
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ] && [ "$(id -u)" -eq 0 ]; then
  timeout 300 "$ROOT/scripts/install-deps.sh" --test >/dev/null 2>&1
  CHROME=$(command -v chromium || true)
fi
if [ -z "$CHROME" ]; then
  echo "# report_renders_in_chromium: skipped (chromium cannot be installed here)"
else
  prof="$WORK/chrome-profile"
  copts=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$prof" --window-size=1000,1900
         --enable-logging=stderr --v=0)
  timeout -k 5 90 "$CHROME" "${copts[@]}" --screenshot="$WORK/report.png" "file://$R" >"$WORK/chrome.out" 2>&1; crc=$?
  timeout -k 5 90 "$CHROME" "${copts[@]}" --dump-dom "file://$R" >"$WORK/dom.html" 2>"$WORK/chrome.dom.err"
  size=$(stat -c %s "$WORK/report.png" 2>/dev/null || echo 0)
  magic=$(head -c 8 "$WORK/report.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
  nsvg=$(grep -oE '<svg id="plot-(loss|steptime|recovery|snapshot)"' "$WORK/dom.html" | sort -u | wc -l)
  errs=$(grep -hiE 'Uncaught|CONSOLE\(|Refused|net::ERR' "$WORK/chrome.out" "$WORK/chrome.dom.err" | head -3)
  if [ $crc -eq 0 ] && [ "$magic" = 89504e470d0a1a0a ] && [ "$size" -gt 30000 ] && [ "$nsvg" = 4 ] && [ -z "$errs" ]; then
    ok "report_renders_in_chromium (screenshot $size bytes, 4 plots in the DOM)"
  else notok "report_renders_in_chromium" "rc $crc png $magic $size bytes, $nsvg plots in the DOM" "$errs" "$(tail -3 "$WORK/chrome.out")"; fi
fi
