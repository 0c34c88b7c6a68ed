#!/usr/bin/env bash
# e2e_code.sh — properties of the code itself that the design relies on (issue 28):
#  - no decision is made from text: the files that detect, decide and recover match no
#    substring of an event line or an error message (reports and exceptions are typed);
#  - the shared library exports deadpool.h's functions and nothing else, and does not link
#    the tool's parts (an HTTP server).
source "$(dirname "$0")/lib_e2e.sh"
cd "$ROOT" || exit 1

DECIDING=(src/lib/launcher.c src/lib/launcher_roles.c src/lib/coordinator.c src/lib/decide.c src/lib/recovery.c src/lib/runtime.c
          src/lib/snapshot.c src/lib/replica.c src/lib/comm_gloo.cc src/lib/comm_gloo_transport.cc)
hits=$(grep -nE 'strstr|strcasestr|memmem|\.find\("|std::string::npos' "${DECIDING[@]}")
if [ -z "$hits" ]; then ok "no_decision_from_a_substring (${#DECIDING[@]} files)"
else notok "no_decision_from_a_substring" "$hits"; fi

others=$(nm -D --defined-only build/libdeadpool.so | awk '{print $3}' | grep -v '^dp_' | head -5)
declared=$(grep -c '^DP_EXPORT' include/deadpool.h)
exported=$(nm -D --defined-only build/libdeadpool.so | awk '{print $3}' | grep -c '^dp_')
if [ -z "$others" ] && [ "$declared" -eq "$exported" ] && ! ldd build/libdeadpool.so | grep -q microhttpd; then
  ok "library_exports_the_api_only ($exported functions)"
else notok "library_exports_the_api_only" "declared $declared, exported $exported, others: $others"; fi
