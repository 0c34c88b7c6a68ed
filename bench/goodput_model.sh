#!/usr/bin/env bash
# bench/goodput_model.sh — the recovery and goodput model: how long a hot-swap recovery takes,
# and how much of a month a training job keeps, at 512 GPUs and at 16,384 GPUs, against a
# disk checkpoint + full restart at the checkpoint interval that is optimal for it
# (Young/Daly); and, to say how far the model can be trusted, its predictions for this machine
# at 4..128 ranks next to what bench/scale.sh measured here.
#
# usage: bench/goodput_model.sh [SCALE_DIR]      prints Markdown tables (bash + awk only)
#   SCALE_DIR: a directory kept by `KEEP=DIR bench/scale.sh ...` (n<N>.r<R>/events.jsonl and
#   metrics.jsonl of each run). Without it, the measured values built in below are used (the
#   run in docs/BENCHMARKS.md). Every other input is a variable below with its source; any of
#   them can be overridden from the environment (e.g. STORE_GBS_512=50 bench/goodput_model.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_DIR=${1:-}

# --- measured on this machine (bench/scale.sh, `micro`, kill -9 of one rank) ------------------
# Per N: median total_ms, rendezvous connect phase (ms, slowest rank), step time (ms). Used
# only when no SCALE_DIR is given; the run is the one in docs/BENCHMARKS.md.
MEASURED_DEFAULT=${MEASURED_DEFAULT:-"4 81 14 24
8 176 58 72
16 379 175 159
32 885 264 462
64 2603 684 2005
128 9580 1851 11924"}
CORES=${CORES:-$(nproc)}
# Constant parts of a recovery, measured here (ms): the coordinator's decision (batch window of
# 15 ms + ~12 Redis round trips), detection of a crash by the launcher (pidfd), re-snapshot.
DECIDE_MS=${DECIDE_MS:-18}
DETECT_CRASH_MS=${DETECT_CRASH_MS:-10}
REDIS_RT_HERE_MS=${REDIS_RT_HERE_MS:-0.03}   # tests/test_control: 1000 round trips in ~30 ms
COORD_RTS=${COORD_RTS:-12}                   # `decision` event: redis_round_trips
RANK_RTS=${RANK_RTS:-8}                      # `recovered` event: join_round_trips_max
HEARTBEAT_TTL_S=${HEARTBEAT_TTL_S:-2}        # --detect-timeout-ms default: a dead node is seen by expiry
HANG_DETECT_MEASURED_S=${HANG_DETECT_MEASURED_S:-1.74}  # BENCHMARKS: SIGSTOP detected after 1.74 s (median)
SNAPSHOT_OVERHEAD=${SNAPSHOT_OVERHEAD:-0.0188}  # BENCHMARKS: whole-run A/B, 90 pairs, +1.88 % (CPU training)

# --- hardware (sources in docs/BENCHMARKS.md, "The model's inputs") ---------------------------
# 512 GPUs: A100 80 GB, DGX A100 nodes of 8 GPUs: 8 x 200 Gb/s HDR InfiniBand for compute
# (25 GB/s per GPU), PCIe Gen4 x16 (32 GB/s per direction, ~25 GB/s achieved), host memory 2 x 8
# channels DDR4-3200 (2 x 204.8 GB/s) [NVIDIA DGX A100 system architecture white paper].
NIC_GBS_512=${NIC_GBS_512:-25};  PCIE_GBS_512=${PCIE_GBS_512:-25};  HOSTMEM_GBS_512=${HOSTMEM_GBS_512:-400}
# 16,384 GPUs: H100 80 GB, 8 per node, one 400 Gb/s NIC per GPU (50 GB/s) [Llama 3 paper, §3.3.1:
# RoCE / InfiniBand at 400 Gbps], PCIe Gen5 x16 (64 GB/s per direction), DDR5-4800 x 16 channels
# (614 GB/s) per node.
NIC_GBS_16K=${NIC_GBS_16K:-50};  PCIE_GBS_16K=${PCIE_GBS_16K:-50};  HOSTMEM_GBS_16K=${HOSTMEM_GBS_16K:-600}
NET_LAT_US=${NET_LAT_US:-10}     # one small message across the network (RDMA-class fabric)
REDIS_RT_CLUSTER_MS=${REDIS_RT_CLUSTER_MS:-0.2}  # one Redis round trip across a datacenter network
GPUS_PER_NODE=8

# --- the model being trained: 65B parameters, Megatron-style layout -------------------------
PARAMS=${PARAMS:-65e9}
TP=${TP:-8}; PP=${PP:-4}         # tensor parallel inside a node (NVLink), 4 pipeline stages
# DP = N / (TP * PP): 16 at 512 GPUs, 512 at 16,384 GPUs. ZeRO-1 over DP: each GPU owns 1/DP of
# the fp32 master weights and Adam m, v of its (tp, pp) slice: 12 bytes per parameter / DP.
# That shard exists nowhere else and is what is snapshotted and replicated; the bf16
# parameters (2 bytes per parameter of the slice) are the same on every DP peer and are copied
# from one after a swap.
TOKENS_PER_STEP_512=${TOKENS_PER_STEP_512:-4194304}     # 4M tokens per step (assumption)
TOKENS_PER_STEP_16K=${TOKENS_PER_STEP_16K:-16777216}    # 16M: Llama 3 paper, §3.4.1 (batch of 16M tokens)
MFU=${MFU:-0.40}                  # Llama 3 paper, Table 4: 38-43 % BF16 MFU
PEAK_TFLOPS_512=${PEAK_TFLOPS_512:-312}   # A100 BF16 dense
PEAK_TFLOPS_16K=${PEAK_TFLOPS_16K:-989}   # H100 SXM BF16 dense

# --- failures and the disk-checkpoint baseline ------------------------------------------------
INTERRUPTIONS=${INTERRUPTIONS:-419}; INT_DAYS=${INT_DAYS:-54}; INT_GPUS=${INT_GPUS:-16384}  # Llama 3 paper, §3.3.4
MONTH_DAYS=${MONTH_DAYS:-30}
RESTART_S=${RESTART_S:-200}       # TorchElastic-style restart of the whole job (../shared/DESIGN.md §1)
NCCL_INIT_16K_S=${NCCL_INIT_16K_S:-17}  # NCCL init alone at 16K GPUs (../shared/DESIGN.md §1)
CKPT_BYTES_PER_PARAM=${CKPT_BYTES_PER_PARAM:-14}  # bf16 params + fp32 master, m, v
STORE_GBS_512=${STORE_GBS_512:-100}     # parallel file system for 64 nodes (assumption)
STORE_GBS_16K=${STORE_GBS_16K:-2000}    # Llama 3 paper, §3.3.1: Tectonic, 2 TB/s sustained
SPARES_FRAC=${SPARES_FRAC:-0.0156}      # spare nodes: 1 per 64 (8 GPUs per 512)
# Per-pair connection cost of the communicator as built (Gloo full mesh, one listening socket
# per pair), CPU ms per pair and side, measured here (fit below); a rank of an N-GPU job makes
# N - 1 of them. A full mesh cannot be built at 16,384 GPUs with this Gloo: it needs 16,383
# listening ports per process, 131,064 per 8-GPU host, beyond the 65,535 a host has.

# ----------------------------------------------------------------------------------------------
# Measured points: from SCALE_DIR (medians over runs) or the defaults.
measured() {
  if [ -z "$SCALE_DIR" ]; then echo "$MEASURED_DEFAULT"; return; fi
  for d in "$SCALE_DIR"/n*.r*; do
    [ -f "$d/events.jsonl" ] || continue
    local n rec; n=$(basename "$d" | sed 's/^n\([0-9]*\)\..*/\1/')
    rec=$(grep '"event":"recovered"' "$d/events.jsonl" | grep -v '"rank":-1' | head -1) || true
    [ -n "$rec" ] || continue
    [ "$(grep -c '"event":"decision"' "$d/events.jsonl")" -eq 1 ] || continue
    local step; step=$(grep -o '"step_ms":[0-9.]*' "$d/metrics.jsonl" | tail -n +2 | cut -d: -f2 | sort -g |
      awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    echo "$rec" | awk -v n="$n" -v step="$step" '
      function f(k) { if (match($0, "\"" k "\":[-0-9.]+")) return substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3) + 0; return 0 }
      { print n, f("total_ms"), f("rendezvous_connect_ms"), step }'
  done | sort -n | awk '
    { n = $1; k = ++cnt[n]; t[n, k] = $2; c[n, k] = $3; s[n, k] = $4 }
    function med(arr, n, m,   i, j, x, v) { for (i = 1; i <= m; i++) v[i] = arr[n, i]
      for (i = 2; i <= m; i++) { x = v[i]; for (j = i - 1; j > 0 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
      return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
    END { for (n in cnt) printf "%d %.0f %.0f %.0f\n", n, med(t, n, cnt[n]), med(c, n, cnt[n]), med(s, n, cnt[n]) }' | sort -n
}
MEAS=$(measured)

awk -v meas="$MEAS" -v P="$CORES" \
    -v decide="$DECIDE_MS" -v detect="$DETECT_CRASH_MS" -v rt_here="$REDIS_RT_HERE_MS" -v coord_rts="$COORD_RTS" \
    -v rank_rts="$RANK_RTS" -v ttl="$HEARTBEAT_TTL_S" -v hang="$HANG_DETECT_MEASURED_S" -v ovh="$SNAPSHOT_OVERHEAD" \
    -v nic512="$NIC_GBS_512" -v pcie512="$PCIE_GBS_512" -v mem512="$HOSTMEM_GBS_512" \
    -v nic16k="$NIC_GBS_16K" -v pcie16k="$PCIE_GBS_16K" -v mem16k="$HOSTMEM_GBS_16K" \
    -v netlat="$NET_LAT_US" -v rt_cl="$REDIS_RT_CLUSTER_MS" -v gpn="$GPUS_PER_NODE" \
    -v params="$PARAMS" -v tp="$TP" -v pp="$PP" -v tok512="$TOKENS_PER_STEP_512" -v tok16k="$TOKENS_PER_STEP_16K" -v mfu="$MFU" \
    -v peak512="$PEAK_TFLOPS_512" -v peak16k="$PEAK_TFLOPS_16K" \
    -v nint="$INTERRUPTIONS" -v idays="$INT_DAYS" -v igpus="$INT_GPUS" -v month="$MONTH_DAYS" \
    -v restart="$RESTART_S" -v nccl16k="$NCCL_INIT_16K_S" -v ckptb="$CKPT_BYTES_PER_PARAM" \
    -v store512="$STORE_GBS_512" -v store16k="$STORE_GBS_16K" -v spares="$SPARES_FRAC" '
function log2(x) { return log(x) / log(2) }
function ceil(x) { return (x == int(x)) ? x : int(x) + 1 }
function max(a, b) { return a > b ? a : b }
function min(a, b) { return a < b ? a : b }
BEGIN {
  # ---------------- 1. this machine: calibrate on N <= 16, predict N = 32..128 ----------------
  nm = split(meas, lines, "\n")
  for (i = 1; i <= nm; i++) { split(lines[i], f, " "); if (f[1] == "") continue
    k++; N[k] = f[1]; T[k] = f[2]; C[k] = f[3]; S[k] = f[4] }
  # Mechanism. A recovery is (a) a constant: detection, the decision (a constant number of
  # Redis round trips: the `decision` event), restore and re-snapshot of `micro`; (b) chains
  # whose length grows with N and which run one rank after another: the hops of the ring
  # allgather that rebuilds the parameters and of the barriers, b per rank; (c) work every rank
  # does for every other rank, all of it sharing the P cores: the pairs of the full mesh each
  # rank creates, connects and tears down, c per rank and peer, N (N - 1) c / P in all.
  #   total(N) = a + b N + c N (N - 1) / P
  # a, b, c are fitted on N = 4, 8, 16 (least squares; exact with three points); N >= 32 are
  # predictions.
  n3 = 0
  for (i = 1; i <= k; i++) if (N[i] <= 16) { n3++; X1[n3] = N[i]; X2[n3] = N[i] * (N[i] - 1) / P; Y[n3] = T[i] }
  # normal equations of y = a + b x1 + c x2
  for (i = 1; i <= n3; i++) { s0 += 1; s1 += X1[i]; s2 += X2[i]; s11 += X1[i] * X1[i]; s12 += X1[i] * X2[i]
    s22 += X2[i] * X2[i]; t0 += Y[i]; t1 += X1[i] * Y[i]; t2 += X2[i] * Y[i] }
  D = s0 * (s11 * s22 - s12 * s12) - s1 * (s1 * s22 - s12 * s2) + s2 * (s1 * s12 - s11 * s2)
  fa = (t0 * (s11 * s22 - s12 * s12) - s1 * (t1 * s22 - s12 * t2) + s2 * (t1 * s12 - s11 * t2)) / D
  fb = (s0 * (t1 * s22 - s12 * t2) - t0 * (s1 * s22 - s12 * s2) + s2 * (s1 * t2 - t1 * s2)) / D
  fc = (s0 * (s11 * t2 - t1 * s12) - s1 * (s1 * t2 - t1 * s2) + t0 * (s1 * s12 - s11 * s2)) / D
  kappa = fc
  print "### The model on this machine: calibrated at 4-16 ranks, predicting 32-128"
  print ""
  printf "total(N) = a + b N + c N (N - 1) / P with P = %d cores: fitted a = %.0f ms, b = %.1f ms per rank (chains: ring hops), c = %.3f ms per rank and peer (the full mesh, all ranks sharing the cores).\n", P, fa, fb, fc
  print ""
  print "| ranks | model (ms) | measured, median (ms) | model / measured | its step time (ms) |"
  print "|---:|---:|---:|---:|---:|"
  for (i = 1; i <= k; i++) {
    tm = fa + fb * N[i] + fc * N[i] * (N[i] - 1) / P
    printf "| %d%s | %.0f | %.0f | %.2f | %.0f |\n", N[i], N[i] <= 16 ? " (fit)" : "", tm, T[i], tm / T[i], S[i] }
  print ""

  # ---------------- 2. the cluster: recovery time ----------------
  # On a cluster every rank has cores of its own: the c N (N - 1) / P of this machine is
  # (N - 1) c per rank there, in parallel.
  fail_rate_gpu_s = nint / (idays * 86400.0 * igpus)
  print "### Projection: one failure, and a month of training (65B, TP " tp " x PP " pp ")"
  print ""
  print "| | 512 A100 | 16,384 H100 |"
  print "|---|---:|---:|"
  for (c = 1; c <= 2; c++) {
    G = (c == 1) ? 512 : 16384
    nic = (c == 1) ? nic512 : nic16k; pcie = (c == 1) ? pcie512 : pcie16k; mem = (c == 1) ? mem512 : mem16k
    peak = (c == 1) ? peak512 : peak16k; store = (c == 1) ? store512 : store16k; tokens = (c == 1) ? tok512 : tok16k
    dp = G / (tp * pp); slice = params / (tp * pp)
    shard = 12 * slice / dp / 1e9            # GB per GPU: the non-reconstructible state
    pbytes = 2 * slice / 1e9                 # GB per GPU: bf16 parameters of its slice
    step = 6 * params * tokens / (G * peak * 1e12 * mfu)
    # a node (8 GPUs) fails: its spare node pulls 8 shards from 8 holders (one NIC each), and
    # the parameters of 8 slices from 8 DP peers, then copies both to the GPUs over PCIe
    restore = shard / min(nic, mem / gpn) + shard / pcie
    paramcopy = pbytes / nic + pbytes / pcie
    decide_c = 15 + coord_rts * rt_cl
    rdv_rts = 3 * rt_cl + rank_rts * rt_cl
    # the communicator as built, a full mesh: a rank makes G - 1 pair connections, half of them
    # dialed one after another (a network round trip each), at c of CPU each
    mesh = (G - 1) * (kappa + netlat / 2000)
    # hops of the rebuild: the ring among the DP peers that rebuilds the parameters, and the
    # first barrier and the broadcast over all G ranks (log2 G rounds each)
    rings = (dp - 1 + 2 * ceil(log2(G))) * netlat / 1000
    resnap = shard / pcie + shard / nic       # the restore point snapshotted and replicated again
    abortms = 5                               # closing the epoch wakes every rank at once (measured 4 ms here)
    crash = detect + decide_c + abortms + (restore + paramcopy) * 1000 + rdv_rts + mesh + rings + resnap * 1000
    node = ttl * 1000 + decide_c + abortms + (restore + paramcopy) * 1000 + rdv_rts + mesh + rings + resnap * 1000
    meshok = (G - 1) * gpn <= 65535 - 1024
    # Where a full mesh cannot be built, the communicator is NCCL-style (its published init
    # time); "lazy" is a communicator connecting only the peers its collectives use (ring
    # neighbours and the log2 G partners of the barrier and broadcast trees).
    lazy = (2 + 2 * ceil(log2(G))) * (kappa + netlat / 1000)
    comm_used = meshok ? mesh : nccl16k * 1000
    crash = crash - mesh + comm_used; node = node - mesh + comm_used
    crash_lazy = crash - comm_used + lazy; node_lazy = node - comm_used + lazy
    crl[c] = crash_lazy; ndl[c] = node_lazy; cu[c] = comm_used
    cr[c] = crash; nd[c] = node; st[c] = step; sh[c] = shard; pb[c] = pbytes; dpv[c] = dp; mo[c] = meshok
    ms[c] = mesh; rs[c] = restore; pc[c] = paramcopy; rsn[c] = resnap; dc[c] = decide_c
    # failures and goodput over a month
    lambda = fail_rate_gpu_s * G; M = 1 / lambda      # job MTBF, s
    fails = lambda * month * 86400
    hot_waste_per = node / 1000 + 0.5 * step          # the step in flight is lost, nothing committed is
    good_hot = (1 - ovh) * (1 - hot_waste_per / M)
    good_hot0 = (1 - hot_waste_per / M)
    delta = ckptb * params / 1e9 / store              # synchronous checkpoint, all GPUs writing at once
    load = delta                                      # reading it back at the same bandwidth
    R = restart + load
    tau = sqrt(2 * delta * M)                         # Young / Daly
    waste_disk = delta / tau + (R + (tau + delta) / 2 + 0.5 * step) / M
    good_disk = 1 - waste_disk
    mt[c] = M; fl[c] = fails; gh[c] = good_hot; gh0[c] = good_hot0; gd[c] = good_disk; dl[c] = delta; ta[c] = tau; Rr[c] = R
    lh[c] = fails * hot_waste_per / 3600; ld[c] = waste_disk * month * 24; }
  printf "| data parallel width (TP x PP = %d GPUs per replica) | %d | %d |\n", tp * pp, dpv[1], dpv[2]
  printf "| non-reconstructible state per GPU (fp32 master + Adam m, v, ZeRO-1 over DP) | %.2f GB | %.3f GB |\n", sh[1], sh[2]
  printf "| bf16 parameters per GPU (from a DP peer after a swap) | %.2f GB | %.2f GB |\n", pb[1], pb[2]
  printf "| step time (6 x params x tokens / (GPUs x peak x MFU %.0f %%): 4M tokens / 16M tokens) | %.1f s | %.2f s |\n", mfu * 100, st[1], st[2]
  printf "| decide (15 ms batch + %d Redis round trips) | %.0f ms | %.0f ms |\n", coord_rts, dc[1], dc[2]
  printf "| restore the shard: holder host memory -> NIC -> PCIe | %.0f ms | %.0f ms |\n", rs[1] * 1000, rs[2] * 1000
  printf "| parameters from a DP peer: NIC -> PCIe | %.0f ms | %.0f ms |\n", pc[1] * 1000, pc[2] * 1000
  printf "| communicator as built (Gloo full mesh: N - 1 pairs per rank at %.3f ms) | %.0f ms | %s |\n", kappa, ms[1], mo[2] ? sprintf("%.0f ms", ms[2]) : sprintf("not buildable (%d listening ports per host)", 16383 * gpn)
  printf "| communicator, NCCL-style init instead (used where the mesh cannot be built) | - | %.0f s (published) |\n", nccl16k
  printf "| re-snapshot of the restore point (PCIe + NIC) | %.0f ms | %.0f ms |\n", rsn[1] * 1000, rsn[2] * 1000
  printf "| **recovery, process crash** (detected at its exit) | **%.2f s** | **%.1f s** |\n", cr[1] / 1000, cr[2] / 1000
  printf "| **recovery, node lost** (detected by heartbeat expiry, %d s) | **%.2f s** | **%.1f s** |\n", ttl, nd[1] / 1000, nd[2] / 1000
  printf "| the same with a communicator that connects only the peers its collectives use (2 + 2 log2 N pairs per rank): crash / node lost | %.2f s / %.2f s | %.2f s / %.2f s |\n", crl[1] / 1000, ndl[1] / 1000, crl[2] / 1000, ndl[2] / 1000
  printf "| reference system (../shared/DESIGN.md) | < 40 s | - |\n"
  printf "| job MTBF (Llama 3 rate: %d interruptions / %d days / %d GPUs) | %.1f h | %.2f h |\n", nint, idays, igpus, mt[1] / 3600, mt[2] / 3600
  printf "| failures in %d days | %.1f | %.0f |\n", month, fl[1], fl[2]
  printf "| hot-swap: time lost in %d days (recovery + half a step per failure) | %.2f h | %.2f h |\n", month, lh[1], lh[2]
  printf "| hot-swap goodput (snapshot overhead 0 %% / the %.2f %% measured on CPUs here) | %.3f %% / %.3f %% |  %.3f %% / %.3f %% |\n", ovh * 100, gh0[1] * 100, gh[1] * 100, gh0[2] * 100, gh[2] * 100
  printf "| disk checkpoint: write time (%d B/param, all GPUs at once) | %.1f s | %.2f s |\n", ckptb, dl[1], dl[2]
  printf "| disk: Young/Daly interval sqrt(2 x write x MTBF) | %.0f s | %.0f s |\n", ta[1], ta[2]
  printf "| disk: restart (%d s) + reading the checkpoint | %.0f s | %.0f s |\n", restart, Rr[1], Rr[2]
  printf "| disk + restart goodput at that interval | %.3f %% | %.3f %% |\n", gd[1] * 100, gd[2] * 100
  printf "| disk + restart: time lost in %d days | %.1f h | %.1f h |\n", month, ld[1], ld[2]
  printf "| spares held back (1 node per 64) | %.1f %% of the GPUs | %.1f %% of the GPUs |\n", spares * 100, spares * 100
}'
echo
echo "inputs: $( [ -n "$SCALE_DIR" ] && echo "measured points from $SCALE_DIR" || echo "measured points built in (docs/BENCHMARKS.md)"); $CORES cores here; $(date)"
