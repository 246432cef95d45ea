#!/usr/bin/env bash
# kernel-report.sh BUILD_DIR — every CUDA kernel's static resources and the occupancy they allow,
# on sm_80 (A100) and sm_90 (H100, H200), without a GPU: `make CUDA=1 kernel-report` runs it after
# the CUDA build, which keeps ptxas's report of each object (nvcc --resource-usage) beside it as
# OBJECT.ptxas. A change that raises a kernel's registers, makes it spill or lowers its occupancy
# shows here, in CI's CUDA build step, before anyone runs it on a GPU.
#
# One row per kernel and architecture: registers per thread, bytes spilled to local memory
# (stores/loads), static shared memory per block (a launch's dynamic shared memory comes on top),
# and the theoretical occupancy — resident warps per SM over the 64 an SM holds — at 128 and 256
# threads per block (the engine's block sizes), with the resource that limits it. The rules
# (NVIDIA's occupancy calculator, compute capability 8.0 and 9.0), for B threads per block:
#   warps per block   W = ceil(B / 32)
#   by warps          floor(64 / W) blocks          (2048 threads per SM)
#   by blocks         32 blocks per SM
#   by registers      floor(65536 / (W · ceil(32 · R / 256) · 256)) blocks
#                     (each warp's registers allocated in units of 256; R = registers per thread)
#   by shared memory  floor(M / ceil(S + 1024, 128)) blocks
#                     (1 KiB per block reserved by the system, allocated in units of 128 bytes;
#                      M, what an SM can give: 164 KiB on sm_80, 228 KiB on sm_90)
#   occupancy = min(those) · W / 64
# The limit named is the smallest of the four (warps when none of the others binds).
set -euo pipefail
build=${1:?usage: scripts/kernel-report.sh BUILD_DIR (make CUDA=1 kernel-report)}
mapfile -t reports < <(find "$build" -name '*.cu.o.ptxas' | sort)
mapfile -t unreported < <(find "$build" -name '*.cu.o' ! -path '*/multi/*' | while read -r o; do [[ -f $o.ptxas ]] || echo "$o"; done)
if ((${#unreported[@]} > 0)); then
    echo "kernel-report: ${#unreported[@]} objects have no ptxas report (built before nvcc's --resource-usage" \
         "was kept): ${unreported[*]}; remove them and run make CUDA=1 kernel-report again" >&2
    exit 1
fi
if ((${#reports[@]} == 0)); then
    echo "kernel-report: no ptxas reports (*.cu.o.ptxas) under $build: build with \`make CUDA=1\` first" >&2
    exit 1
fi

# One record per kernel and architecture: file, arch, mangled name, registers, spill stores, spill
# loads, static shared memory.
records=$(for r in "${reports[@]}"; do
    src=${r#"$build"/}
    src=${src%.o.ptxas}
    awk -v src="$src" '
        /Compiling entry function/ {
            match($0, /function .[^ ]*. for .sm_[0-9]+./)
            split(substr($0, RSTART, RLENGTH), w, "\047")
            name = w[2]; arch = w[4]; spill_st = 0; spill_ld = 0; next
        }
        /bytes spill stores/ && name != "" {
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) == "stores,") spill_st = $i
                if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) == "loads") spill_ld = $i
            }
            next
        }
        /Used [0-9]+ registers/ && name != "" {
            regs = 0; smem = 0
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) ~ /^registers/) regs = $i
                if ($(i + 1) == "bytes" && $(i + 2) ~ /^smem/) smem = $i
            }
            print src "\t" arch "\t" name "\t" regs "\t" spill_st "\t" spill_ld "\t" smem
            name = ""
        }' "$r"
done)
if [[ -z $records ]]; then
    echo "kernel-report: the ptxas reports under $build name no kernel (were they built with --resource-usage?)" >&2
    exit 1
fi

# The table, names demangled (c++filt), without namespaces and parameters, cut to 72 characters,
# by file.
printf '%s\n' "$records" | while IFS=$'\t' read -r src arch name regs st ld smem; do
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$src" "$arch" "$(c++filt "$name")" "$regs" "$st" "$ld" "$smem"
done | sort -t$'\t' -k1,1 -k3,3 -k2,2 | awk -F'\t' '
    function ceil_to(x, unit) { return int((x + unit - 1) / unit) * unit }
    # "void kiln::cuda::gemm_tiled<64, 64, ...>(long, ...)" -> "gemm_tiled<64, 64, ...>"
    function short(name,    i, c, depth) {
        sub(/^void /, "", name)
        gsub(/kiln::(cuda::|lab::)?|detail::|\(anonymous namespace\)::/, "", name)
        depth = 0
        for (i = 1; i <= length(name); i++) {
            c = substr(name, i, 1)
            if (c == "<") depth++
            else if (c == ">") depth--
            else if (c == "(" && depth == 0) return substr(name, 1, i - 1)
        }
        return name
    }
    # occupancy(%) and its limit for B threads per block
    function occupancy(regs, smem, arch, B,    W, by_warps, by_regs, by_smem, m, blocks, limit) {
        W = int((B + 31) / 32)
        by_warps = int(64 / W); blocks = by_warps; limit = "warps"
        if (32 < blocks) { blocks = 32; limit = "blocks" }
        by_regs = int(65536 / (W * ceil_to(32 * (regs > 0 ? regs : 1), 256)))
        if (by_regs < blocks) { blocks = by_regs; limit = "registers" }
        m = (arch == "sm_80" ? 164 : 228) * 1024
        by_smem = int(m / ceil_to(smem + 1024, 128))
        if (by_smem < blocks) { blocks = by_smem; limit = "shared memory" }
        occ = 100 * blocks * W / 64
        return sprintf("%3d%% %-13s", occ, limit)
    }
    BEGIN {
        printf "%-72s %-5s %4s %11s %7s  %-18s %-18s\n", "kernel", "arch", "regs", "spill st/ld", "smem B",
               "occupancy @128", "occupancy @256"
    }
    $1 != file { file = $1; printf "--- %s\n", file }
    short($3) == "" { printf "kernel-report: no name read from %s\n", $3 > "/dev/stderr"; bad = 1 }
    {
        printf "%-72s %-5s %4d %5d/%-5d %7d  %-18s %-18s\n", substr(short($3), 1, 72), $2, $4, $5, $6, $7,
               occupancy($4, $7, $2, 128), occupancy($4, $7, $2, 256)
        n++; if ($5 + $6 > 0) spilling++
    }
    END { printf "%d kernels × architectures; %d spill to local memory\n", n, spilling; exit bad }'
