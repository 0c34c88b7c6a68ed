#!/usr/bin/env bash
# e2e_install.sh — `make install PREFIX=...` gives a user what they need to build their own
# loop: a program compiled only against the installed header and pkg-config file links (static
# and shared), runs under the installed `deadpool`, and recovers from a kill with the same model.
source "$(dirname "$0")/lib_e2e.sh"
PREFIX="$WORK/prefix"

if make -C "$ROOT" install PREFIX="$PREFIX" >"$WORK/install.log" 2>&1 && [ -x "$PREFIX/bin/deadpool" ] \
   && [ -f "$PREFIX/include/deadpool.h" ] && [ -f "$PREFIX/lib/pkgconfig/deadpool.pc" ]; then
  ok "make_install_prefix"
else notok "make_install_prefix" "$(tail -3 "$WORK/install.log")"; fi

export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
# One version: the header's, the pkg-config file's, the soname's major; only deadpool.h's
# functions exported.
v=$(sed -n 's/^#define DEADPOOL_VERSION "\(.*\)"/\1/p' "$PREFIX/include/deadpool.h")
others=$(nm -D --defined-only "$PREFIX/lib/libdeadpool.so" | awk '{print $3}' | grep -v '^dp_' | head -5)
declared=$(grep -c '^DP_EXPORT' "$PREFIX/include/deadpool.h"); exported=$(nm -D --defined-only "$PREFIX/lib/libdeadpool.so" | grep -c ' dp_')
if [ -n "$v" ] && [ "$(pkg-config --modversion deadpool)" = "$v" ] && [ -f "$PREFIX/lib/libdeadpool.so.${v%%.*}" ] \
   && objdump -p "$PREFIX/lib/libdeadpool.so" | grep -q "SONAME *libdeadpool.so.${v%%.*}$" && [ -z "$others" ] \
   && [ "$declared" -eq "$exported" ]; then
  ok "one_version_and_only_the_api_exported ($v, $exported functions)"
else notok "one_version_and_only_the_api_exported" "header $v, pc $(pkg-config --modversion deadpool), declared $declared, exported $exported, others: $others"; fi
mkdir -p "$WORK/user" && cp "$ROOT/examples/mlp.c" "$WORK/user/my_loop.c"
# Shared: the documented one-liner.
if (cd "$WORK/user" && cc -std=c11 -Wall -Wextra -o my_loop my_loop.c $(pkg-config --cflags --libs deadpool) -lm) \
     >"$WORK/cc.log" 2>&1; then ok "builds_with_pkg_config"; else notok "builds_with_pkg_config" "$(head -5 "$WORK/cc.log")"; fi
# Static: pkg-config --static adds the library's own dependencies.
if (cd "$WORK/user" && cc -std=c11 -o my_loop_static my_loop.c $(pkg-config --cflags deadpool) \
      "$PREFIX/lib/libdeadpool.a" $(pkg-config --static --libs deadpool | sed 's/-ldeadpool//') -lm) >"$WORK/cc2.log" 2>&1; then
  ok "links_statically"
else notok "links_statically" "$(head -5 "$WORK/cc2.log")"; fi
# What is installed is portable (no -march=native: it may run on another CPU), and the library
# and a program linked against it need no HTTP server, launcher or coordinator (the tool's).
march=$(for f in "$PREFIX/lib/libdeadpool.so" "$PREFIX/bin/deadpool"; do readelf --debug-dump=info "$f" 2>/dev/null \
  | grep DW_AT_producer | grep -o -- '-march=[^ ]*'; done | sort -u | tr '\n' ' ')
tool=$(nm -D "$PREFIX/lib/libdeadpool.so" | grep -E 'MHD_|launcher_|coord_|redis_server_' | head -3)
if [ "$march" = "-march=x86-64 " ] && ! ldd "$PREFIX/lib/libdeadpool.so" "$WORK/user/my_loop" | grep -q microhttpd \
   && [ -z "$tool" ]; then
  ok "installed_is_portable_and_the_library_is_not_the_tool"
else notok "installed_is_portable_and_the_library_is_not_the_tool" "march: $march; tool symbols: $tool" \
  "$(ldd "$PREFIX/lib/libdeadpool.so" | grep microhttpd)"; fi
# The default build's library is portable too (only the built-in trainer is built for this
# CPU, where it was measured to pay: docs/BENCHMARKS.md), so a program linked against
# build/libdeadpool.so runs on any x86-64.
march=$(readelf --debug-dump=info "$ROOT/build/libdeadpool.so" 2>/dev/null | grep DW_AT_producer \
  | grep -o -- '-march=[^ ]*' | sort -u | tr '\n' ' ')
[ "$march" = "-march=x86-64 " ] && ok "default_build_library_is_portable" \
  || notok "default_build_library_is_portable" "march: $march"
# The header is C11 and C++.
if printf '#include <deadpool.h>\nint main(void) { return DP_OK; }\n' | c++ -x c++ -std=c++17 -Wall -Wextra -Werror \
     -I"$PREFIX/include" -o "$WORK/cxx" - >"$WORK/cxx.log" 2>&1 \
   && printf '#include <deadpool.h>\nint main(void) { return DP_OK; }\n' | cc -x c -std=c11 -Wall -Wextra -Werror -pedantic \
     -I"$PREFIX/include" -o "$WORK/c11" - >>"$WORK/cxx.log" 2>&1; then
  ok "header_compiles_as_c11_and_cxx"
else notok "header_compiles_as_c11_and_cxx" "$(head -5 "$WORK/cxx.log")"; fi

export LD_LIBRARY_PATH="$PREFIX/lib"
DP="$PREFIX/bin/deadpool"
run_job "$WORK/ref" 120 --workers 2 --spares 0 --steps 120 --seed 3 -- "$WORK/user/my_loop"; rc=$?
run_job "$WORK/kill" 120 --workers 2 --spares 1 --steps 120 --seed 3 --inject kill:1@50 -- "$WORK/user/my_loop"; rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && grep -q '"event":"recovered"' "$WORK/kill/events.jsonl" \
   && cmp -s "$WORK/ref/model.bin" "$WORK/kill/model.bin" && no_leftovers "$WORK/kill"; then
  ok "installed_program_runs_and_recovers"
else notok "installed_program_runs_and_recovers" "rc $rc $rc2" "$(tail -3 "$WORK/kill.log")"; fi
if [ -x "$WORK/user/my_loop_static" ]; then
  run_job "$WORK/static" 120 --workers 2 --spares 1 --steps 120 --seed 3 --inject kill:0@70 -- "$WORK/user/my_loop_static"; rc=$?
  if [ $rc -eq 0 ] && cmp -s "$WORK/ref/model.bin" "$WORK/static/model.bin"; then ok "static_program_recovers"
  else notok "static_program_recovers" "rc $rc" "$(tail -3 "$WORK/static.log")"; fi
fi

# Python: the installed package finds the installed library by itself (no DEADPOOL_LIB, no
# PYTHONPATH beyond the prefix's dist-packages), and `pip install ./python` works offline.
if (cd "$WORK" && env -u DEADPOOL_LIB PYTHONPATH="$PREFIX/lib/python3/dist-packages" /usr/bin/python3 -c \
      "import deadpool; assert deadpool.find_library().startswith('$PREFIX/lib/'), deadpool.find_library()") \
      >"$WORK/py.log" 2>&1; then ok "installed_python_package_finds_the_library"
else notok "installed_python_package_finds_the_library" "$(tail -3 "$WORK/py.log")"; fi
if cp -r "$ROOT/python" "$WORK/pysrc" && timeout 120 /usr/bin/python3 -m pip install --no-index --no-cache-dir \
      --break-system-packages --target "$WORK/pip" "$WORK/pysrc" >"$WORK/pip.log" 2>&1 \
   && [ -f "$WORK/pip/deadpool/torch.py" ]; then ok "pip_install_offline"
else notok "pip_install_offline" "$(tail -3 "$WORK/pip.log")"; fi
