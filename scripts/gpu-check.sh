#!/usr/bin/env bash
# gpu-check.sh — the checks that need a real GPU (`make gpu-check` runs this). Without a GPU,
# `make test T='[cuda]'` runs the same kernels on kiln's emulator instead.
#
#   1. build        make CUDA=1: the engine, trainers and tests with nvcc (warnings are errors)
#   2. tests        build-cuda/tests/kiln_tests '[cuda]': every CUDA kernel against the CPU
#   3. memcheck     compute-sanitizer --tool memcheck over the kernel tests: out-of-bounds and
#                   misaligned accesses, errors from the runtime
#   4. racecheck    compute-sanitizer --tool racecheck over the same: shared-memory hazards
#                   (a missing or misplaced __syncthreads())
#   5. gemm bench   cuda/lab/gemm_bench.cu, built here with nvcc and cuBLAS (never by the
#                   Makefile): validates kiln's GEMM versions against cuBLAS at 4096², then
#                   prints "bench cuda_gemm_4096: X GFLOP/s", cuBLAS's, and the ratio
#   6. summary      one line per step; the exit status is 1 if any step failed or timed out
#
# Everything is bounded by `timeout` so the script ends within 8 minutes (the limits below sum
# to 440 s, plus 30 s to fetch MNIST if it is missing); a step that runs out of time is
# reported as TIMEOUT and the next one starts.
# The sanitizers skip the [trainer] tests (MNIST training is slow under instrumentation; step 2
# runs them). Set JOBS to change the build parallelism (default: all cores).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
SANITIZER=${SANITIZER:-$CUDA_HOME/bin/compute-sanitizer}
JOBS=${JOBS:-$(nproc)}
TESTS=build-cuda/tests/kiln_tests
BENCH=build-cuda/lab/gemm_bench
LOG=build-cuda/gpu-check
mkdir -p "$LOG" build-cuda/lab

declare -a NAMES=() RESULTS=()
started=$SECONDS

# step NAME LIMIT_SECONDS COMMAND...: runs it with a time limit, its output to the terminal and
# to $LOG/NAME.log, and records PASS, FAIL (exit status) or TIMEOUT.
step() {
    local name=$1 limit=$2; shift 2
    echo
    echo "=== $name (at most ${limit}s): $*"
    local t0=$SECONDS rc
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
    rc=${PIPESTATUS[0]}
    local took=$((SECONDS - t0)) result
    if [[ $rc -eq 0 ]]; then result=PASS
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then result=TIMEOUT
    else result="FAIL (exit $rc)"
    fi
    NAMES+=("$name")
    RESULTS+=("$result, ${took}s")
    return "$rc"
}
skip() {
    NAMES+=("$1")
    RESULTS+=("SKIPPED: $2")
}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (nvidia-smi lists none). On this machine run the kernels on the"
    echo "emulator instead: make test T='[cuda]'"
    exit 1
fi
nvidia-smi -L

# The tests read MNIST (data/mnist); fetch it if it is missing.
[[ -f data/mnist/train-images-idx3-ubyte.gz ]] || timeout 30 bash data/fetch.sh mnist

if step build 190 make CUDA=1 -j"$JOBS" all; then
    step tests 45 "$TESTS" '[cuda]'
    step memcheck 75 "$SANITIZER" --tool memcheck --error-exitcode 1 "$TESTS" '[cuda]~[trainer]'
    step racecheck 75 "$SANITIZER" --tool racecheck --error-exitcode 1 "$TESTS" '[cuda]~[trainer]'
else
    skip tests "the build failed"
    skip memcheck "the build failed"
    skip racecheck "the build failed"
fi

# The bench needs only cuda/gemm.cu (it #includes it), cudart and cuBLAS.
if step bench-build 35 "$NVCC" -std=c++17 -O3 -arch=native -Isrc -Icuda -DKILN_CUDA=1 \
        cuda/lab/gemm_bench.cu -o "$BENCH" -lcublas; then
    step bench 20 "$BENCH" 4096
else
    skip bench "the bench did not build"
fi

echo
echo "=== gpu-check summary ($((SECONDS - started))s)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
grep -h '^bench ' "$LOG/bench.log" 2>/dev/null
status=0
for i in "${!NAMES[@]}"; do
    printf '  %-12s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    [[ ${RESULTS[$i]} == PASS* ]] || status=1
done
echo "logs: $LOG/"
exit $status
