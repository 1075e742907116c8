#!/usr/bin/env bash
# GPU benchmark run for an H200 (or any CUDA) machine, in one go and in under 8 minutes:
#   1. configure + build the CUDA targets (-DORTHOSERVE_WITH_CUDA=ON, sm_90),
#   2. run the GPU tests (ctest -L gpu),
#   3. time NS for 1024², 4096², 4096×11008 and 8192² in MEDIUM and HIGHEST with the C++ bench
#      (device loop with CUDA events + end-to-end CudaBackend::Run) beside the same loop in
#      PyTorch on the same GPU (skipped with a note when torch is not importable),
#      and the whole-model sets of bench/gpu/model_sets.txt (GPT-2 small, a Llama-3-8B layer,
#      Llama-3.2-1B) as one Run call on device-resident matrices beside PyTorch's loop over them,
#   4. if the orthoserve and orthoctl targets exist, a one-rank service step on loopback beside the
#      in-process engine,
#   5. CUDA IPC regions (docs/shared_memory.md): orthoserve --backend=cuda --shm-socket and a second
#      process (orthoserve_gpu_ipc_bench) that allocates the matrices on the GPU, hands the
#      allocation over by CUDA IPC handle, registers it and times steps whose input and result are
#      slices of it, beside the same steps with bytes and the in-process engine on the same matrices,
# and writes a markdown report to $OUT/gpu_ns.md when $OUT is a directory, to $OUT when it names
# a file, else to bench/results/gpu_ns.md.
# Environment: BUILD_DIR (default build-gpu-bench), ITERS (10), JOBS (nproc), PYTHON (python3), SETS,
# SKIP_E2E=1 to leave out step 4, SKIP_IPC=1 to leave out step 5, IPC_SHAPES (1024x1024,4096x4096).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu-bench}
ITERS=${ITERS:-10}
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-python3}
SHAPES=1024x1024,4096x4096,4096x11008,8192x8192
SETS=${SETS:-gpt2-small,llama3-8b-layer,llama3.2-1b}
if [[ -n "${OUT:-}" && -d "${OUT}" ]]; then
  REPORT=$OUT/gpu_ns.md
elif [[ -n "${OUT:-}" ]]; then
  REPORT=$OUT
else
  REPORT=$ROOT/bench/results/gpu_ns.md
fi
mkdir -p "$(dirname "$REPORT")"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
log() { echo "[run.sh $((SECONDS - START))s] $*" >&2; }

NOTES=()
GPU_NAME=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
[[ -z "$GPU_NAME" ]] && GPU_NAME="(nvidia-smi not available)"

log "configure"
if ! cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DORTHOSERVE_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$WORK/configure.log" 2>&1; then
  tail -30 "$WORK/configure.log" >&2
  echo "configure failed" >&2
  exit 1
fi
log "build"
# Every test labelled `gpu` (ctest -L gpu below runs them all) and the bench.
TARGETS=(orthoserve_gpu_ns_bench cuda_backend_gpu_test cuda_layout_emulation_gpu_test memory_pool_emulation_gpu_test
  cuda_backend_emulation_gpu_test)
# The target list is read once: `ninja ... | grep -q` under pipefail fails whenever grep exits
# before ninja has written everything (SIGPIPE), which would drop targets at random.
ALL_TARGETS=$(ninja -C "$BUILD" -t targets all 2>/dev/null)
has_target() { grep -q "^$1:" <<<"$ALL_TARGETS"; }
for t in cpu_gpu_agreement_gpu_test nccl_collective_gpu_test cuda_fleet_emulation_gpu_test cuda_ipc_gpu_test \
    cuda_ipc_emulation_gpu_test; do
  has_target "$t" && TARGETS+=("$t")
done
if ! ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" >"$WORK/build.log" 2>&1; then
  tail -40 "$WORK/build.log" >&2
  echo "build failed" >&2
  exit 1
fi

log "gpu tests"
if (cd "$BUILD" && timeout 300 ctest -L gpu --output-on-failure >"$WORK/ctest.log" 2>&1); then
  TESTS="passed"
else
  TESTS="FAILED (see the log below)"
fi
CTEST_SUMMARY=$(grep -E "tests passed|tests failed|Test +#" "$WORK/ctest.log" | tail -8)
SKIPS=$(cd "$BUILD" && for b in tests/gpu/*_gpu_test; do "$b" 2>/dev/null | grep -E "^\[  SKIPPED \] [0-9]+ test"; done | \
        awk '{s += $4} END {print s + 0}')
[[ "$SKIPS" != "0" ]] && NOTES+=("$SKIPS GPU test cases reported SKIPPED (on one GPU: the multi-GPU NCCL case and the no-device checks).")

log "C++ bench"
if ! timeout 200 "$BUILD/bench/gpu/orthoserve_gpu_ns_bench" --shapes=$SHAPES --precisions=medium,highest \
    --iters="$ITERS" >"$WORK/ours.csv" 2>"$WORK/ours.err"; then
  NOTES+=("C++ bench failed or timed out: $(tail -1 "$WORK/ours.err")")
fi
# Many small matrices: 32 same-shape tasks in one Run call (one strided batch) vs 32 calls.
if ! timeout 60 "$BUILD/bench/gpu/orthoserve_gpu_ns_bench" --shapes=256x256,1024x1024 --precisions=medium \
    --iters="$ITERS" --group=32 --no-e2e 2>>"$WORK/ours.err" | grep '^group,' >"$WORK/group.csv"; then
  NOTES+=("grouped bench failed or timed out: $(tail -1 "$WORK/ours.err")")
fi

# Whole models: each set of bench/gpu/model_sets.txt as one Run call on matrices resident in
# device memory (and from host memory), beside PyTorch's loop over the same matrices.
SETS_ARG="$ROOT/bench/gpu/model_sets.txt:$SETS"
if ! timeout 200 "$BUILD/bench/gpu/orthoserve_gpu_ns_bench" --shapes=256x256 --no-e2e --precisions=medium,highest \
    --iters="$ITERS" --sets="$SETS_ARG" 2>>"$WORK/ours.err" | grep '^set,' >"$WORK/sets.csv"; then
  NOTES+=("model-set bench failed or timed out: $(tail -1 "$WORK/ours.err")")
fi

log "torch bench"
"$PYTHON" "$ROOT/bench/gpu/torch_ns.py" --shapes=$SHAPES --precisions=medium,highest --iters="$ITERS" \
  --sets="$SETS_ARG" >"$WORK/torch.csv" 2>"$WORK/torch.err"
rc=$?
if [[ $rc -eq 3 ]]; then
  NOTES+=("PyTorch column skipped: $(tail -1 "$WORK/torch.err").")
elif [[ $rc -ne 0 ]]; then
  NOTES+=("PyTorch bench failed: $(tail -1 "$WORK/torch.err").")
fi

E2E=""
if [[ "${SKIP_E2E:-0}" != "1" ]] && (( SECONDS - START < 300 )) && has_target orthoserve && has_target orthoctl; then
  log "end-to-end: build server and client"
  if timeout $((420 - (SECONDS - START))) ninja -C "$BUILD" -j"$JOBS" orthoserve orthoctl >"$WORK/e2e_build.log" 2>&1; then
    SERVER=$(find "$BUILD" -type f -name orthoserve -perm -u+x | head -1)
    CLIENT=$(find "$BUILD" -type f -name orthoctl -perm -u+x | head -1)
    PORT=$((40000 + RANDOM % 20000))
    "$SERVER" --backend=cuda --listen=127.0.0.1:$PORT --metrics_address=127.0.0.1:$((PORT + 1)) \
      --fleet_listen=127.0.0.1:$((PORT + 2)) >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 50); do
      "$CLIENT" health --server=127.0.0.1:$PORT >/dev/null 2>&1 && break
      sleep 0.2
    done
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      NOTES+=("orthoserve --backend=cuda did not start: $(tail -1 "$WORK/server.log")")
    else
      for prec in medium highest; do
        if out=$(timeout 60 "$CLIENT" bench --server=127.0.0.1:$PORT --shape=4096,4096 --precision=$prec \
                 --iters=5 --warmup=1 2>&1); then
          # The one-rank service step beside the in-process engine's end-to-end Run of the same matrix.
          svc=$(echo "$out" | grep -m1 latency | sed -E 's/.*median ([0-9.]+) ms.*/\1/')
          inproc=$(grep "^4096x4096,$prec," "$WORK/ours.csv" 2>/dev/null | cut -d, -f6)
          ratio=$( [[ -n "$svc" && -n "$inproc" ]] && awk -v a="$svc" -v b="$inproc" 'BEGIN { printf "%.2fx", a / b }' || echo "-")
          E2E+="| 4096x4096 | $prec | ${svc:--} | ${inproc:--} | $ratio | $(echo "$out" | grep -m1 latency | sed 's/|/\//g') |"$'\n'
        else
          NOTES+=("loopback bench ($prec) failed: $(echo "$out" | tail -1)")
        fi
      done
    fi
    kill "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  else
    NOTES+=("end-to-end step skipped: building orthoserve/orthoctl failed or ran out of time.")
  fi
elif [[ "${SKIP_E2E:-0}" == "1" ]]; then
  NOTES+=("end-to-end loopback step skipped (SKIP_E2E=1).")
else
  NOTES+=("end-to-end loopback step skipped: orthoserve/orthoctl targets not present (or no time left).")
fi

# CUDA IPC regions: a second process hands its GPU memory to the server by handle; steps through
# the region beside the same steps with bytes and the in-process engine (ipc_bench.cc's CSV).
IPC_SHAPES=${IPC_SHAPES:-1024x1024,4096x4096}
if [[ "${SKIP_IPC:-0}" != "1" ]] && (( SECONDS - START < 380 )) && has_target orthoserve && \
    has_target orthoserve_gpu_ipc_bench; then
  log "CUDA IPC regions: build"
  if timeout $((440 - (SECONDS - START))) ninja -C "$BUILD" -j"$JOBS" orthoserve orthoserve_gpu_ipc_bench \
      >"$WORK/ipc_build.log" 2>&1; then
    SERVER=$(find "$BUILD" -type f -name orthoserve -perm -u+x | head -1)
    PORT=$((40000 + RANDOM % 20000))
    SOCK=$WORK/shm.sock
    "$SERVER" --backend=cuda --listen=127.0.0.1:$PORT --metrics_address=127.0.0.1:$((PORT + 1)) \
      --fleet_listen=127.0.0.1:$((PORT + 2)) --shm_socket="$SOCK" --max_message_bytes=$((512 << 20)) \
      >"$WORK/ipc_server.log" 2>&1 &
    IPC_PID=$!
    for _ in $(seq 1 100); do
      [[ -S "$SOCK" ]] && break
      sleep 0.2
    done
    log "CUDA IPC regions: bench"
    if ! timeout 120 "$BUILD/bench/gpu/orthoserve_gpu_ipc_bench" --server=127.0.0.1:$PORT --socket="$SOCK" \
        --shapes="$IPC_SHAPES" --precisions=medium,highest --iters="$ITERS" --warmup=2 \
        >"$WORK/ipc.csv" 2>"$WORK/ipc.err"; then
      NOTES+=("CUDA IPC bench failed: $(tail -1 "$WORK/ipc.err"); server: $(tail -1 "$WORK/ipc_server.log")")
    fi
    curl -s "http://127.0.0.1:$((PORT + 1))/metrics" 2>/dev/null | grep -E '^orthoserve_shm_(regions|handovers_total)' \
      >"$WORK/ipc_metrics.txt"
    kill "$IPC_PID" 2>/dev/null
    wait "$IPC_PID" 2>/dev/null
  else
    NOTES+=("CUDA IPC regions skipped: building orthoserve/orthoserve_gpu_ipc_bench failed or ran out of time.")
  fi
elif [[ "${SKIP_IPC:-0}" == "1" ]]; then
  NOTES+=("CUDA IPC regions skipped (SKIP_IPC=1).")
else
  NOTES+=("CUDA IPC regions skipped: orthoserve/orthoserve_gpu_ipc_bench targets not present (or no time left).")
fi

log "report"
{
  echo "# GPU Newton–Schulz benchmark"
  echo
  echo "- GPU: $GPU_NAME"
  echo "- Commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown); $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- Loop: quintic, 5 steps, median of $ITERS after 2 warmup. 'ours device' = normalize + steps on a"
  echo "  resident matrix (CUDA events), symmetric products in strips; 'full GEMM' = the same with every"
  echo "  product a full GEMM; 'ours e2e' = CudaBackend::Run from host fp32 to host fp32 (wall clock,"
  echo "  includes both copies), without / with CUDA graphs; 'torch' = the same loop in PyTorch (bf16 for"
  echo "  MEDIUM, fp32 without TF32 for HIGHEST). TFLOP/s count every product whole (NsFlops)."
  echo "- GPU tests (ctest -L gpu): $TESTS"
  echo
  echo "| shape | precision | ours device ms | ours TFLOP/s | full GEMM ms | ours e2e ms | e2e graphs ms | torch ms | torch TFLOP/s | torch / ours |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  tail -n +2 "$WORK/ours.csv" 2>/dev/null | while IFS=, read -r shape prec dms dtf fms ems gms; do
    t=$(grep "^$shape,$prec," "$WORK/torch.csv" 2>/dev/null | head -1)
    tms=$(echo "$t" | cut -d, -f3)
    ttf=$(echo "$t" | cut -d, -f4)
    ratio=$( [[ -n "$tms" ]] && awk -v a="$tms" -v b="$dms" 'BEGIN { printf "%.2fx", a / b }' || echo "-")
    echo "| $shape | $prec | $dms | $dtf | $fms | $ems | $gms | ${tms:--} | ${ttf:--} | $ratio |"
  done
  if [[ -s "$WORK/sets.csv" ]]; then
    echo
    echo "Whole models (bench/gpu/model_sets.txt): every matrix of the set, fp32 in and out, as one Run"
    echo "call on matrices resident in device memory ('resident': NS only, what the PyTorch loop times)"
    echo "and from host memory (uploads and downloads included), beside PyTorch's loop over the same"
    echo "matrices on the GPU. Target (issue #13): MEDIUM at least 1.5x PyTorch's bf16 loop."
    echo
    echo "| set | matrices | precision | ours resident ms | ours from host ms | torch ms | torch / ours resident |"
    echo "|---|---:|---|---:|---:|---:|---:|"
    while IFS=, read -r _ name prec count res host; do
      tms=$(grep "^set,$name,$prec," "$WORK/torch.csv" 2>/dev/null | head -1 | cut -d, -f5)
      ratio=$( [[ -n "$tms" ]] && awk -v a="$tms" -v b="$res" 'BEGIN { printf "%.2fx", a / b }' || echo "-")
      echo "| $name | $count | $prec | $res | $host | ${tms:--} | $ratio |"
    done <"$WORK/sets.csv"
  fi
  if [[ -s "$WORK/group.csv" ]]; then
    echo
    echo "Same-shape matrices, MEDIUM, end to end (CudaBackend::Run, host fp32 in and out):"
    echo
    echo "| shape | matrices | one Run call (strided batch) ms | one call each ms | speedup |"
    echo "|---|---:|---:|---:|---:|"
    while IFS=, read -r _ shape count one sep; do
      echo "| $shape | $count | $one | $sep | $(awk -v a="$sep" -v b="$one" 'BEGIN { printf "%.2fx", a / b }') |"
    done <"$WORK/group.csv"
  fi
  if [[ -n "$E2E" ]]; then
    echo
    echo "A one-rank service step (orthoserve --backend=cuda on loopback, orthoctl bench, 1 fp32 matrix per"
    echo "step) beside the in-process engine's end-to-end Run of the same matrix (the table above):"
    echo
    echo "| shape | precision | service median ms | in-process e2e ms | service / in-process | orthoctl bench |"
    echo "|---|---|---:|---:|---:|---|"
    echo -n "$E2E"
  fi
  if [[ -s "$WORK/ipc.csv" ]]; then
    echo
    echo "CUDA IPC regions (docs/shared_memory.md): another process's fp32 matrix on the GPU, handed over by"
    echo "CUDA IPC handle and registered; a unary step whose input and result are slices of it (the server"
    echo "computes on that memory) beside the same step with the matrix as bytes, and beside this GPU's engine"
    echo "in-process on the same matrix resident on the device and from host memory. Wall clock, medians."
    echo
    echo "| shape | precision | region step ms | bytes step ms | in-process resident ms | in-process from host ms | region / in-process resident | region result = bytes result |"
    echo "|---|---|---:|---:|---:|---:|---:|---|"
    while IFS=, read -r _ shape prec region bytes_ms dev host same; do
      ratio=$(awk -v a="$region" -v b="$dev" 'BEGIN { printf "%.2fx", a / b }')
      echo "| $shape | $prec | $region | $bytes_ms | $dev | $host | $ratio | $same |"
    done < <(grep '^ipc,' "$WORK/ipc.csv")
    if [[ -s "$WORK/ipc_metrics.txt" ]]; then
      echo
      echo '```'
      cat "$WORK/ipc_metrics.txt"
      echo '```'
    fi
  fi
  if (( ${#NOTES[@]} > 0 )); then
    echo
    echo "Notes:"
    for n in "${NOTES[@]}"; do echo "- $n"; done
  fi
  echo
  echo "<details><summary>ctest -L gpu</summary>"
  echo
  echo '```'
  echo "$CTEST_SUMMARY"
  grep -E "FAILED|Failure|Expected|Which is|error" "$WORK/ctest.log" | head -40
  echo '```'
  echo "</details>"
} >"$REPORT"
log "wrote $REPORT in $((SECONDS - START)) s"
cat "$REPORT"
[[ "$TESTS" == "passed" ]]
