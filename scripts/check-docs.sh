#!/usr/bin/env bash
# check-docs.sh — the figures the READMEs quote from quick runs, run again and compared
# (`make check-docs`; .ci/run runs it).
#
# Right after the text that quotes a figure, a README holds a block that GitHub does not show:
#
#   <!-- check-docs: lesson-08 --plain --mem-limit 0 --accumulate 1 --limit 256 --epochs 1 --mem-report
#   peak of the step, in the allocators' rounded blocks: predicted 99.2MiB, measured 99.2MiB (+0.0%)
#   -->
#
# Its first line is the command: a program of build/bin and its flags, run from the repository's
# root (each distinct command once, however many blocks name it). Every other line must appear,
# as it is, in what the program prints (stdout and stderr together); a program that fails is a
# failure, unless the block's first line ends in "(fails)" — an error message quoted. Every
# number of two or more characters in those lines must appear in the README's text above the
# block too (since the last heading), so a figure that moves fails here until both the block
# and the text follow.
#
# A block that opens "<!-- check-docs quick:" runs in seconds (MNIST, a refusal, a plan): CI runs
# those alone (--quick); `make check-docs` runs every block (a few minutes).
#
#   Usage: scripts/check-docs.sh [--quick] [FILE.md ...]   (default: README.md and lessons/*/README.md)
# Needs the trainers (make all) and the data (make data). Prints one line per block and fails if
# any line or number is not found.
set -u
cd "$(dirname "$0")/.." || exit 1
quick=0
if [[ ${1:-} == --quick ]]; then quick=1; shift; fi
files=("$@")
(( ${#files[@]} )) || files=(README.md lessons/*/README.md)
bin=${KILN_BIN:-build/bin}
declare -A output status
failed=0; blocks=0
fail() { echo "check-docs: FAIL $*"; failed=$((failed + 1)); }

# run COMMAND: its output and status, cached by the command's text
run() {
    local cmd=$1 prog args
    [[ -n ${output[$cmd]+x} ]] && return
    read -r prog args <<<"$cmd"
    if [[ ! -x $bin/$prog ]]; then
        output[$cmd]="no $bin/$prog: build it first (make all)"; status[$cmd]=127; return
    fi
    local start=$SECONDS
    # shellcheck disable=SC2086  # the flags, split as the README writes them
    output[$cmd]=$("$bin/$prog" $args 2>&1)
    status[$cmd]=$?
    echo "check-docs: ran $prog $args ($((SECONDS - start)) s)"
}

# The figures of a line, one per line: its numbers of two characters or more (99.2 in 99.2MiB,
# 128, 42), but not inside a name (block2a) and not 0.0 or 00.
numbers() { perl -ne 'while (/(?<![\w.])(\d[\d.]*\d)(?!\d|\.\d)/g) { my $n = $1; print "$n\n" if $n =~ /[1-9]/ }' <<<"$1"; }

for file in "${files[@]}"; do
    text=""        # the README's text since the last heading or block
    in_block=0; lineno=0
    while IFS= read -r line || [[ -n $line ]]; do
        lineno=$((lineno + 1))
        if (( ! in_block )); then
            if [[ $line == "<!-- check-docs: "* || $line == "<!-- check-docs quick: "* ]]; then
                in_block=1; start=$lineno; expect=()
                skip=0; [[ $quick -eq 1 && $line == "<!-- check-docs: "* ]] && skip=1
                cmd=${line#<!-- check-docs*: }
                fails=0
                if [[ $cmd == *" (fails)" ]]; then fails=1; cmd=${cmd% (fails)}; fi
                continue
            fi
            [[ $line == "#"* ]] && text=""
            text+="$line"$'\n'
            continue
        fi
        if [[ $line != "-->" ]]; then expect+=("$line"); continue; fi
        # the block ends: run, then compare
        in_block=0
        (( skip )) && continue
        blocks=$((blocks + 1))
        run "$cmd"
        out=${output[$cmd]}; st=${status[$cmd]}; ok=1
        if (( fails == 0 && st != 0 )) || (( fails == 1 && st == 0 )); then
            fail "$file:$start: $cmd exited with $st$( ((fails)) && echo ', and the block says it fails')"
            tail -n 5 <<<"$out" | sed 's/^/    /'
            ok=0
        fi
        for want in "${expect[@]}"; do
            [[ -z $want ]] && continue
            if [[ $out != *"$want"* ]]; then
                fail "$file:$start: $cmd no longer prints: $want"
                # the line it prints instead: the one that shares the most of its first words
                key=$(cut -d' ' -f1-3 <<<"$want")
                grep -F -- "$key" <<<"$out" | head -n 3 | sed 's/^/    it prints: /'
                ok=0
            fi
            # the text's numbers as the program prints them: 1,613 is 1613
            plain=$(perl -pe '1 while s/(\d),(\d{3})(?!\d)/$1$2/' <<<"$text")
            for n in $(numbers "$want"); do
                [[ " $cmd " == *" $n "* || $cmd == *"$n"* ]] && continue  # a flag's value, not a figure
                if [[ $plain != *"$n"* ]]; then
                    fail "$file:$start: the text above the block does not quote $n (from: $want)"
                    ok=0
                fi
            done
        done
        (( ok )) && echo "check-docs: ok $file:$start ($cmd)"
    done <"$file"
    (( in_block )) && fail "$file:$start: a check-docs block without its closing -->"
done
echo "check-docs: $blocks blocks checked, $failed failures"
[[ $failed -eq 0 ]]
