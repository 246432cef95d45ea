#!/usr/bin/env bash
# gpu-check.sh — the checks that need a real GPU, run from binaries built on another machine.
# The GPU machine may have CUDA, PyTorch and compute-sanitizer but nothing to build kiln with (no
# Catch2, stb or zlib headers, no network), so this script compiles nothing: it runs what
# `make gpu-check-prepare` gathered in gpu-check/ (scripts/gpu-check-prepare.sh).
#
# With the device tool (a GPU machine lent for minutes; a call carries at most 64 MiB and
# returns the files written under $OUT):
#   1. here:   make gpu-check-prepare     builds build-gpucheck/ and fills gpu-check/ (the CUDA
#                                         binaries, MNIST, this script, the PyTorch reference)
#   2. device: one `run` call with carry ["gpu-check"], timeout_s 600 and the command
#                  bash gpu-check/gpu-check.sh
#              (OUT is set there; the script ends within 6 minutes)
#   3. here:   read summary.txt, then gpu-check.log, among the files the call returned
# On a machine with a GPU and this repository, `make gpu-check` runs the same from gpu-check/.
# Without a GPU, GPU_CHECK_DRY=1 bash scripts/gpu-check.sh runs every step against the emulator
# build instead (build/, from `make` and `make lab-build`), to check this script's logic: a
# subset of the tests ('[cuda][gemm]'), one lab binary (gemm), 640 images of lesson 05; no
# nvidia-smi, and the sanitizers and PyTorch on the GPU reported ABSENT.
#
# The steps, in this order (the figures first, the slow sanitizers last):
#   gpu         nvidia-smi: the GPU, its driver and the CUDA version the driver supports (the
#               binaries carry the CUDA runtime they were built with, named in MANIFEST.txt)
#   tests       tests/kiln_tests '[cuda]': every CUDA kernel against the CPU; Catch2's XML report
#               to $OUT/tests.xml
#   rerun       only if tests failed: the failing test cases again with CUDA_LAUNCH_BLOCKING=1,
#               so that an asynchronous fault is reported by the launch that caused it (all of
#               them if the report names none: the process died before writing it)
#   lab         each lab binary (cuda/lab/): every version validated against the CPU, then timed
#               as a share of cuBLAS or cuDNN ("bench ..." lines)
#   lesson05    one epoch of lesson 05 (LeNet on MNIST, batch 64) on the GPU
#   torch       the same epoch in PyTorch on the same GPU, TF32 off (bench/torch_lenet_gpu.py)
#   memcheck, racecheck, synccheck, initcheck
#               compute-sanitizer's four tools over the kernel tests, '[cuda]~[trainer]' (the
#               MNIST trainings are slow under instrumentation; the tests step runs them)
# Each step runs under `timeout`: at most its own limit and what is left of GPU_CHECK_SECONDS
# (320 s; the steps' own limits sum to more, so a slow early step shortens the later ones; with
# the look-ups between steps the whole run stays under 6 minutes). Results:
# PASS; FAIL (exit status); TIMEOUT; SKIPPED (no time was left); ABSENT, when what the step
# needs is not on the machine or a tool refuses the GPU (compute-sanitizer does on some
# sandboxes), which does not fail the check. The exit status is 1 if any step failed, timed
# out or was skipped. GPU_CHECK_TAGS and GPU_CHECK_SANITIZE_TAGS change the test cases the tests
# and the sanitizers run (Catch2 test specs).
#
# Written under $OUT (default: out/ beside the binaries; build/gpu-check-dry/ for a dry run),
# three files, since a device call returns few: gpu-check.log (every step's output, each cut at
# 4 MB), summary.txt (one line per step and the figures) and tests.xml.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
DRY=${GPU_CHECK_DRY:-0}
if [[ $DRY == 1 ]]; then
    root=$(dirname "$here")                 # the repository: scripts/..
    TESTS=build/tests/kiln_tests TAGS=${GPU_CHECK_TAGS:-'[cuda][gemm]'}
    LESSON05=build/bin/lesson-05 LESSON05_ARGS=(--epochs 1 --data build/gpu-check-mnist-640)
    LABS=(build/lab/gemm)
    SANITIZER=${SANITIZER:-}                # none on the emulator, unless one is named
    OUT=${OUT:-$root/build/gpu-check-dry}
elif [[ -f $here/MANIFEST.txt ]]; then
    root=$here                              # gpu-check/, as make gpu-check-prepare fills it
elif [[ -f $here/../gpu-check/MANIFEST.txt ]]; then
    root=$(dirname "$here")/gpu-check       # scripts/gpu-check.sh, after make gpu-check-prepare
else
    echo "gpu-check: no prepared binaries beside $0. Run \`make gpu-check-prepare\` on the build"
    echo "machine and carry gpu-check/ here, or, without a GPU, GPU_CHECK_DRY=1 bash $0"
    exit 1
fi
if [[ $DRY != 1 ]]; then
    TESTS=tests/kiln_tests TAGS=${GPU_CHECK_TAGS:-'[cuda]'}
    LESSON05=bin/lesson-05 LESSON05_ARGS=(--epochs 1)
    LABS=("$root"/lab/*)
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")}
    OUT=${OUT:-$root/out}
fi
SANITIZE_TAGS=${GPU_CHECK_SANITIZE_TAGS:-$TAGS~[trainer]}
cd "$root" || exit 1                        # the binaries read data/mnist from here
PYTHON=${PYTHON:-python3}                   # on the device machine, the python3 that has PyTorch
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$OUT" || exit 1
LOG=$OUT/gpu-check.log
: >"$LOG"
STEPS=$(mktemp -d) || exit 1                # each step's whole output, read for the summary
trap 'rm -rf "$STEPS"' EXIT
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-320}))
declare -a NAMES=() RESULTS=()

# record NAME RESULT: one line of the summary.
record() {
    NAMES+=("$1")
    RESULTS+=("$2")
}

# step NAME LIMIT_SECONDS COMMAND...: runs COMMAND under `timeout` (LIMIT, or less if less of the
# budget is left), its output to the terminal and to $STEPS/NAME.log, appended to gpu-check.log;
# records PASS, FAIL (exit status), TIMEOUT or SKIPPED, and returns COMMAND's exit status.
step() {
    local name=$1 limit=$2; shift 2
    local left=$((deadline - SECONDS))
    if ((left < 5)); then
        record "$name" "SKIPPED: no time left of GPU_CHECK_SECONDS"
        return 1
    fi
    ((limit > left)) && limit=$left
    echo
    echo "=== $name (at most ${limit}s): $*"
    local t0=$SECONDS rc result
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$STEPS/$name.log"
    rc=${PIPESTATUS[0]}
    { echo "=== $name (at most ${limit}s, exit status $rc): $*"; head -c 4000000 "$STEPS/$name.log"; } >>"$LOG"
    if ((rc == 0)); then result=PASS
    elif ((rc == 124 || rc == 137)); then result=TIMEOUT
    else result="FAIL (exit $rc)"
    fi
    record "$name" "$result, $((SECONDS - t0))s"
    return "$rc"
}

# catch2_counts XML: "N test cases passed, M failed", from Catch2's XML report.
catch2_counts() {
    grep -o '<OverallResultsCases successes="[0-9]*" failures="[0-9]*"' "$1" 2>/dev/null |
        tail -n 1 | sed -E 's/.*successes="([0-9]+)" failures="([0-9]+)"/\1 test cases passed, \2 failed/'
}

# failing_cases XML: the names of the test cases that failed, one a line, from Catch2's XML
# report; a case still open at the end (the process died in it) counts as failed. Each name is
# unescaped from XML, then escaped for a Catch2 test spec (--input-file): a backslash before
# each character that would be read as syntax (a comma separates two specs, [ opens a tag).
failing_cases() {
    awk '
        /<TestCase name="/ { sub(/.*<TestCase name="/, ""); sub(/".*/, ""); open = $0; next }
        /<OverallResult success="false"/ && open != "" { print open }
        /<OverallResult success=/ { open = "" }
        END { if (open != "") print open }
    ' "$1" | sed -e 's/&quot;/"/g' -e "s/&apos;/'/g" -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&amp;/\&/g' \
          -e 's/[][\\,"*~]/\\&/g'
}

# sanitizer_step TOOL: compute-sanitizer --tool TOOL over the kernel tests. A sanitizer that is
# not installed, or that refuses the GPU or the sandbox (its own "=========" lines say "not
# supported", "Internal Sanitizer Error", "unable to ..."), makes the step ABSENT.
sanitizer_step() {
    local tool=$1 limit=$2 refusal
    if [[ -z $SANITIZER ]]; then
        record "$tool" "ABSENT: dry run, no compute-sanitizer on the emulator"
        return
    elif [[ ! -x $SANITIZER ]]; then
        record "$tool" "ABSENT: no compute-sanitizer at $SANITIZER"
        return
    fi
    step "$tool" "$limit" "$SANITIZER" --tool "$tool" --error-exitcode 1 "$TESTS" "$SANITIZE_TAGS" && return
    refusal=$(grep -m1 -iE '^=+ .*(not supported|Internal Sanitizer Error|unable to|failed to initiali)' "$STEPS/$tool.log" 2>/dev/null)
    if [[ -n $refusal ]]; then
        RESULTS[-1]="ABSENT: the tool refused: ${refusal#*= }"
    fi
}

# library_path BINARY: the shared libraries BINARY needs that the loader cannot find (the lab's
# cuBLAS and cuDNN may live in PyTorch's pip packages rather than in the system's folders) are
# looked for under CUDA_HOME and Python's site-packages, and their folders added to
# LD_LIBRARY_PATH. Sets MISSING to those still not found.
library_path() {
    local s lib found sites dirs=()
    sites=$(timeout 10 "$PYTHON" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
    for s in $sites; do dirs+=("$s/nvidia" "$s/torch/lib"); done
    for lib in $(ldd "$1" 2>/dev/null | awk '/not found/ { print $1 }'); do
        found=$(find "${CUDA_HOME:-/usr/local/cuda}/lib64" "${dirs[@]}" -maxdepth 4 -name "$lib" -print -quit 2>/dev/null)
        [[ -n $found ]] && LD_LIBRARY_PATH=$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    done
    export LD_LIBRARY_PATH
    MISSING=$(ldd "$1" 2>/dev/null | awk '/not found/ { printf "%s ", $1 }')
}

# be32 N: writes N as the 4 bytes of a big-endian integer.
be32() { printf '%b' "$(printf '\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)))"; }

# small_mnist DIR N: the first N images and labels of MNIST's training and test sets, as IDX files
# in DIR (their headers' counts rewritten): the dry run's lesson 05 evaluates its test set on the
# emulator, which is slow for all 10,000 images.
small_mnist() {
    local set
    mkdir -p "$1"
    for set in train t10k; do  # images: magic 0x803, count, 28 rows, 28 columns; labels: 0x801, count
        { be32 2051; be32 "$2"; be32 28; be32 28
          zcat "data/mnist/$set-images-idx3-ubyte.gz" | tail -c +17 | head -c $(($2 * 784)); } | gzip -1 >"$1/$set-images-idx3-ubyte.gz"
        { be32 2049; be32 "$2"
          zcat "data/mnist/$set-labels-idx1-ubyte.gz" | tail -c +9 | head -c "$2"; } | gzip -1 >"$1/$set-labels-idx1-ubyte.gz"
    done
}

started=$SECONDS
if [[ $DRY == 1 ]]; then
    echo "gpu-check: dry run on the emulator build (build/), in $root; logs to $OUT"
    small_mnist build/gpu-check-mnist-640 640
    record gpu "ABSENT: dry run, no nvidia-smi"
elif ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (nvidia-smi lists none). Without a GPU, run the same kernels on the"
    echo "emulator: make test T='[cuda]', or this script's dry run: GPU_CHECK_DRY=1 bash scripts/gpu-check.sh"
    exit 1
else
    echo "gpu-check: the binaries of $root ($(head -n 1 MANIFEST.txt)); logs to $OUT"
    step gpu 15 nvidia-smi
fi

# The tests, with Catch2's XML report (which names the failing test cases) in $OUT/tests.xml;
# the failing ones again with every launch synchronous (all of TAGS if none is named: the
# process died before its report was written).
tests_at=${#RESULTS[@]}
if ! step tests 60 "$TESTS" "$TAGS" -r xml -o "$OUT/tests.xml"; then
    failing_cases "$OUT/tests.xml" >"$STEPS/failing.txt"
    if [[ -s $STEPS/failing.txt ]]; then
        step rerun 45 env CUDA_LAUNCH_BLOCKING=1 "$TESTS" -f "$STEPS/failing.txt"
    else
        step rerun 45 env CUDA_LAUNCH_BLOCKING=1 "$TESTS" "$TAGS"
    fi
fi
RESULTS[tests_at]+=" ($(catch2_counts "$OUT/tests.xml"))"

library_path "${LABS[0]}"
if [[ -n $MISSING ]]; then
    record lab "ABSENT: ${MISSING}not found on this machine"
else
    # shellcheck disable=SC2016  # $b and $status belong to the inner shell
    step lab 60 bash -c 'status=0; for b; do echo "=== $b"; "$b" || status=1; done; exit $status' lab "${LABS[@]}"
fi

step lesson05 30 "$LESSON05" --device cuda "${LESSON05_ARGS[@]}"

if [[ $DRY == 1 ]]; then
    record torch "ABSENT: dry run, PyTorch sees no GPU in the emulator"
elif ! timeout 10 "$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null; then
    record torch "ABSENT: no PyTorch for $PYTHON"
else
    step torch 40 "$PYTHON" bench/torch_lenet_gpu.py data/mnist
fi

sanitizer_step memcheck 50
sanitizer_step racecheck 45
sanitizer_step synccheck 35
sanitizer_step initcheck 40

# The summary: one line per step, then the figures the steps printed.
status=0
for r in "${RESULTS[@]}"; do
    [[ $r == PASS* || $r == ABSENT* ]] || status=1
done
{
    echo "=== gpu-check summary ($((SECONDS - started))s$([[ $DRY == 1 ]] && echo ', a dry run on the emulator'))"
    [[ $DRY == 1 ]] || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    for i in "${!NAMES[@]}"; do
        printf '  %-10s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    done
    grep -h '^bench ' "$STEPS/lab.log" "$STEPS/torch.log" 2>/dev/null
    grep -h 'img/s' "$STEPS/lesson05.log" 2>/dev/null | tail -n 1 | sed 's/^/lesson05: /'
    echo "logs: $OUT/"
} | tee "$OUT/summary.txt"
exit $status
