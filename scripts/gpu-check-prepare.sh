#!/usr/bin/env bash
# gpu-check-prepare.sh — the second half of `make gpu-check-prepare`: gathers, in gpu-check/ at
# the repository's root (git-ignored), everything scripts/gpu-check.sh runs on a GPU machine that
# builds nothing, and checks that it can travel there. The Makefile has built the binaries first,
# with CUDA=1 GPUCHECK=1, into build-gpucheck/.
#
#   Usage: LAB_PAGES="gemm conv ..." scripts/gpu-check-prepare.sh BUILD_DIR BINARY...
#          (BINARY relative to BUILD_DIR; LAB_PAGES: the lab's pages, whose traced emulator
#          binaries build/lab/PAGE the Makefile has built)
#
# gpu-check/ then holds: gpu-check.sh; the binaries, stripped of their host symbol tables and
# gzipped, at the same paths as in BUILD_DIR (bin/kiln-gpu.gz, lab/kiln-lab.gz, bin/lesson-12.gz:
# gpu-check.sh unpacks them before its first step); data/mnist/ (the four gzip IDX
# files) and data/cifar10/cifar10-jpg.tar.gz (the binaries read data/ from the folder they run
# in); bench/torch_train_gpu.py, bench/torch_attention_gpu.py and the scripts they import
# (PyTorch's twins); MANIFEST.txt (what was built, from which commit, with which CUDA, and each
# file's size); lab-traffic-emulator.txt
# (the emulator's memory counts of every lab launch at its own sizes, with an H200's 132 SMs so
# that the GEMMs pick the tiles and split-K the slices the GPU will: gpu-check.sh sets Nsight
# Compute's counts of the same launches beside them).
# Checks, each failing with what to do:
#   - every binary loads only libraries the GPU machine has (SYSTEM_LIBS below; everything else
#     is linked statically, as the Makefile's GPUCHECK says), but lesson 12, which may also load
#     Open MPI and NCCL (gpu-check.sh reports it ABSENT where they are missing);
#   - the folder plus the rest of the working tree a device call sends stays under 64 MiB.
# Prints the newest C library version the binaries need (the GPU machine's must be as new).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$1; shift
DIR=gpu-check
LIMIT_MIB=64                                 # what one device call carries
MNIST=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
# The shared libraries a binary may load: the C library's own; zlib's, where no libz.a was found
# to link (every Debian and Ubuntu system has libz.so.1, only its headers may be missing); and
# for the lab, cuBLAS and cuDNN, too large to carry (the GPU machine has them with its CUDA or
# its PyTorch).
SYSTEM_LIBS='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libz)\.so|^lib(cublas|cublasLt|cudnn)\.so'
MPI_LIBS='^lib(mpi|nccl)\.so'               # bin/lesson-12's, which the machine may lack

fail() { echo "gpu-check-prepare: $*" >&2; exit 1; }

# MiB N_BYTES: N in MiB with one decimal.
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

rm -rf "$DIR"
mkdir -p "$DIR/data/mnist" "$DIR/data/cifar10" "$DIR/bench"
newest_glibc='' loaded=''
for b in "$@"; do
    [[ -x $BUILD/$b ]] || fail "$BUILD/$b was not built: run \`make gpu-check-prepare\`, not this script alone"
    needed=$(readelf -d "$BUILD/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    loaded=$(printf '%s\n' "$loaded" "$needed" | grep . | sort -u)
    others=$(grep -vE "$SYSTEM_LIBS" <<<"$needed" || true)
    [[ $b == bin/lesson-12 ]] && others=$(grep -vE "$MPI_LIBS" <<<"$others" || true)
    [[ -z $others ]] || fail "$BUILD/$b loads $(tr '\n' ' ' <<<"$others")which the GPU machine may not have: link it statically (the Makefile's GPUCHECK flags)"
    newest_glibc=$( (echo "$newest_glibc"; objdump -T "$BUILD/$b" | grep -o 'GLIBC_[0-9.]*' || true) | sort -V | tail -n 1)
    mkdir -p "$DIR/$(dirname "$b")"
    cp "$BUILD/$b" "$DIR/$b"
    strip --strip-all "$DIR/$b"  # the host symbol tables: a fifth of each binary (the kernels stay)
    gzip -9 -n "$DIR/$b"         # $b.gz, about 60% of it: gpu-check.sh unpacks it on the GPU machine
done
for f in "${MNIST[@]}"; do
    [[ -f data/mnist/$f ]] || fail "data/mnist/$f is missing: run \`make data\`"
    cp -L "data/mnist/$f" "$DIR/data/mnist/"
done
[[ -f data/cifar10/cifar10-jpg.tar.gz ]] || fail "data/cifar10/cifar10-jpg.tar.gz is missing: run \`make data\`"
cp -L data/cifar10/cifar10-jpg.tar.gz "$DIR/data/cifar10/"
: >"$DIR/lab-traffic-emulator.txt"
for page in ${LAB_PAGES:-}; do
    [[ -x build/lab/$page ]] || fail "build/lab/$page (the emulator's traced lab) was not built: run \`make gpu-check-prepare\`"
    KILN_EMU_MULTIPROCESSORS=132 KILN_LAB_TRAFFIC_LOG="$DIR/lab-traffic-emulator.txt" build/lab/"$page" >/dev/null ||
        fail "build/lab/$page failed on the emulator: run it to see why"
done
cp scripts/gpu-check.sh "$DIR/"
cp bench/torch_train_gpu.py bench/torch_train.py bench/torch_lenet.py bench/torch_attention_gpu.py "$DIR/bench/"

{
    echo "kiln $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)'), built $(date -u '+%Y-%m-%d %H:%M UTC') with $(${NVCC:-/usr/local/cuda/bin/nvcc} --version | grep -o 'release [0-9.]*' | sed 's/release/CUDA/')"
    echo "run: bash gpu-check/gpu-check.sh (scripts/gpu-check.sh says how)"
    echo "needs: an x86-64 CPU with AVX2, $newest_glibc or newer, an NVIDIA driver for that CUDA"
    (cd "$DIR" && find . -type f ! -name MANIFEST.txt -printf '%s\t%P\n' | sort -k2)
} >"$DIR/MANIFEST.txt"

# What a device call sends: the files git tracks or would track, and this folder (carried).
folder=$(du -sb "$DIR" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
total=$((folder + tree))
echo "gpu-check-prepare: $DIR/ is $(mib "$folder") MiB ($# binaries, MNIST, CIFAR-10, the scripts); with the rest" \
     "of the working tree ($(mib "$tree") MiB) a device call carries $(mib "$total") MiB of $LIMIT_MIB"
echo "gpu-check-prepare: the binaries need $newest_glibc or newer and load only $(tr "\n" " " <<<"$loaded")"
((total <= LIMIT_MIB * 1048576)) ||
    fail "that is over the $LIMIT_MIB MiB a device call carries: leave a binary out of the Makefile's GPU_CHECK_BINS (or a program out of kiln-gpu)"
echo "gpu-check-prepare: ready. On the GPU machine, one device call that carries $DIR runs: bash $DIR/gpu-check.sh"
