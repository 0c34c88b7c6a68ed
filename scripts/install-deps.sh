#!/usr/bin/env bash
# Installs the Debian packages DeadPool needs, only when something is missing. With --test,
# also what only the tests use (`make test` passes it).
set -euo pipefail
pkgs=(build-essential pkg-config libgloo-dev libhiredis-dev redis-server libopenblas-dev iproute2
      libmicrohttpd-dev libjansson-dev libsodium-dev)
# chromium: renders report.html headless in tests/e2e_observe.sh; curl: scrapes /metrics there.
[ "${1:-}" = "--test" ] && pkgs+=(chromium curl)
# clang + libclang-rt-dev (libFuzzer, ASan, UBSan): the fuzz harnesses of tests/e2e_fuzz.sh and
# tests/fuzz/run.sh; llvm: llvm-symbolizer, so their reports name functions and lines.
[ "${1:-}" = "--test" ] && pkgs+=(clang libclang-rt-dev llvm)
# python3-torch (1.13, CPU) + numpy: the PyTorch examples and tests/e2e_torch.sh, e2e_python.sh;
# python3-setuptools + python3-pip: `pip install ./python` (offline) in tests/e2e_install.sh;
# patch: examples/torch/cnn_ddp_deadpool.patch applied in tests/e2e_torch.sh.
[ "${1:-}" = "--test" ] && pkgs+=(python3-torch python3-numpy python3-setuptools python3-pip patch)
# slurmctld, slurmd, slurm-client (Debian's slurm-wlm, 22.05) + munge: the Slurm cluster of
# tests/e2e_slurm.sh (tests/lib_slurm.sh), whose daemons run inside simulated machines only.
[ "${1:-}" = "--test" ] && pkgs+=(slurmctld slurmd slurm-client munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# No daemon a package installs (munge, slurmctld, slurmd, redis-server) may start here: a
# policy-rc.d that denies every start while apt runs (unless the machine already has one,
# as Debian's container images do), removed afterwards.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts while it installs\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  trap '$SUDO rm -f "$policy"' EXIT
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# systemd may start a unit on its own (enabled for multi-user.target): the cluster's daemons
# never run outside the tests' machines
if [ -d /run/systemd/system ]; then
  for s in slurmctld slurmd munge; do
    case " ${missing[*]} " in *" $s "*) $SUDO systemctl disable --now "$s" >/dev/null 2>&1 || true ;; esac
  done
fi
