#!/usr/bin/env bash
# run.sh — `make bench`: runs every benchmark binary in BUILD/bench (each prints lines
# "bench <name>: <value> <unit>"), then the trainers' throughput figures.
# Threads: KILN_THREADS (default 2, the course's reference machine).
set -eu
build=$1
export OMP_NUM_THREADS=${KILN_THREADS:-2}
for b in "$build"/bench/*; do
    [[ -x $b && ! -d $b && $b != *.o && $b != *.d ]] || continue
    "$b"
done
