#!/usr/bin/env bash
# e2e_fuzz.sh — the fuzzers' short run inside `make test`: builds the libFuzzer harnesses
# (make fuzz: clang, ASan+UBSan), runs each for FUZZ_SECONDS (default 5; nine harnesses,
# about 60 s in all, one after another), then replays every input in tests/fuzz/regress/NAME/
# (each once crashed a parser: it must not any more). Without clang the fuzzing is skipped and
# the regression inputs are replayed by the same harnesses built with cc (make fuzz-replay).
# The long run is documented in docs/RELIABILITY.md: make fuzz && tests/fuzz/run.sh -runs=1000000
source "$(dirname "$0")/lib_e2e.sh"
cd "$ROOT" || exit 2
names=()
for f in tests/fuzz/fuzz_*.c; do n=${f##*/fuzz_}; names+=("${n%.c}"); done

if command -v clang >/dev/null 2>&1; then
  if make fuzz >"$WORK/build.log" 2>&1; then
    ok "fuzz_harnesses_build"
    tests/fuzz/run.sh "${FUZZ_SECONDS:-5}" "${names[@]}"
    prefix=build/fuzz/fuzz_
  else
    notok "fuzz_harnesses_build" "$(grep -m 5 -E 'error|warning' "$WORK/build.log")"
    prefix=""
  fi
else
  echo "# fuzzing skipped: clang is not installed (scripts/install-deps.sh --test installs it);"
  echo "# replaying the regression inputs with harnesses built by cc"
  if make fuzz-replay >"$WORK/build.log" 2>&1; then prefix=build/fuzz/replay_
  else notok "fuzz_replay_build" "$(grep -m 5 -E 'error|warning' "$WORK/build.log")"; prefix=""; fi
fi

# Regression inputs: each is run once; a crash, sanitizer report or failed check fails it.
[ -n "$prefix" ] && for name in "${names[@]}"; do
  inputs=(tests/fuzz/regress/"$name"/*)
  [ -e "${inputs[0]}" ] || continue
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       timeout -k 5 120 "$prefix$name" "${inputs[@]}" >"$WORK/regress_$name.log" 2>&1; then
    ok "fuzz_regress_$name (${#inputs[@]} inputs)"
  else
    notok "fuzz_regress_$name" "$(grep -a -m 3 -E 'ERROR: |fuzz check failed|runtime error|Running:' "$WORK/regress_$name.log")"
  fi
done
exit 0
