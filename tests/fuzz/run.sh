#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS_PER_HARNESS | -runs=N] [NAME...] — runs the libFuzzer harnesses
# (build/fuzz/fuzz_NAME, built by `make fuzz`; default: every tests/fuzz/fuzz_*.c) one after
# another, each for SECONDS (default 60) or N executions, under ASan+UBSan, and prints per
# harness the executions done and the crashes found, ending with
# "ok - fuzz_NAME (N execs)" or "not ok - fuzz_NAME ...".
#
# Corpora: tests/fuzz/corpus/NAME (seeds, checked in; `make fuzz-corpus` rewrites them) and
# tests/fuzz/regress/NAME (inputs that once crashed: every one is a fixed bug) are read;
# what the fuzzer finds new goes to build/fuzz/corpus/NAME, which later runs start from.
# A crash stops that harness: its input is saved as build/fuzz/crashes/NAME/crash-* (or
# leak-, timeout-, oom-) and the log is build/fuzz/logs/NAME.log. Reproduce with
# `build/fuzz/fuzz_NAME FILE`; after the fix, the input goes to tests/fuzz/regress/NAME/.
# Extra libFuzzer flags: FUZZ_FLAGS="-max_len=8192 ...". The long run (docs/RELIABILITY.md):
#   make fuzz && tests/fuzz/run.sh -runs=1000000
set -u
cd "$(dirname "$0")/../.." || exit 2
limit=${1:-60}
[ $# -gt 0 ] && shift
if [[ "$limit" == -runs=* ]]; then budget=("$limit")
elif [[ "$limit" =~ ^[0-9]+$ ]]; then budget=("-max_total_time=$limit")
else echo "usage: tests/fuzz/run.sh [SECONDS_PER_HARNESS | -runs=N] [NAME...]" >&2; exit 2; fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do n=${f##*/fuzz_}; names+=("${n%.c}"); done
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for name in "${names[@]}"; do
  bin=build/fuzz/fuzz_$name
  if [ ! -x "$bin" ]; then
    echo "not ok - fuzz_$name: $bin is missing (make fuzz)"; failed=$((failed + 1)); continue
  fi
  work=build/fuzz/corpus/$name crashes=build/fuzz/crashes/$name log=build/fuzz/logs/$name.log
  mkdir -p "$work" "$crashes" build/fuzz/logs
  running=$(mktemp "build/fuzz/logs/$name.XXXXXX") # a run beside this one (make test) keeps its own log
  seeds=()
  for d in tests/fuzz/corpus/$name tests/fuzz/regress/$name; do [ -d "$d" ] && seeds+=("$d"); done
  before=$(ls "$crashes" | wc -l)
  start=$(date +%s)
  # -timeout: one input running 25 s is a hang (a finding); -rss_limit_mb: so is 2 GB of memory.
  # shellcheck disable=SC2086
  "$bin" "${budget[@]}" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" ${FUZZ_FLAGS:-} "$work" "${seeds[@]}" >"$running" 2>&1
  rc=$?
  mv -f "$running" "$log"
  secs=$(( $(date +%s) - start ))
  execs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  [ -n "$execs" ] || execs=$(grep -ao '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  [ -n "$execs" ] || execs=0
  found=$(( $(ls "$crashes" | wc -l) - before ))
  # 72: libFuzzer was interrupted (SIGINT/SIGTERM from outside): no finding, but no full run either
  [ "$rc" -ne 0 ] && [ "$rc" -ne 72 ] && [ "$found" -eq 0 ] && found=1 # died without saving an input: a finding
  echo "fuzz_$name: $execs executions in ${secs} s, $found crashes (log: $log)"
  if [ "$rc" -eq 0 ] && [ "$found" -eq 0 ]; then
    echo "ok - fuzz_$name ($execs execs)"
  elif [ "$rc" -eq 72 ] && [ "$found" -eq 0 ]; then
    failed=$((failed + 1))
    echo "not ok - fuzz_$name interrupted from outside after $execs execs (no crash)"
  else
    failed=$((failed + 1))
    grep -a -m 3 -E 'ERROR: |fuzz check failed|runtime error|SUMMARY' "$log" | sed 's/^/  /'
    ls -t "$crashes" | head -3 | sed "s|^|  input: $crashes/|"
    echo "not ok - fuzz_$name ($execs execs, $found crashes; exit status $rc)"
  fi
done
[ "$failed" -eq 0 ]
