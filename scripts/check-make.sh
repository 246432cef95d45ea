#!/usr/bin/env bash
# check-make.sh — checks, with `make -n` (which prints the commands and runs none of them),
# that the Makefile's run targets do what the README says:
#   make lesson-NN ARGS=...   runs build/bin/lesson-NN with those flags, for every chapter that
#                             has a lessons/NN-*/train.cpp (under mpirun for chapter 12's ranks)
#   make test T='a name*'     hands tests/run.sh the filter as one word (spaces and * kept)
#   make bench                runs scripts/setup.sh --bench (which installs OpenBLAS) before
#                             it compiles or links anything
#   make fuzz, clang-check    run scripts/setup.sh --fuzz (which installs clang) before they compile
#   make gpu-check-prepare    builds into build-gpucheck/ the kernels with -lineinfo for sm_90 (the
#                             device tool's H200), the host code for -march=x86-64-v3 (never
#                             native), the multi-call kiln-gpu (tests and trainers) and kiln-lab
#                             and lesson 12 linked with the static CUDA and C++ runtimes, then
#                             gathers them
#                             (scripts/gpu-check-prepare.sh)
#   make EXERCISE=1           compiles without -Werror (g++ and nvcc), for a half-written exercise
#   make CUDA=1 kernel-report runs scripts/kernel-report.sh on the CUDA build's ptxas reports
#   make -j1 run              builds on one core: a make that a recipe starts (make run's build,
#                             MAKELEVEL 1) adds no -j of its own
# Prints one line per check and fails if any check fails. .ci/run runs it.
set -u
cd "$(dirname "$0")/.." || exit 1
failed=0
fail() { echo "check-make: FAIL $*"; failed=$((failed + 1)); }

# The make a recipe starts: with -j, GNU make hands it the job slots (--jobserver-auth); under
# make -j1 it gets none, and must not take all the cores itself.
if MAKELEVEL=1 make -pq --no-print-directory check-make-no-goal 2>/dev/null | grep -q '^MAKEFLAGS = .*-j'; then
    fail "a make started by a recipe adds a -j of its own, so make -j1 run would build on every core"
else
    echo "check-make: make -j1 run builds on one core (a recipe's make adds no -j)"
fi

for train in lessons/[0-9][0-9]-*/train.cpp; do
    nn=$(basename "$(dirname "$train")" | cut -c1-2)
    out=$(make -n "lesson-$nn" ARGS='--epochs 1' 2>&1)
    if grep -qE "^(mpirun .* )?build/bin/lesson-$nn --epochs 1\$" <<<"$out"; then
        echo "check-make: make lesson-$nn runs build/bin/lesson-$nn"
    else
        fail "make -n lesson-$nn would not run build/bin/lesson-$nn --epochs 1; it prints:"
        sed 's/^/    /' <<<"$out"
    fi
done

out=$(make -n test T='bf16 pairs*' 2>&1)
if grep -q "tests/run.sh .* 'bf16 pairs\*'\$" <<<"$out"; then
    echo "check-make: make test T='...' passes the filter as one word"
else
    fail "make -n test T='bf16 pairs*' does not pass 'bf16 pairs*' to tests/run.sh as one word; it prints:"
    grep 'tests/run.sh' <<<"$out" | sed 's/^/    /'
fi

# Each target that needs packages beyond the build's installs them before it compiles anything.
for target_option in bench:--bench fuzz:--fuzz clang-check:--fuzz; do
    target=${target_option%%:*}; option=${target_option#*:}
    out=$(make -n -B "$target" 2>&1)   # -B: as if nothing were built yet
    setup=$(grep -n -m1 "scripts/setup.sh $option" <<<"$out" | cut -d: -f1)
    compile=$(grep -n -m1 -E '(^| )(g\+\+|c\+\+|clang\+\+|ccache|\$\(CXX\))' <<<"$out" | cut -d: -f1)
    if [[ -n $setup && ( -z $compile || $setup -lt $compile ) ]]; then
        echo "check-make: make $target installs its packages before it builds"
    else
        fail "make -n $target does not run scripts/setup.sh $option before compiling (setup at line ${setup:-none}, first compile at line ${compile:-none})"
    fi
done

out=$(make -n -B gpu-check-prepare 2>&1)
nvcc_lines=$(grep -E '(^| |/)nvcc ' <<<"$out")
link_lines=$(grep -E -- '-o build-gpucheck/(bin/kiln-gpu|lab/kiln-lab|bin/lesson-12)( |$)' <<<"$out")
if ! grep -q -- '-lineinfo' <<<"$nvcc_lines" || grep -v -- '-lineinfo' <<<"$nvcc_lines" | grep -q . ||
   ! grep -q 'code=sm_90' <<<"$nvcc_lines" || grep -q 'code=sm_80' <<<"$nvcc_lines"; then
    fail "make -n gpu-check-prepare does not compile every kernel with nvcc -lineinfo for sm_90 alone"
elif grep -- '-o build-gpucheck/' <<<"$out" | grep -q -- '-march=native' || ! grep -q -- '-march=x86-64-v3' <<<"$out"; then
    fail "make -n gpu-check-prepare compiles host code for -march=native, not -march=x86-64-v3"
elif [[ $(grep -c -- '-lcudart_static.*-static-libstdc++' <<<"$link_lines") -ne 3 ]]; then
    fail "make -n gpu-check-prepare does not link kiln-gpu (tests, trainers), kiln-lab and lesson 12 statically; its links:"
    sed 's/^/    /' <<<"$link_lines"
elif ! tail -n 1 <<<"$out" | grep -qE '^(LAB_PAGES="[^"]*" )?bash scripts/gpu-check-prepare.sh build-gpucheck '; then
    fail "make -n gpu-check-prepare does not end by gathering build-gpucheck/ (scripts/gpu-check-prepare.sh)"
else
    echo "check-make: make gpu-check-prepare builds portable, statically linked CUDA binaries with -lineinfo"
fi

# make EXERCISE=1: warnings are not errors (g++ and nvcc); without it they are.
# (Two runs of make each: CUDA=1 is a variable of the whole run, and names build-cuda/ for it.)
plain=$(make -n -B build/src/core/dtype.o 2>&1; make -n -B CUDA=1 build-cuda/cuda/norm.cu.o 2>&1)
exercise=$(make -n -B EXERCISE=1 build/src/core/dtype.o 2>&1; make -n -B EXERCISE=1 CUDA=1 build-cuda/cuda/norm.cu.o 2>&1)
if grep -qi -- 'werror' <<<"$exercise" || [[ $(grep -ci -- 'werror' <<<"$plain") -lt 2 ]]; then
    fail "make EXERCISE=1 still compiles with -Werror, or make without it does not"
else
    echo "check-make: make EXERCISE=1 keeps warnings as warnings"
fi

out=$(make -n CUDA=1 kernel-report 2>&1)
if grep -q '^bash scripts/kernel-report.sh build-cuda$' <<<"$out" &&
   ! make -n kernel-report 2>&1 | grep -q 'scripts/kernel-report.sh'; then
    echo "check-make: make CUDA=1 kernel-report reads the CUDA build's ptxas reports (and needs CUDA=1)"
else
    fail "make -n CUDA=1 kernel-report does not run scripts/kernel-report.sh build-cuda; it prints:"
    tail -n 3 <<<"$out" | sed 's/^/    /'
fi

[[ $failed -eq 0 ]] && echo "check-make: all passed" || echo "check-make: $failed failed"
[[ $failed -eq 0 ]]
