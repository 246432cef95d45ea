#!/usr/bin/env bash
# setup.sh — checks the Debian packages kiln needs and installs the missing ones.
#   as root:        installs them with apt-get (after apt-get update)
#   as a user:      prints the exact apt-get line to run, and stops
# Usage: scripts/setup.sh [--bench]   (--bench adds OpenBLAS and PyTorch, for `make bench`)
set -eu
packages=(g++ make zlib1g-dev libstb-dev catch2 ca-certificates curl)
[[ ${1:-} == --bench ]] && packages+=(libopenblas-dev python3-torch python3-numpy)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "setup: all packages present (${packages[*]})"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages: ${missing[*]}"
    echo "setup: install them with:"
    echo "    sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    exit 1
fi
echo "setup: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
echo "setup: done"
