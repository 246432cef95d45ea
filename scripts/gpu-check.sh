#!/usr/bin/env bash
# gpu-check.sh — the checks that need a real GPU (`make gpu-check` runs this). Without a GPU,
# `make test T='[cuda]'` runs the same kernels on kiln's emulator instead.
#
#   1. build        make CUDA=1 all lab-build: the engine, trainers, tests and kernel lab with
#                   nvcc (warnings are errors); cuBLAS and cuDNN are linked into the lab only
#   2. tests        build-cuda/tests/kiln_tests '[cuda]': every CUDA kernel against the CPU (GEMM,
#                   convolution, pooling, batch norm, ...)
#   3. memcheck     compute-sanitizer --tool memcheck over the kernel tests: out-of-bounds and
#                   misaligned accesses, errors from the runtime
#   4. racecheck    compute-sanitizer --tool racecheck over the same: shared-memory hazards
#                   (a missing or misplaced __syncthreads())
#   5. lab          make CUDA=1 lab: the kernel lab (cuda/lab/) validates every version of GEMM,
#                   reduction, convolution (LeNet and CIFAR-net layers at batch 256) and batch
#                   norm against the CPU, then prints "bench ..." lines, each version as a share
#                   of cuBLAS or cuDNN
#   6. lesson05     one epoch of lesson 05's trainer (LeNet on MNIST) on the GPU, timed, when
#                   lessons/05-*/train.cpp exists
#   7. torch        the same LeNet epoch in PyTorch on the same GPU (bench/torch_lenet_gpu.py,
#                   Debian's /usr/bin/python3; skipped when its torch has no CUDA)
#   8. summary      one line per step; the exit status is 1 if any step failed or timed out
#
# Everything is bounded by `timeout` so the script ends within 8 minutes (the limits below sum
# to 440 s, plus 10 s to look for PyTorch and 30 s to fetch MNIST if it is missing); a step
# that runs out of time is reported as TIMEOUT and the next one starts. A missing lesson 05
# trainer or PyTorch is reported as ABSENT and does not fail the check.
# The sanitizers skip the [trainer] tests (MNIST training is slow under instrumentation; step 2
# runs them). Set JOBS to change the build parallelism (default: all cores).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
SANITIZER=${SANITIZER:-$CUDA_HOME/bin/compute-sanitizer}
JOBS=${JOBS:-$(nproc)}
TESTS=build-cuda/tests/kiln_tests
LESSON05=build-cuda/bin/lesson-05
PYTHON=/usr/bin/python3   # Debian's python, where python3-torch is installed
LOG=build-cuda/gpu-check
mkdir -p "$LOG"

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
# skip NAME REASON: a step not run because an earlier one failed (fails the check);
# absent NAME REASON: one not run because what it measures is not on this machine (does not).
skip() {
    NAMES+=("$1")
    RESULTS+=("SKIPPED: $2")
}
absent() {
    NAMES+=("$1")
    RESULTS+=("ABSENT: $2")
}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (nvidia-smi lists none). On this machine run the kernels on the"
    echo "emulator instead: make test T='[cuda]'"
    exit 1
fi
nvidia-smi -L

# The tests read MNIST (data/mnist); fetch it if it is missing.
[[ -f data/mnist/train-images-idx3-ubyte.gz ]] || timeout 30 bash data/fetch.sh mnist

if step build 170 make CUDA=1 -j"$JOBS" NVCC="$NVCC" all lab-build; then
    step tests 40 "$TESTS" '[cuda]'
    step memcheck 55 "$SANITIZER" --tool memcheck --error-exitcode 1 "$TESTS" '[cuda]~[trainer]'
    step racecheck 45 "$SANITIZER" --tool racecheck --error-exitcode 1 "$TESTS" '[cuda]~[trainer]'
    step lab 70 make --no-print-directory CUDA=1 lab
    if [[ -x $LESSON05 ]]; then
        step lesson05 35 "$LESSON05" --epochs 1 --device cuda
    else
        absent lesson05 "no $LESSON05: lesson 05 has no trainer yet"
    fi
else
    for s in tests memcheck racecheck lab lesson05; do skip "$s" "the build failed"; done
fi

# PyTorch on the same GPU: the same LeNet, one epoch of MNIST at batch 64.
if timeout 10 "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    step torch 25 "$PYTHON" bench/torch_lenet_gpu.py data/mnist
else
    absent torch "no PyTorch with CUDA at $PYTHON"
fi

echo
echo "=== gpu-check summary ($((SECONDS - started))s)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
grep -h '^bench ' "$LOG/lab.log" "$LOG/torch.log" 2>/dev/null
status=0
for i in "${!NAMES[@]}"; do
    printf '  %-12s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    [[ ${RESULTS[$i]} == PASS* || ${RESULTS[$i]} == ABSENT* ]] || status=1
done
echo "logs: $LOG/"
exit $status
