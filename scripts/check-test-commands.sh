#!/usr/bin/env bash
# check-test-commands.sh — every `make test T='...'` that the README or a lesson tells a learner
# to run selects at least one test (a renamed test or a mistyped tag would otherwise leave the
# text pointing at nothing: tests/run.sh stops such a command with an error, but only when a
# learner types it). Needs the built test binaries; .ci/run runs it after the build.
#   Usage: scripts/check-test-commands.sh [TEST_BINARY [MPI_TEST_BINARY]]
# Prints one line per filter that selects nothing, and a summary; fails if any does.
set -u
cd "$(dirname "$0")/.." || exit 1
bin=${1:-build/tests/kiln_tests}
mpi_bin=${2:-build/tests/kiln_mpi_tests}
for b in "$bin" "$mpi_bin"; do
    [[ -x $b ]] || { echo "check-test-commands: no $b: build the tests first (make all)"; exit 1; }
done

# The filters, one per line: what stands between T=' and ' in the Markdown files.
filters=$(git ls-files -- '*.md' | xargs grep -ohE "make test T='[^']+'" | sed -E "s/^make test T='(.*)'\$/\1/" | sort -u)
count=0; failed=0
while IFS= read -r filter; do
    [[ -n $filter ]] || continue
    count=$((count + 1))
    if ! bash tests/run.sh --selects "$bin" "$mpi_bin" "$filter"; then
        echo "check-test-commands: FAIL make test T='$filter' selects no test; named in:"
        git grep -n -F "make test T='$filter'" -- '*.md' | sed 's/^/    /'
        failed=$((failed + 1))
    fi
done <<<"$filters"

echo "check-test-commands: $count filters named in the Markdown files; selecting no test: $failed"
[[ $failed -eq 0 ]]
