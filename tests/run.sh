#!/usr/bin/env bash
# run.sh — runs the Catch2 test binary, then (if given) the MPI test binary as several ranks
# under $MPIRUN, and ends, after Catch2's own summaries, with a line "N skipped: ..." (checks this
# machine cannot run, each printed above as SKIPPED: tests/main.cpp) and last the line
# "N passed, N failed" (test cases, both binaries: the line CI reads).
# Usage: tests/run.sh [--selects] BINARY [MPI_BINARY] [TAGS...]
# --selects runs nothing: it exits 0 when TAGS select a test in either binary, 1 otherwise
# (scripts/check-test-commands.sh asks it so of every filter the lessons name).
# MPI_BINARY is told from a tag by being a file; each binary runs only if one of its tests
# matches TAGS, and TAGS that match no test at all are an error (a typo must not pass as
# "0 passed, 0 failed").
set -o pipefail
selects_only=0
if [[ ${1:-} == --selects ]]; then selects_only=1; shift; fi
bin=$1; shift
mpi_bin=
if [[ $# -gt 0 && -f $1 ]]; then mpi_bin=$1; shift; fi
mpirun_cmd=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe -np 2}
passed=0; failed=0; skipped=0; status=0

# Runs one command, adds its test cases to the totals (from Catch2's summary on rank 0).
run_one() {
    local log rc summary p=0 f=0
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    summary=$(grep -E '^(All tests passed|test cases:)' "$log" | tail -n 1)
    if [[ $summary =~ All\ tests\ passed.*in\ ([0-9]+)\ test\ case ]]; then
        p=${BASH_REMATCH[1]}
    elif [[ $summary =~ test\ cases:\ *([0-9]+)\ \|\ *([0-9]+)\ passed\ \|\ *([0-9]+)\ failed ]]; then
        p=${BASH_REMATCH[2]}; f=${BASH_REMATCH[3]}
    elif [[ $summary =~ test\ cases:\ *([0-9]+)\ \|\ *([0-9]+)\ failed ]]; then
        f=${BASH_REMATCH[2]}
    fi
    if [[ $(grep -E '^skipped: [0-9]+ check' "$log" | tail -n 1) =~ ^skipped:\ ([0-9]+) ]]; then
        skipped=$((skipped + BASH_REMATCH[1]))
    fi
    # died before its summary, or another rank failed where rank 0 passed
    if [[ $rc -ne 0 && $f -eq 0 ]]; then f=1; fi
    rm -f "$log"
    passed=$((passed + p)); failed=$((failed + f))
    [[ $rc -ne 0 ]] && status=$rc
    return 0
}

# Whether one of binary $1's tests matches the filters after it (all do when there are none).
matches() {
    [[ $# -eq 1 ]] && return 0
    local names
    names=$("$@" --list-test-names-only 2>/dev/null)  # (not piped into grep -q: pipefail)
    [[ $names =~ [a-z] ]]
}

if [[ $selects_only -eq 1 ]]; then
    matches "$bin" "$@" || { [[ -n $mpi_bin ]] && matches "$mpi_bin" "$@"; }
    exit
fi

ran=0
if matches "$bin" "$@"; then run_one "$bin" "$@"; ran=1; fi
if [[ -n $mpi_bin ]] && matches "$mpi_bin" "$@"; then
    echo "=== the MPI tests: $mpirun_cmd $mpi_bin $*"
    # shellcheck disable=SC2086  # the command's words
    run_one $mpirun_cmd "$mpi_bin" "$@"
    ran=1
fi
if [[ $ran -eq 0 ]]; then
    echo "run.sh: no test matches $*: check the spelling (a tag is in brackets, [lesson09]; a name"
    echo "run.sh: may end in *); $bin --list-tests lists the names, --list-tags the tags"
    failed=1; status=1
fi
echo "$skipped skipped: checks this machine cannot run (each SKIPPED above, with why)"
echo "$passed passed, $failed failed"
exit "$status"
