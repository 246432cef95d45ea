#!/usr/bin/env bash
# multi-localize.sh OBJECT ENTRY — prepares one program's object for a multi-call binary
# (scripts/multi_main.cpp): every global symbol OBJECT defines becomes local, as if it had been
# declared static, except ENTRY (its renamed main, a C++ function: _Z<length>ENTRYiPPc) and the
# shared definitions (weak and unique
# symbols: inline functions, templates and their statics, which the objects of one binary must
# share). Two programs may then each define a run_lab() or a Flags without clashing at link time.
set -euo pipefail
object=$1 entry=$2
# nm's strong global definitions: T text, D data, B bss, R read-only, C common, G/S small data.
list=$(mktemp)
trap 'rm -f "$list"' EXIT
mangled=_Z${#entry}${entry}iPPc
nm --defined-only -g "$object" | awk -v entry="$mangled" '$2 ~ /^[TDBRCGS]$/ && $3 != entry { print $3 }' >"$list"
nm --defined-only -g "$object" | awk -v entry="$mangled" '$3 == entry { found = 1 } END { exit !found }' ||
    { echo "multi-localize: $object defines no $entry (compile it with -Dmain=$entry)" >&2; exit 1; }
# (objcopy fails, silently, on an empty list)
[[ ! -s $list ]] || objcopy --localize-symbols="$list" "$object"
