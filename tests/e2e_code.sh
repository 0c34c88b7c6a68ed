#!/usr/bin/env bash
# e2e_code.sh — properties of the code itself that the design relies on (issue 28):
#  - no decision is made from text: the files that detect, decide and recover match no
#    substring of an event line or an error message (reports and exceptions are typed);
#  - the shared library exports deadpool.h's functions and nothing else, and does not link
#    the tool's parts (an HTTP server);
#  - key names, hash field names and the rendezvous's sub-keys are spelled in one place each.
source "$(dirname "$0")/lib_e2e.sh"
cd "$ROOT" || exit 1

DECIDING=(src/tool/launcher*.c src/tool/coordinator*.c src/tool/decide.c src/control/recovery.c
          src/runtime/runtime.c src/runtime/rt_*.c src/runtime/lifecycle.c src/data/snapshot.c src/data/replica*.c src/data/comm_gloo.cc
          src/data/comm_gloo_transport.cc)
hits=$(grep -nE 'strstr|strcasestr|memmem|\.find\("|std::string::npos' "${DECIDING[@]}")
if [ -z "$hits" ]; then ok "no_decision_from_a_substring (${#DECIDING[@]} files)"
else notok "no_decision_from_a_substring" "$hits"; fi

others=$(nm -D --defined-only build/libdeadpool.so | awk '{print $3}' | grep -v '^dp_' | head -5)
declared=$(grep -c '^DP_EXPORT' include/deadpool.h)
exported=$(nm -D --defined-only build/libdeadpool.so | awk '{print $3}' | grep -c '^dp_')
if [ -z "$others" ] && [ "$declared" -eq "$exported" ] && ! ldd build/libdeadpool.so | grep -q microhttpd; then
  ok "library_exports_the_api_only ($exported functions)"
else notok "library_exports_the_api_only" "declared $declared, exported $exported, others: $others"; fi

# Key names (issue 28, item 1): spelled in control.c's key table only. Outside it no source
# spells a key of the namespace ("dp:..." or the "dp-fresh:" claim), make_key takes no literal
# suffix, and no suffix or list name is handed to a control-plane call as a literal.
key_sources=$(find src python/deadpool -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.py' | sort)
key_hits=$(for f in $key_sources; do
  awk -v f="$f" '/BEGIN the key table/ { skip = 1 } !skip { print f ":" FNR ": " $0 } /END the key table/ { skip = 0 }' "$f"
done | grep -E '"dp:([%*"a-z])|"dp-fresh|make_key\([^;]*"|ctl_(set|get|set_nx|take|counter_incr|counter_at_least|hash_set|hash_getall|set_add_count|batch_set)\([^,;]*, *"|ctl_(drain|notify|notify_many|wait_notice|batch_notify)\([^;]*"')
# Hash fields (item 1): the config hash's and a process's hash's fields are named by their enum
# (control.h: ctl_config_field, ctl_proc_field), spelled beside the key table only: no field
# literal is handed to ctl_config_* / ctl_proc_*, nor listed in a fields array for one.
field_hits=$(for f in $key_sources; do
  awk -v f="$f" '/BEGIN the key table/ { skip = 1 } !skip { print f ":" FNR ": " $0 } /END the key table/ { skip = 0 }' "$f"
done | grep -E 'ctl_(config|proc)_(get|set|get_many)\([^;"()]*, *"|fields\[\] *= *\{ *"')
if [ -z "$field_hits" ]; then ok "hash_fields_spelled_once"
else notok "hash_fields_spelled_once" "$(echo "$field_hits" | head -12)"; fi
# The collective rendezvous's sub-keys (item 4): spelled by protocol.h's proto_rdzv_key only.
rdzv_hits=$(grep -nE '"(m|w)/|key\("n"\)|/w/%d' src/data/comm_gloo*.cc src/runtime/*.c src/tool/*.c src/control/control*.c src/control/recovery.c)
if [ -z "$rdzv_hits" ]; then ok "rendezvous_keys_spelled_once"
else notok "rendezvous_keys_spelled_once" "$(echo "$rdzv_hits" | head -8)"; fi
# One typed owner per stored value (issue 46, item 3): outside the control-plane client no
# source builds a key's suffix (ctl_key_suffix) to pair it with a codec itself; each key with
# a value has its accessor pair in src/control (a prefix handed to Gloo, ctl_key_full, aside).
pair_hits=$(grep -rn 'ctl_key_suffix(' src --include=*.c --include=*.cc --include=*.h | grep -v '^src/control/')
if [ -z "$pair_hits" ]; then ok "no_key_paired_with_a_codec_outside_the_client"
else notok "no_key_paired_with_a_codec_outside_the_client" "$(echo "$pair_hits" | head -8)"; fi
table=$(grep -c 'BEGIN the key table' src/control/control_keys.c)
if [ -z "$key_hits" ] && [ "$table" -eq 1 ]; then ok "key_names_spelled_once ($(echo "$key_sources" | wc -l) files)"
else notok "key_names_spelled_once" "table markers: $table; $(echo "$key_hits" | head -5)"; fi

# The layers (issue 46, item 2): a folder includes its own headers and those of the layers
# below it (the Makefile gives each folder only those on its include path; this says which
# include broke the rule, also for a file built with a wider path): common < job < control <
# data < runtime < tool; the built-in trainer (gpt2) is a client: common and deadpool.h only.
# And no two headers include each other, directly or around a circle (tsort finds the loop).
layer() { case $1 in common) echo 0 ;; job) echo 1 ;; control) echo 2 ;; data) echo 3 ;; runtime) echo 4 ;; tool) echo 9 ;; *) echo -1 ;; esac; }
up_hits=""
edges=""
for f in $(find src -name '*.c' -o -name '*.h' -o -name '*.cc' | sort); do
  d=$(cut -d/ -f2 <<<"$f")
  for h in $(grep -o '^#include "[^"]*"' "$f" | cut -d'"' -f2); do
    [ "$h" = deadpool.h ] && continue
    where=$(find src -name "$h" | head -1)
    [ -n "$where" ] || { up_hits="$up_hits $f: $h not found in src;"; continue; }
    e=$(cut -d/ -f2 <<<"$where")
    case $f in *.h) edges="$edges$f $where"$'\n' ;; esac
    if [ "$d" = gpt2 ]; then [ "$e" = gpt2 ] || [ "$e" = common ] || up_hits="$up_hits $f -> $where;"
    elif [ "$e" = gpt2 ]; then [ "$d" = tool ] || up_hits="$up_hits $f -> $where;"
    elif [ "$(layer "$e")" -gt "$(layer "$d")" ]; then up_hits="$up_hits $f -> $where;"; fi
  done
done
if [ -z "$up_hits" ]; then ok "includes_keep_the_layers"
else notok "includes_keep_the_layers" "$up_hits"; fi
loop=$(printf '%s' "$edges" | tsort 2>&1 >/dev/null)
if [ -z "$loop" ]; then ok "no_include_cycle ($(printf '%s' "$edges" | grep -c .) header includes)"
else notok "no_include_cycle" "$(echo "$loop" | tr '\n' ' ')"; fi
