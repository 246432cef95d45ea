#!/usr/bin/env bash
# setup.sh — checks the Debian packages kiln needs and installs the missing ones, then checks
# the CUDA Toolkit's headers (not a Debian package: it says where to get them).
#   as root:        installs the packages with apt-get (after apt-get update)
#   as a user:      prints the exact apt-get line to run, and stops
# Usage: scripts/setup.sh [--bench] [--fuzz] [--check]
#   --bench   adds OpenBLAS and PyTorch, for `make bench`
#   --fuzz    adds clang with libFuzzer and its OpenMP runtime, for `make fuzz`
#   --check   installs nothing, even as root: names the missing packages and the command that
#             installs them, and fails (`make` runs this once before it compiles anything)
set -eu
bench=0; fuzz=0; check=0
for arg in "$@"; do
    case $arg in
        --bench) bench=1 ;;
        --fuzz) fuzz=1 ;;
        --check) check=1 ;;
        *) echo "usage: scripts/setup.sh [--bench] [--fuzz] [--check]" >&2; exit 2 ;;
    esac
done
# libstb-dev is stb_image 2.27, with a known signed overflow in its JPEG decoder (nothings/stb#1533):
# src/data/image_decode.h says how kiln decodes with it anyway.
# clang: the emulator's traced kernels (make lab's memory counts, their tests: cuda/emu/traffic.cpp).
packages=(g++ clang make zlib1g-dev libstb-dev catch2 ca-certificates curl libopenmpi-dev openmpi-bin)
[[ $bench -eq 1 ]] && packages+=(libopenblas-dev python3-torch python3-numpy)
[[ $fuzz -eq 1 ]] && packages+=(clang libclang-rt-dev libomp-dev)

if ! command -v dpkg-query >/dev/null; then
    echo "setup: no dpkg-query, so this is not Debian or Ubuntu: check by hand that the"
    echo "setup: equivalents of these Debian packages are installed: ${packages[*]}"
    exit "$((1 - check))"   # --check lets the build go on; installing is not possible here
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "setup: all packages present (${packages[*]})"
elif [[ $check -eq 1 || $(id -u) -ne 0 ]]; then
    sudo=sudo; [[ $(id -u) -eq 0 ]] && sudo=
    echo "setup: missing Debian packages: ${missing[*]}"
    echo "setup: install them with:"
    echo "    ${sudo:+$sudo }apt-get update && ${sudo:+$sudo }apt-get install -y ${missing[*]}"
    exit 1
else
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    echo "setup: done"
fi

# The CPU build compiles the CUDA kernels for the emulator, with the toolkit's __half and
# __nv_bfloat16 types (the Makefile's -isystem /usr/local/cuda/include); no GPU is needed.
cuda_header=/usr/local/cuda/include/cuda_fp16.h
if [[ ! -f $cuda_header ]]; then
    echo "setup: the CUDA Toolkit's headers are missing (no $cuda_header). Install NVIDIA's"
    echo "setup: CUDA Toolkit (https://developer.nvidia.com/cuda-downloads), which puts them in"
    echo "setup: /usr/local/cuda; the build needs only its headers, not a GPU or its driver."
    exit 1
fi
