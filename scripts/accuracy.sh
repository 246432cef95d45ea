#!/usr/bin/env bash
# accuracy.sh — the accuracy runs: trains each chapter's model fully and checks its result
# line against the accuracy the chapter promises. Long (minutes to an hour per chapter on
# 2 cores), so it is not part of `make test`; run it as `make accuracy` or for some chapters:
#   bash scripts/accuracy.sh BUILD_DIR 01 03
# Prints one line per chapter and "N passed, N failed" last.
set -u
build=$1; shift
declare -A target=([01]=92.0 [02]=98.0 [03]=99.0 [04]=98.0 [05]=99.0 [06]=80.0 [07]=88.0 [08]=80.0 [09]=80.0 [10]=98.0 [11]=99.0 [12]=99.0 [13]=94.0)
chapters=("$@")
[[ ${#chapters[@]} -gt 0 ]] || chapters=(01 02 03 04 05 06 07 08 09 10 11 12 13)
passed=0; failed=0
for ch in "${chapters[@]}"; do
    want=${target[$ch]:-}
    if [[ -z $want || ! -x $build/bin/lesson-$ch ]]; then
        echo "accuracy lesson-$ch: no trainer or no target"; failed=$((failed + 1)); continue
    fi
    # chapter 12 trains on 2 MPI ranks ($MPIRUN overrides how they start)
    launcher=()
    [[ $ch == 12 ]] && read -r -a launcher <<<"${MPIRUN:-mpirun --allow-run-as-root --oversubscribe -np 2}"
    line=$("${launcher[@]}" "$build/bin/lesson-$ch" 2>&1 | tee "/tmp/kiln-accuracy-$ch.log" | grep '^result:' | tail -n 1)
    got=$(sed -nE 's/^result: test_acc=([0-9.]+)%.*/\1/p' <<<"$line")
    if [[ -n $got ]] && awk -v g="$got" -v w="$want" 'BEGIN { exit !(g >= w) }'; then
        echo "accuracy lesson-$ch: PASS $line (needs ≥ $want%)"; passed=$((passed + 1))
    else
        echo "accuracy lesson-$ch: FAIL '${line:-no result line}' (needs ≥ $want%; log /tmp/kiln-accuracy-$ch.log)"
        failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
