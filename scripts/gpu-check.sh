#!/usr/bin/env bash
# gpu-check.sh — the checks that need a real GPU, run from binaries built on another machine.
# The GPU machine may have CUDA, PyTorch, compute-sanitizer and Nsight Compute but nothing to
# build kiln with (no Catch2, stb or zlib headers, no network), so this script compiles nothing:
# it runs what `make gpu-check-prepare` gathered in gpu-check/ (scripts/gpu-check-prepare.sh).
#
# With the device tool (a GPU machine lent for minutes; a call carries at most 64 MiB and
# returns the files written under $OUT):
#   1. here:   make gpu-check-prepare     builds build-gpucheck/ and fills gpu-check/ (the CUDA
#                                         binaries, MNIST, CIFAR-10, this script, the PyTorch twins)
#   2. device: one `run` call with carry ["gpu-check"], timeout_s 420 and the command
#                  bash gpu-check/gpu-check.sh
#              (OUT is set there; the script ends within 6 minutes)
#   3. here:   read summary.txt, then gpu-check.log, among the files the call returned
# On a machine with a GPU and this repository, `make gpu-check` runs the same from gpu-check/.
# Without a GPU, `make gpu-check-dry` (GPU_CHECK_DRY=1 bash scripts/gpu-check.sh after building
# the emulator's binaries) runs every step against the emulator build (build/) instead, to check
# this script's logic: a subset of the tests ('[cuda][gemm]'), small slices of MNIST and CIFAR-10,
# PyTorch's twins on the CPU; no nvidia-smi, and the sanitizers and Nsight Compute ABSENT.
#
# The binaries (gpu-check/, where they travel gzipped and are unpacked first; or build/ for a dry
# run): bin/kiln-gpu, one binary for the tests, the trainers 04-11 and 13 and bench_train
# (`kiln-gpu tests '[cuda]'`, `kiln-gpu lesson-06 ARGS` runs lesson-06 ARGS: each program carries
# every kernel, so one binary for all keeps the folder small); bin/lesson-12 (it links Open MPI,
# which the GPU machine may lack); lab/kiln-lab (the lab's pages, `kiln-lab gemm`, with cuBLAS and
# cuDNN).
#
# The steps, in this order (the figures first, the slow sanitizers last):
#   gpu         nvidia-smi: the GPU, its driver and the CUDA version the driver supports (the
#               binaries carry the CUDA runtime they were built with, named in MANIFEST.txt)
#   tests       kiln-gpu tests '[cuda]': every CUDA kernel against the CPU; Catch2's XML report
#               to $OUT/tests.xml
#   rerun       only if tests failed: the failing test cases again with CUDA_LAUNCH_BLOCKING=1,
#               so that an asynchronous fault is reported by the launch that caused it (all of
#               them if the report names none: the process died before writing it)
#   lesson04 ... lesson12
#               every trainer that takes --device cuda, one epoch on the GPU (lesson 10: one
#               pruning round; lesson 12: one process, a world of one rank): its result: line
#   lesson04-full, lesson05-full
#               the chapters' whole default runs, each against its README's target (>= 98%,
#               >= 99.0%): BELOW TARGET, a failure, when the test accuracy falls short (lesson 05
#               on an H200, 2026-12-04: 98.93%)
#   train-kiln  bench_train cuda: each chapter model's training img/s on the GPU, f32 and bf16
#   train-torch bench/torch_train_gpu.py: the same models in PyTorch on the same GPU, f32 with
#               TF32 off and bf16 autocast; the summary's table sets the two side by side
#   attention-kiln, attention-torch
#               chapter 14's causal attention alone (bench_train attention-cuda, then
#               bench/torch_attention_gpu.py): kiln's FlashAttention-2 and textbook kernels and
#               PyTorch's scaled_dot_product_attention, forward + backward, f32 and bf16, contexts
#               256-1024; the summary's table gives kiln's share of PyTorch's speed
#   time-NN     --time-report 3 of each trainer 04-09, and of lesson 06 at the capstone's widths
#               (64/256/256, batch 256): each kernel's time in one training step, from CUDA events
#   time-05-graph
#               lesson 05's step launched kernel by kernel and as one CUDA Graph (--cuda-graph),
#               200 steps each (after --time-report 200's table): ms/step, img/s, launches per step
#   ncu         Nsight Compute's Speed of Light for the kernels of one training step of the
#               64/256/256 net (its first 200; the summary lists the slowest); ABSENT without ncu
#   lab         each lab page: every version validated against the CPU, then timed as a share of
#               cuBLAS or cuDNN ("bench ..." lines)
#   ncu-lab     Nsight Compute's global sectors per request and shared wavefronts per request of
#               every lab kernel at the emulator's sizes (KILN_LAB_SIZES=emulator), to set beside
#               the emulator's counts of the same launches (make lab); the CSV to $OUT/ncu-lab.csv
#   memcheck, synccheck, initcheck
#               compute-sanitizer's tools over the kernel tests, '[cuda]~[trainer]'
#   lesson06-full  lesson 06's whole default run, against its target (>= 80%)
#   lesson13    the capstone's recipe, 10 epochs with --amp bf16 on the JPEG copy: its training
#               time (airbench94's 3.83 s on an A100 is the yardstick) and accuracy
#   racecheck   compute-sanitizer racecheck over the kernels with shared memory
#               ('[cuda][gemm],[cuda][conv],[cuda][batchnorm],[cuda][reduce]'; all of them
#               take 330 s, more than the check has)
# Each step runs under `timeout`: at most its own limit and what is left of GPU_CHECK_SECONDS
# (330 s; the steps' own limits sum to more, so a slow early step shortens the later ones; with
# the look-ups between steps the whole run stays under 6 minutes; a dry run: 6 times each limit,
# 1800 s in all). Results: PASS; FAIL (exit
# status); TIMEOUT; SKIPPED (no time was left); ABSENT, when what the step needs is not on the
# machine (a library, PyTorch, ncu) or a tool refuses the GPU (compute-sanitizer does on some
# sandboxes), which does not fail the check. The exit status is 1 if any step failed, timed
# out, was skipped or ended below its chapter's target. GPU_CHECK_TAGS, GPU_CHECK_SANITIZE_TAGS
# and GPU_CHECK_RACE_TAGS change the test cases the tests and the sanitizers run (Catch2 test specs).
#
# Written under $OUT (default: out/ beside the binaries; build/gpu-check-dry/ for a dry run):
# gpu-check.log (every step's output, each cut at 4 MB), summary.txt (one line per step, then the
# figures: accuracies, the throughput table, each model's slowest kernels, Speed of Light, the lab)
# and tests.xml.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
DRY=${GPU_CHECK_DRY:-0}
if [[ $DRY == 1 ]]; then
    root=$(dirname "$here")                 # the repository: scripts/..
    BUILD=build
    TAGS=${GPU_CHECK_TAGS:-'[cuda][gemm]'}
    MNIST=build/gpu-check-data/mnist CIFAR=build/gpu-check-data/cifar10
    OUT=${OUT:-$root/build/gpu-check-dry}
    SANITIZER=${SANITIZER:-}                # none on the emulator, unless one is named
    NCU=${NCU:-}
    TORCH_DEVICE=cpu TORCH_ARGS=(--seconds 0.1 mlp lenet)
    LAB_PAGES=(gemm reduce poolnorm layout)
elif [[ -f $here/MANIFEST.txt ]]; then
    root=$here                              # gpu-check/, as make gpu-check-prepare fills it
elif [[ -f $here/../gpu-check/MANIFEST.txt ]]; then
    root=$(dirname "$here")/gpu-check       # scripts/gpu-check.sh, after make gpu-check-prepare
else
    echo "gpu-check: no prepared binaries beside $0. Run \`make gpu-check-prepare\` on the build"
    echo "machine and carry gpu-check/ here, or, without a GPU, make gpu-check-dry"
    exit 1
fi
if [[ $DRY != 1 ]]; then
    BUILD=.
    TAGS=${GPU_CHECK_TAGS:-'[cuda]'}
    MNIST=data/mnist CIFAR=data/cifar10
    OUT=${OUT:-$root/out}
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")}
    NCU=${NCU:-$(command -v ncu || echo "$CUDA_HOME/bin/ncu")}
    TORCH_DEVICE=cuda TORCH_ARGS=(--seconds 1)
    LAB_PAGES=(gemm conv reduce batchnorm depthwise poolnorm layout)
fi
KILN=$BUILD/bin/kiln-gpu LAB=$BUILD/lab/kiln-lab LESSON12=$BUILD/bin/lesson-12
TESTS=("$KILN" tests)
# The emulator is slower than a GPU by far: a dry run gives every step SCALE times its limit, and
# itself GPU_CHECK_SECONDS of 1800 (the GPU's run: 330).
SCALE=1 BUDGET=330
[[ $DRY == 1 ]] && SCALE=6 BUDGET=1800
SANITIZE_TAGS=${GPU_CHECK_SANITIZE_TAGS:-$TAGS~[trainer]}
RACE_TAGS=${GPU_CHECK_RACE_TAGS:-'[cuda][gemm],[cuda][conv],[cuda][batchnorm],[cuda][reduce]'}
[[ $DRY == 1 ]] && RACE_TAGS=${GPU_CHECK_RACE_TAGS:-$TAGS}
cd "$root" || exit 1                        # the binaries read data/mnist and data/cifar10 from here
# The prepared binaries travel gzipped (a device call carries 64 MiB): unpacked here, once.
for z in bin/*.gz lab/*.gz; do
    [[ $DRY != 1 && -f $z && ! -x ${z%.gz} ]] || continue
    { gzip -dc "$z" >"${z%.gz}" && chmod +x "${z%.gz}"; } ||
        { echo "gpu-check: could not unpack $root/$z (a full disk, or a read-only folder?)"; exit 1; }
done
PYTHON=${PYTHON:-python3}                   # on the device machine, the python3 that has PyTorch
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$OUT" || exit 1
LOG=$OUT/gpu-check.log
: >"$LOG"
STEPS=$(mktemp -d) || exit 1                # each step's whole output, read for the summary
trap 'rm -rf "$STEPS"' EXIT
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-$BUDGET}))
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
    local name=$1 limit=$(($2 * SCALE)); shift 2
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

# full_run NN LIMIT TARGET [ARGS...]: step lessonNN-full, lesson NN's default run on the device (with
# ARGS), then its result: line's test accuracy against TARGET, the chapter README's "must reach":
# the step's result gains "test_acc X% >= TARGET%", or becomes BELOW TARGET (a failure of the
# check: the chapter's claim does not hold on this GPU). A dry run trains on a few hundred images
# and only reports the comparison.
full_run() {
    local n=$1 limit=$2 target=$3 acc
    shift 3
    step "lesson$n-full" "$limit" "$KILN" "lesson-$n" --device cuda "$@" || return
    acc=$(grep -h '^result:' "$STEPS/lesson$n-full.log" | tail -n 1 | sed -nE 's/.*test_acc=([0-9.]+)%.*/\1/p')
    if [[ -z $acc ]]; then
        RESULTS[-1]="FAIL: no result: line with test_acc"
    elif ! awk -v a="$acc" -v t="$target" 'BEGIN { exit !(a < t) }'; then
        RESULTS[-1]+="; test_acc $acc% >= the chapter's $target%"
    elif [[ $DRY == 1 ]]; then
        RESULTS[-1]+="; test_acc $acc% < $target%, the chapter's target for the full data (a dry run)"
    else
        RESULTS[-1]="BELOW TARGET: test_acc $acc% < the chapter's $target% (${RESULTS[-1]})"
    fi
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

# sanitizer_step NAME TOOL LIMIT TAGS: compute-sanitizer --tool TOOL over the test cases TAGS. A
# sanitizer that is not installed, or that refuses the GPU or the sandbox (its own "=========" lines
# say "not supported", "Internal Sanitizer Error", "unable to ..."), makes the step ABSENT.
sanitizer_step() {
    local name=$1 tool=$2 limit=$3 tags=$4 refusal
    if [[ -z $SANITIZER ]]; then
        record "$name" "ABSENT: dry run, no compute-sanitizer on the emulator"
        return
    elif [[ ! -x $SANITIZER ]]; then
        record "$name" "ABSENT: no compute-sanitizer at $SANITIZER"
        return
    fi
    step "$name" "$limit" "$SANITIZER" --tool "$tool" --error-exitcode 1 "${TESTS[@]}" "$tags" && return
    refusal=$(grep -m1 -iE '^=+ .*(not supported|Internal Sanitizer Error|unable to|failed to initiali)' "$STEPS/$name.log" 2>/dev/null)
    if [[ -n $refusal ]]; then
        RESULTS[-1]="ABSENT: the tool refused: ${refusal#*= }"
    fi
}

# library_path BINARY: the shared libraries BINARY needs that the loader cannot find (the lab's
# cuBLAS and cuDNN may live in PyTorch's pip packages rather than in the system's folders; Open
# MPI and NCCL for lesson 12) are looked for under CUDA_HOME and Python's site-packages, and their
# folders added to LD_LIBRARY_PATH. Sets MISSING to those still not found.
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
# in DIR (their headers' counts rewritten): the dry run's trainers evaluate their test set on the
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

# small_cifar DIR: the first 8 images of each class of CIFAR-10's JPEG archive (data/cifar10,
# from make data), training and test, as DIR/cifar10-jpg.tar.gz (80 + 80 images).
small_cifar() {
    local tmp
    tmp=$(mktemp -d)
    mkdir -p "$1"
    tar -xzf data/cifar10/cifar10-jpg.tar.gz -C "$tmp" --wildcards '*/000[0-7].jpg' &&
        tar -czf "$1/cifar10-jpg.tar.gz" -C "$tmp" train test
    rm -rf "$tmp"
}

# The trainers' arguments: on a GPU one epoch (lesson 10: a dense epoch, then one pruning round
# and one epoch of fine-tuning); in a dry run a few steps on the small data sets.
declare -A LESSON_ARGS
if [[ $DRY == 1 ]]; then
    for n in 04 05 10 11 12; do LESSON_ARGS[$n]="--epochs 1 --data $MNIST --batch-size 32"; done
    for n in 06 07 08 09; do LESSON_ARGS[$n]="--epochs 1 --data $CIFAR --batch-size 16"; done
    FULL_ARGS="--data $MNIST --batch-size 32"   # lesson04-full: its 4 epochs of the small MNIST
    LESSON_ARGS[10]+=" --rounds 1 --finetune-epochs 1"
    LESSON_ARGS[11]+=" --calib-batches 2"
    TIME_ARGS="--time-report 1"
    GRAPH_ARGS="--time-report 2"
    WIDE_ARGS="--width1 64 --width2 256 --width3 256 --batch-size 8"
else
    for n in 04 05 06 07 08 09 11 12; do LESSON_ARGS[$n]="--epochs 1"; done
    LESSON_ARGS[10]="--epochs 1 --rounds 1 --finetune-epochs 1"
    FULL_ARGS=""
    TIME_ARGS="--time-report 3"
    GRAPH_ARGS="--time-report 200"
    WIDE_ARGS="--width1 64 --width2 256 --width3 256 --batch-size 256"
fi

started=$SECONDS
if [[ $DRY == 1 ]]; then
    echo "gpu-check: dry run on the emulator build (build/), in $root; logs to $OUT"
    small_mnist "$MNIST" 640
    [[ -s $CIFAR/cifar10-jpg.tar.gz ]] || small_cifar "$CIFAR"
    record gpu "ABSENT: dry run, no nvidia-smi"
elif ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (nvidia-smi lists none). Without a GPU, run the same kernels on the"
    echo "emulator: make test T='[cuda]', or this script's dry run: make gpu-check-dry"
    exit 1
else
    echo "gpu-check: the binaries of $root ($(head -n 1 MANIFEST.txt)); logs to $OUT"
    step gpu 15 nvidia-smi
fi

# The tests, with Catch2's XML report (which names the failing test cases) in $OUT/tests.xml;
# the failing ones again with every launch synchronous (all of TAGS if none is named: the
# process died before its report was written).
tests_at=${#RESULTS[@]}
if ! step tests 60 "${TESTS[@]}" "$TAGS" -r xml -o "$OUT/tests.xml"; then
    failing_cases "$OUT/tests.xml" >"$STEPS/failing.txt"
    if [[ -s $STEPS/failing.txt ]]; then
        step rerun 45 env CUDA_LAUNCH_BLOCKING=1 "${TESTS[@]}" -f "$STEPS/failing.txt"
    else
        step rerun 45 env CUDA_LAUNCH_BLOCKING=1 "${TESTS[@]}" "$TAGS"
    fi
fi
RESULTS[tests_at]+=" ($(catch2_counts "$OUT/tests.xml"))"

# Every trainer that takes --device cuda, one short run each. Lesson 12 is its own binary: it
# needs Open MPI's library, which the GPU machine may not have (then ABSENT).
for n in 04 05 06 07 08 09 10 11; do
    # shellcheck disable=SC2086  # the arguments are words
    step "lesson$n" 40 "$KILN" "lesson-$n" --device cuda ${LESSON_ARGS[$n]}
done
library_path "$LESSON12"
if [[ -n $MISSING ]]; then
    record lesson12 "ABSENT: ${MISSING}not found on this machine (lesson 12 links Open MPI)"
else
    # shellcheck disable=SC2086
    step lesson12 40 "$LESSON12" --device cuda ${LESSON_ARGS[12]}
fi
# shellcheck disable=SC2086
full_run 04 15 98 $FULL_ARGS
if [[ $DRY != 1 ]]; then
    full_run 05 30 99.0
else
    record lesson05-full "ABSENT: dry run, 12 epochs on the emulator"
fi

# Training throughput: kiln's chapter models, then PyTorch's twins, on the same GPU.
if [[ $DRY == 1 ]]; then
    step train-kiln 60 "$KILN" bench_train cuda quick
else
    step train-kiln 60 "$KILN" bench_train cuda
fi
if ! timeout 20 "$PYTHON" -c 'import torch' 2>/dev/null; then
    record train-torch "ABSENT: no PyTorch for $PYTHON"
elif [[ $TORCH_DEVICE == cuda ]] && ! timeout 30 "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    record train-torch "ABSENT: PyTorch for $PYTHON sees no CUDA GPU"
else
    step train-torch 90 "$PYTHON" bench/torch_train_gpu.py --device "$TORCH_DEVICE" "${TORCH_ARGS[@]}"
fi

# Chapter 14's attention alone, kiln's two kernels, then PyTorch's at the same shapes (its
# script reads kiln's figures and prints the two side by side); PyTorch missing: as train-torch.
quick=()
[[ $DRY == 1 ]] && quick=(quick)  # a dry run: context 64, one call
step attention-kiln 20 "$KILN" bench_train attention-cuda "${quick[@]}"
torch_result=$(for i in "${!NAMES[@]}"; do [[ ${NAMES[$i]} == train-torch ]] && echo "${RESULTS[$i]}"; done)
if [[ $torch_result == ABSENT* ]]; then
    record attention-torch "$torch_result"
else
    step attention-torch 30 "$PYTHON" bench/torch_attention_gpu.py --device "$TORCH_DEVICE" "${quick[@]/#/--}" \
        --kiln "$STEPS/attention-kiln.log"
fi

# A training step's time by kernel, from CUDA events: every trainer 04-09, and the capstone's
# widths (the model furthest behind PyTorch in the GPU's first report).
for n in 04 05 06 07 08 09; do
    # shellcheck disable=SC2086
    step "time-$n" 30 "$KILN" "lesson-$n" --device cuda $TIME_ARGS ${LESSON_ARGS[$n]/--epochs 1/}
done
# Lesson 05's LeNet step launched kernel by kernel and as one CUDA Graph (--cuda-graph), in one run:
# after the time report, 200 steps each way, their ms/step, img/s and the host's launches per step
# shellcheck disable=SC2086
step time-05-graph 30 "$KILN" lesson-05 --device cuda $GRAPH_ARGS ${LESSON_ARGS[05]/--epochs 1/} --cuda-graph
# shellcheck disable=SC2086
step time-wide 30 "$KILN" lesson-06 --device cuda $TIME_ARGS ${LESSON_ARGS[06]/--epochs 1/} $WIDE_ARGS
# the same step with each batch norm, its GELU and the max-pool before it as one layer (lesson 06's
# --fuse): 18 launches fewer (6 BN+GELU pairs, 3 pools); the lab's poolnorm page times the pool's part
# shellcheck disable=SC2086
step time-wide-fused 30 "$KILN" lesson-06 --device cuda $TIME_ARGS ${LESSON_ARGS[06]/--epochs 1/} $WIDE_ARGS --fuse

# Nsight Compute's Speed of Light for one training step of the wide net: --time-report 1 times
# the third step, and KILN_PROFILE_TIMED_STEPS=1 makes it the profiler's capture range
# (cudaProfilerStart/Stop), which ncu --profile-from-start off profiles: its first 200 kernels
# (each profiled kernel is replayed, so a whole step of the wide net would take too long).
if [[ -z $NCU ]]; then
    record ncu "ABSENT: dry run, no Nsight Compute on the emulator"
elif [[ ! -x $NCU ]]; then
    record ncu "ABSENT: no ncu at $NCU"
else
    # shellcheck disable=SC2086
    step ncu 60 env KILN_PROFILE_TIMED_STEPS=1 "$NCU" --profile-from-start off --section SpeedOfLight \
        --launch-count 200 --csv --page details "$KILN" lesson-06 --device cuda --time-report 1 $WIDE_ARGS
    if grep -qiE 'ERR_NVGPUCTRPERM|not supported|no kernels were profiled' "$STEPS/ncu.log" 2>/dev/null; then
        RESULTS[-1]="ABSENT: ncu could not profile: $(grep -m1 -iE 'ERR_NVGPUCTRPERM|not supported|no kernels were profiled' "$STEPS/ncu.log")"
    fi
fi

library_path "$LAB"
if [[ -n $MISSING ]]; then
    record lab "ABSENT: ${MISSING}not found on this machine"
else
    # shellcheck disable=SC2016  # $p and $status belong to the inner shell
    step lab 90 bash -c 'lab=$1; shift; status=0; for p; do echo "=== $p"; "$lab" "$p" || status=1; done; exit $status' \
        lab "$LAB" "${LAB_PAGES[@]}"
fi

# Nsight Compute's memory counts for the lab's kernels at the emulator's sizes (KILN_LAB_SIZES=
# emulator: every version validated once, nothing timed), launch by launch in the order `make lab`
# runs them on the emulator, whose counts (print_traffic) they are set beside.
NCU_TRAFFIC=l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
NCU_TRAFFIC+=,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
NCU_TRAFFIC+=,smsp__sass_inst_executed_op_shared_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
NCU_TRAFFIC+=,smsp__sass_inst_executed_op_shared_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
if [[ -z $NCU ]]; then
    record ncu-lab "ABSENT: dry run, no Nsight Compute on the emulator"
elif [[ ! -x $NCU ]]; then
    record ncu-lab "ABSENT: no ncu at $NCU"
elif [[ -n $MISSING ]]; then
    record ncu-lab "ABSENT: the lab's libraries are missing (${MISSING})"
else
    # shellcheck disable=SC2016
    step ncu-lab 60 env KILN_LAB_SIZES=emulator bash -c \
        'ncu=$1 lab=$2 metrics=$3; shift 3; for p; do echo "=== $p"; "$ncu" --metrics "$metrics" --csv --page raw "$lab" "$p" || exit 1; done' \
        ncu-lab "$NCU" "$LAB" "$NCU_TRAFFIC" "${LAB_PAGES[@]}"
    cp "$STEPS/ncu-lab.log" "$OUT/ncu-lab.csv" 2>/dev/null
fi

sanitizer_step memcheck memcheck 30 "$SANITIZE_TAGS"
sanitizer_step synccheck synccheck 25 "$SANITIZE_TAGS"
sanitizer_step initcheck initcheck 25 "$SANITIZE_TAGS"
if [[ $DRY != 1 ]]; then
    full_run 06 45 80
else
    record lesson06-full "ABSENT: dry run, 10 epochs on the emulator"
fi
# The capstone's recipe on the GPU (chapter 13, "What a GPU changes"): 10 epochs in bf16, on the
# JPEG copy the check carries (lower accuracy than the PNG pixels; the training time is the figure).
if [[ $DRY != 1 ]]; then
    step lesson13 90 "$KILN" lesson-13 --device cuda --amp bf16 --data data/cifar10
else
    step lesson13 60 "$KILN" lesson-13 --device cuda --epochs 1 --data "$CIFAR" --batch-size 16 --tta 1
fi
sanitizer_step racecheck racecheck 60 "$RACE_TAGS"

# ---- the summary ----------------------------------------------------------------------------------
# bench_value NAME: the value of "bench NAME: VALUE unit" in the throughput steps' output.
bench_value() {
    cat "$STEPS/train-kiln.log" "$STEPS/train-torch.log" 2>/dev/null |
        awk -v name="$1" '$1 == "bench" && $2 == name ":" { print $3; exit }'
}

# ratio A B: A/B with two decimals, or - when either is missing.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }

# The throughput table: a row per model bench_train printed ("model NAME: what, batch B, chapters C").
throughput_table() {
    local dev=$TORCH_DEVICE name rest kf tf kb tb
    printf '%-15s %-28s %10s %10s %6s %10s %10s %6s\n' model "chapters, batch" "kiln f32" "torch f32" ratio \
        "kiln bf16" "torch bf16" ratio
    grep '^model ' "$STEPS/train-kiln.log" 2>/dev/null | while read -r _ name rest; do
        name=${name%:}
        kf=$(bench_value "${name}_train_cuda") tf=$(bench_value "torch_${name}_train_$dev")
        kb=$(bench_value "${name}_train_cuda_bf16") tb=$(bench_value "torch_${name}_train_${dev}_bf16")
        printf '%-15s %-28s %10s %10s %6s %10s %10s %6s\n' "$name" \
            "$(sed -E 's/.*batch ([0-9]+), chapters (.*)/\2, batch \1/' <<<"$rest")" \
            "${kf:--}" "${tf:--}" "$(ratio "$kf" "$tf")" "${kb:--}" "${tb:--}" "$(ratio "$kb" "$tb")"
    done
}

# top_kernels LOG: the five slowest kernels of a --time-report's kernel table, and the total.
top_kernels() {
    awk '/^time of one training step by kernel/ { on = 1; next }
         on && /^kernel / { next }
         on && /^\(all kernels\)/ { print "    " $0; exit }
         on && n < 5 { print "    " $0; n++ }' "$1" 2>/dev/null
}

# ncu_table: from ncu's CSV (one row per kernel and metric), each profiled kernel's duration and
# its compute and memory throughput (% of the GPU's peak), the 10 longest.
ncu_table() {
    "$PYTHON" - "$STEPS/ncu.log" <<'PY' 2>/dev/null
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1], errors='replace')) if len(r) > 10]
if not rows: sys.exit()
head, kernels = rows[0], collections.OrderedDict()
col = {name: i for i, name in enumerate(head)}
for r in rows[1:]:
    k = kernels.setdefault((r[col['ID']], r[col['Kernel Name']]), {})
    k[r[col['Metric Name']]] = (r[col['Metric Value']], r[col['Metric Unit']])
def ms(m):
    v, unit = m.get('Duration', ('0', 'ns'))
    return float(v.replace(',', '')) * {'ns': 1e-6, 'us': 1e-3, 'usecond': 1e-3, 'ms': 1, 'msecond': 1, 'nsecond': 1e-6}.get(unit, 1)
top = sorted(kernels.items(), key=lambda kv: -ms(kv[1]))[:10]
print(f"    {'kernel':60} {'ms':>8} {'SM %':>6} {'memory %':>8}")
for (i, name), m in top:
    print(f"    {name[:60]:60} {ms(m):8.3f} {m.get('Compute (SM) Throughput', ('-',))[0]:>6} {m.get('Memory Throughput', ('-',))[0]:>8}")
PY
}

# ncu_traffic_table: ncu-lab's CSV (a block per lab page, a row per launch, the first row of each
# block the units) beside the emulator's counts of the same launches (lab-traffic-emulator.txt,
# from gpu-check-prepare: the n-th launch of a page on each side), one line per launch: per
# request, global sectors (ld, st) and shared wavefronts (ld, st), ncu's/the emulator's.
ncu_traffic_table() {
    "$PYTHON" - "$STEPS/ncu-lab.log" "$root/lab-traffic-emulator.txt" <<'PY' 2>/dev/null
import csv, re, sys
def f(v):
    try: return float(v.replace(',', ''))
    except ValueError: return 0.0
def per(a, b): return a / b if b else None
ncu, page, head = {}, '', None
for line in open(sys.argv[1], errors='replace'):
    if line.startswith('=== '):
        page, head = line[4:].strip(), None
        continue
    if not line.startswith('"'):
        continue
    row = next(csv.reader([line]))
    if head is None:
        head = {name: i for i, name in enumerate(row)}
        continue
    if not row[head['ID']].isdigit():
        continue  # the units row
    m = lambda name: f(row[head[name]]) if name in head else 0.0
    name = re.sub(r'^void |kiln::(cuda::|lab::)?|[(<].*$', '', row[head['Kernel Name']])
    ncu.setdefault(page, []).append((name, [
        per(m('l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum'), m('l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum')),
        per(m('l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum'), m('l1tex__t_requests_pipe_lsu_mem_global_op_st.sum')),
        per(m('l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum'), m('smsp__sass_inst_executed_op_shared_ld.sum')),
        per(m('l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum'), m('smsp__sass_inst_executed_op_shared_st.sum'))]))
emu = {}
try:
    for line in open(sys.argv[2]):
        w = line.rstrip('\n').split('\t')
        if len(w) < 14:
            continue
        n = [float(x) for x in w[4:]]
        emu.setdefault(w[0], []).append((w[2], [per(n[1], n[0]), per(n[3], n[2]), per(n[5], n[4]), per(n[8], n[7])]))
except OSError:
    pass
def cell(a, b):
    s = lambda v: '-' if v is None else f'{v:.2f}'
    return f"{s(a):>6}/{s(b):<6}"
print(f"    {'page':9} {'n':>3} {'kernel (ncu)':34} {'emulator':26} {'gld':^13} {'gst':^13} {'shld':^13} {'shst':^13}")
for page, launches in ncu.items():
    theirs = emu.get(page, [])
    if len(theirs) != len(launches):
        print(f"    {page}: {len(launches)} launches on the GPU, {len(theirs)} on the emulator: the lines below may pair different launches")
    for n, (name, g) in enumerate(launches):
        ename, e = theirs[n] if n < len(theirs) else ('-', [None] * 4)
        print(f"    {page:9} {n:>3} {name[:34]:34} {ename[:26]:26} " + ' '.join(cell(a, b) for a, b in zip(g, e)))
PY
}

status=0
for r in "${RESULTS[@]}"; do
    [[ $r == PASS* || $r == ABSENT* ]] || status=1
done
{
    echo "=== gpu-check summary ($((SECONDS - started))s$([[ $DRY == 1 ]] && echo ', a dry run on the emulator'))"
    [[ $DRY == 1 ]] || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    for i in "${!NAMES[@]}"; do
        printf '  %-14s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    done
    echo "--- the trainers on the GPU (their result: lines)"
    for n in 04 05 06 07 08 09 10 11 12 13 04-full 05-full 06-full; do
        line=$(grep -h '^result:' "$STEPS/lesson$n.log" 2>/dev/null | tail -n 1)
        [[ -n $line ]] && echo "  lesson$n: $line"
    done
    echo "--- training throughput, img/s (random inputs of the real shapes; torch: f32 with TF32 off, bf16 autocast)"
    throughput_table
    grep -h '^attention' "$STEPS/attention-torch.log" 2>/dev/null | sed '1s/^/--- chapter 14: /'
    if [[ -s $STEPS/time-05-graph.log ]]; then
        echo "--- lesson 05, kernel by kernel against one CUDA Graph per step (--cuda-graph)"
        grep -h -A2 '^launches per step' "$STEPS/time-05-graph.log"
    fi
    echo "--- the slowest kernels of one training step (--time-report, CUDA events): launches, ms, share of kernel time"
    for n in 04 05 06 07 08 09 wide; do
        [[ -s $STEPS/time-$n.log ]] || continue
        echo "  time-$n:"
        top_kernels "$STEPS/time-$n.log"
    done
    if [[ -s $STEPS/ncu.log ]]; then
        echo "--- Nsight Compute, Speed of Light of the 64/256/256 net's training step (the 10 longest of its first 200 kernels)"
        ncu_table
    fi
    grep -h '^bench ' "$STEPS/lab.log" 2>/dev/null
    if [[ -s $STEPS/ncu-lab.log ]]; then
        echo "--- Nsight Compute on the lab's kernels at the emulator's sizes, beside the emulator's counts of the same"
        echo "    launches: per request, global sectors (ld, st) and shared wavefronts (ld, st), ncu/emulator"
        ncu_traffic_table
    fi
    echo "logs: $OUT/"
} | tee "$OUT/summary.txt"
exit $status
