#!/usr/bin/env bash
# check-make.sh — checks, with `make -n` (which prints the commands and runs none of them),
# that the Makefile's run targets do what the README says:
#   make lesson-NN ARGS=...   runs build/bin/lesson-NN with those flags, for every chapter that
#                             has a lessons/NN-*/train.cpp (under mpirun for chapter 12's ranks)
#   make bench                runs scripts/setup.sh --bench (which installs OpenBLAS) before
#                             it compiles or links anything
# Prints one line per check and fails if any check fails. .ci/run runs it.
set -u
cd "$(dirname "$0")/.." || exit 1
failed=0
fail() { echo "check-make: FAIL $*"; failed=$((failed + 1)); }

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

out=$(make -n -B bench 2>&1)   # -B: as if nothing were built yet
setup=$(grep -n -m1 'scripts/setup.sh --bench' <<<"$out" | cut -d: -f1)
compile=$(grep -n -m1 -E '(^| )(g\+\+|c\+\+|ccache|\$\(CXX\))' <<<"$out" | cut -d: -f1)
if [[ -n $setup && ( -z $compile || $setup -lt $compile ) ]]; then
    echo "check-make: make bench installs its packages before it builds"
else
    fail "make -n bench does not run scripts/setup.sh --bench before compiling (setup at line ${setup:-none}, first compile at line ${compile:-none})"
fi

[[ $failed -eq 0 ]] && echo "check-make: all passed" || echo "check-make: $failed failed"
[[ $failed -eq 0 ]]
