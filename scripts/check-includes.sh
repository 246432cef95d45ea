#!/usr/bin/env bash
# check-includes.sh — the engine's folders in one order (src/README.md, "The layers"): each folder
# builds on the ones before it and includes nothing from a folder after it.
#
#   core < io < ops < nn < optim < quant < data < train < dist < mpi
#
# The kernels stand beside ops: src/ops/cpu/ and the CUDA kernels in cuda/ (with its emulator,
# cuda/emu/) include only core/, the CPU kernels' own headers (ops/cpu/),
# a family's header in src/ops/ (ops/norm.h: the family's kernel contract, KILN_KERNEL, with its
# ops), the sizes the kernels take (ops/params.h, ops/qparams.h) and cuda/'s own files. The kernel lab (cuda/lab/), the lessons, tests and benchmarks stand above it all.
#
# The ops of the family headers (src/ops/<family>.h) are compiled once, in src/ops/ops.cpp, which
# alone defines KILN_DEFINE_OPS before including them; a file that defined it too would compile
# them a second time.
#
# Reads every #include "..." of src/ and cuda/ and every #define KILN_DEFINE_OPS of the sources;
# prints each one that breaks a rule and exits 1 if any does. `make test` runs it first (well
# under a second).
#
#   Usage: scripts/check-includes.sh [ROOT]      (default: the repository holding this script)
set -u
cd "${1:-$(dirname "$0")/..}" || exit 1

order=(core io ops nn optim quant data train dist mpi)
declare -A rank
for i in "${!order[@]}"; do rank[${order[$i]}]=$i; done

# The headers a kernel may include, as patterns on the included path.
kernel_ok() {
    case $1 in
        core/* | ops/cpu/* | ops/params.h | ops/qparams.h) return 0 ;;
        ops/*.h) grep -qE '^KILN_(CPU_|CUDA_)?KERNEL\(' "src/$1" 2>/dev/null ;;  # a family's header
        */*) [[ ${1%%/*} == emu ]] ;;  # cuda/'s emulator, named from cuda/
        *) return 0 ;;                  # a file of the kernel's own folder (common.cuh)
    esac
}

bad=0
while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    inc=${rest#*\"}
    inc=${inc%%\"*}
    where="$file:$line: includes \"$inc\""
    case $file in
        src/ops/cpu/* | cuda/*)
            if ! kernel_ok "$inc"; then
                echo "check-includes: $where: a kernel includes only core/, ops/cpu/, a family's header in ops/ (its KILN_KERNEL contract), ops/params.h, ops/qparams.h and cuda/'s own files"
                bad=$((bad + 1))
            fi
            continue ;;
    esac
    dir=${file#src/}
    dir=${dir%%/*}
    to=${inc%%/*}
    if [[ -z ${rank[$dir]+x} ]]; then
        echo "check-includes: $file: src/$dir/ is not in the order (${order[*]}): add it to scripts/check-includes.sh and src/README.md"
        bad=$((bad + 1))
    elif [[ $inc == */* && -n ${rank[$to]+x} ]] && (( rank[$to] > rank[$dir] )); then
        echo "check-includes: $where: $dir/ stands below $to/ (${order[*]}); move what it needs down, or this file up"
        bad=$((bad + 1))
    fi
done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
              -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' src cuda --exclude-dir=lab)

# Each implementation macro is defined by its one file: KILN_DEFINE_OPS by src/ops/ops.cpp (the ops
# of every family header), KILN_DEFINE_LAYERS by src/nn/nn.cpp (the members of the layers written
# in one header, nn/norm.h and nn/pool.h).
for rule in KILN_DEFINE_OPS:src/ops/ops.cpp KILN_DEFINE_LAYERS:src/nn/nn.cpp; do
    macro=${rule%%:*} home=${rule#*:}
    while IFS= read -r hit; do
        [[ ${hit%%:*} == "$home" ]] && continue
        echo "check-includes: $hit: only $home defines $macro (it compiles what that macro guards, once)"
        bad=$((bad + 1))
    done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
                  -E "^[[:space:]]*#[[:space:]]*define[[:space:]]+$macro\\b" src cuda tests bench lessons fuzz)
done

if (( bad )); then
    echo "check-includes: $bad include(s) out of order or definition(s) of KILN_DEFINE_OPS or KILN_DEFINE_LAYERS outside their file"
    exit 1
fi
echo "check-includes: ok (src/ and cuda/ in the order ${order[*]}, kernels beside ops)"
