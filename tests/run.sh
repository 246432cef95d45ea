#!/usr/bin/env bash
# run.sh — runs the Catch2 test binary and ends with the line "N passed, N failed"
# (test cases), after Catch2's own summary.   Usage: tests/run.sh BINARY [TAGS...]
set -o pipefail
bin=$1; shift
log=$(mktemp)
"$bin" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(grep -E '^(All tests passed|test cases:)' "$log" | tail -n 1)
passed=0; failed=0
if [[ $summary =~ All\ tests\ passed.*in\ ([0-9]+)\ test\ case ]]; then
    passed=${BASH_REMATCH[1]}
elif [[ $summary =~ test\ cases:\ *([0-9]+)\ \|\ *([0-9]+)\ passed\ \|\ *([0-9]+)\ failed ]]; then
    passed=${BASH_REMATCH[2]}; failed=${BASH_REMATCH[3]}
elif [[ $summary =~ test\ cases:\ *([0-9]+)\ \|\ *([0-9]+)\ failed ]]; then
    failed=${BASH_REMATCH[2]}
elif [[ $rc -ne 0 ]]; then
    failed=1   # the binary died before Catch2 could print its summary
fi
rm -f "$log"
echo "$passed passed, $failed failed"
exit $rc
