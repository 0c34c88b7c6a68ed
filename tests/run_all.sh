#!/usr/bin/env bash
# Runs every unit-test binary (build/tests/test_*) and every end-to-end script (tests/e2e_*.sh),
# each under a timeout, counts "ok"/"not ok" lines, and ends with "N passed, N failed".
cd "$(dirname "$0")/.." || exit 2
passed=0; failed=0
log=$(mktemp -d)/tests.log
failures="" # "script: test" per failure, repeated before the count (a CI log may keep only its tail)
run_one() { # name, timeout seconds, command...
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  echo "== $name"
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  echo "-- $name: $((SECONDS - t0)) s"
  local p f
  p=$(grep -c '^ok - ' "$log"); f=$(grep -c '^not ok - ' "$log")
  passed=$((passed + p)); failed=$((failed + f))
  while IFS= read -r line; do failures+="  $name: ${line#not ok - }"$'\n'; done < <(grep '^not ok - ' "$log")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok - $name exited with status $rc"; failed=$((failed + 1)); failures+="  $name: exited with status $rc"$'\n'
  fi
  if [ "$rc" -eq 0 ] && [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok - $name reported no test"; failed=$((failed + 1)); failures+="  $name: reported no test"$'\n'
  fi
}
for t in build/tests/test_*; do
  [ -x "$t" ] && run_one "$(basename "$t")" 300 "$t"
done
for s in tests/e2e_*.sh; do
  [ -f "$s" ] && run_one "$(basename "$s" .sh)" 600 bash "$s"
done
[ -n "$failures" ] && printf 'failed:\n%s' "$failures"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
