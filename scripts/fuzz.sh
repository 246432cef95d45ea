#!/usr/bin/env bash
# fuzz.sh — runs each libFuzzer harness (make fuzz builds them) for a while, one after another.
#   Usage: scripts/fuzz.sh DIR SECONDS HARNESS...
# DIR/fuzz_<harness> runs SECONDS seconds on DIR/corpus/<harness> (kept between runs: what it
# finds is the next run's start) and the seeds in DIR/seeds/<harness>. A crash, a sanitizer
# report, a leak, an input slower than 10 s or an allocation past 2 GiB stops it: its input is
# kept as DIR/crash-<harness>-*, its log's end printed, and the script fails. Otherwise one
# line per harness: runs, coverage, corpus size.
#   Reproduce a finding:  DIR/fuzz_<harness> DIR/crash-<harness>-<hash>
set -uo pipefail
dir=$1; seconds=$2; shift 2
status=0
for h in "$@"; do
    mkdir -p "$dir/corpus/$h"
    log="$dir/$h.log"
    if "$dir/fuzz_$h" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
           -artifact_prefix="$dir/crash-$h-" "$dir/corpus/$h" "$dir/seeds/$h" >"$log" 2>&1; then
        runs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
        cov=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | grep -oE 'cov: [0-9]+' | awk '{print $2}')
        echo "fuzz $h: ${runs:-?} inputs in ${seconds}s, coverage ${cov:-?}, corpus $(ls "$dir/corpus/$h" | wc -l) files: no finding"
    else
        echo "fuzz $h: FINDING (its input: $(ls "$dir"/crash-"$h"-* 2>/dev/null | head -n 1)); the end of $log:"
        tail -n 40 "$log"
        status=1
    fi
done
exit $status
