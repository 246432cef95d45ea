// mma.h — the emulator's warp-level tensor-core instructions, as PTX defines them: `ldmatrix`
// (four 8×8 matrices of 16-bit values from shared memory into the lanes' registers, optionally
// transposed) and `mma.sync.m16n8k16` (D = A·B + C with A 16×16, B 16×8 in f16 or bf16, C and
// D 16×8 in f32). nvcc builds run the real instructions (cuda/tensor_tiles.cuh wraps them in
// inline PTX); the emulator build calls these. Unlike wmma's fragments, these registers have a
// documented layout (PTX ISA, "Matrix Fragments for mma.m16n8k16" and "ldmatrix"), which a
// kernel relies on, so the emulator reproduces it exactly:
//
//   lane l, g = l / 4 (the group), t = l % 4 (the thread in the group); a register holds two
//   16-bit values, the first in its low half
//     A (row-major 16×16):  a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]
//                           a2 = A[g][2t+8, 2t+9] a3 = A[g+8][2t+8, 2t+9]
//     B (col-major 16×8):   b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//     C, D (16×8 floats):   c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
//   ldmatrix .x4: lanes 8j .. 8j+7 give the addresses of rows 0..7 of matrix j (16 bytes each,
//     16-byte aligned); register j of lane l receives matrix j's elements [l/4][2(l%4)], [l/4][2(l%4)+1]
//     — or, with .trans, [2(l%4)][l/4], [2(l%4)+1][l/4] (the matrix transposed).
//
// TF32 (f32 operands on the tensor cores, sm_80+): `cvt.rna.tf32.f32` and
// `mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32` (D = A·B + C, A 16×8, B 8×8, C and D 16×8 in f32).
// A register holds one 32-bit value; the places are the PTX ISA's figures "MMA .m16n8k8 fragment
// layout for matrix A with .tf32 type", "... for matrix B with .tf32 type" and "... for
// accumulator matrix C/D" (section "Matrix Fragments for mma.m16n8k8"):
//     A (row-major 16×8):   a0 = A[g][t]   a1 = A[g+8][t]   a2 = A[g][t+4]   a3 = A[g+8][t+4]
//     B (col-major 8×8):    b0 = B[t][g]   b1 = B[t+4][g]
//     C, D:                 as m16n8k16's
// tf32 is f32 with 10 mantissa bits (1 sign, 8 exponent, 10 mantissa: 19 bits). The PTX ISA
// ("Alternate Floating Point Data Formats") leaves the format's internal layout to the
// implementation and has the operands made by cvt.rna.tf32.f32; the tensor cores of sm_80 and
// sm_90 read only a register's top 19 bits, so an operand that was not rounded is truncated
// toward zero. The emulator does the same (it clears the low 13 bits of every operand), so a
// kernel that forgets the cvt gives truncated products here as there.
//
// All are warp collectives but cvt (a WarpCall, emu.cpp): all 32 lanes take part; the last to
// arrive runs the operation for the warp. mma's arithmetic: every product of two 16-bit (or two
// tf32) values is exact in float; the sums are float additions in the order k = 0, 1, ..., 15
// (or 7) onto c, each rounded to nearest. Real tensor cores promise no order: tests compare with
// a tolerance.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace kiln::emu::ptx {

enum class MmaType : std::uintptr_t { F16 = 1, BF16 = 2 };

namespace detail {

inline float half_to_float(std::uint16_t bits, MmaType type) {
    return type == MmaType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}
inline std::uint16_t low(std::uint32_t r) { return std::uint16_t(r & 0xffffu); }
inline std::uint16_t high(std::uint32_t r) { return std::uint16_t(r >> 16); }
inline std::uint32_t pack(std::uint16_t lo, std::uint16_t hi) { return std::uint32_t(lo) | std::uint32_t(hi) << 16; }

// lanes[l]->in[0]: lane l's row address; ->out: its 4 registers; args[0]: transposed or not.
KILN_EMU_UNTRACED inline void run_ldmatrix_x4(WarpCall* const* lanes) {
    const bool trans = lanes[0]->args[0] != 0;
    std::uint16_t m[4][8][8];  // matrix j, row r, column c
    for (int j = 0; j < 4; j++)
        for (int r = 0; r < 8; r++) std::memcpy(m[j][r], lanes[8 * j + r]->in[0], 16);
    for (int l = 0; l < 32; l++) {
        std::uint32_t* reg = static_cast<std::uint32_t*>(lanes[l]->out);
        const int row = l / 4, col = 2 * (l % 4);
        for (int j = 0; j < 4; j++)
            reg[j] = trans ? pack(m[j][col][row], m[j][col + 1][row]) : pack(m[j][row][col], m[j][row][col + 1]);
    }
}

// C and D (16×8 floats, the same places for m16n8k16 and m16n8k8): lane l holds [g][2t], [g][2t+1],
// [g+8][2t], [g+8][2t+1] (g = l / 4, t = l % 4). read_c gathers every lane's c (lanes[l]->in[2])
// before write_d scatters d (->out): c may be d.
KILN_EMU_UNTRACED inline void read_c(WarpCall* const* lanes, float (&d)[16][8]) {
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const float* c = static_cast<const float*>(lanes[l]->in[2]);
        d[g][2 * t] = c[0], d[g][2 * t + 1] = c[1], d[g + 8][2 * t] = c[2], d[g + 8][2 * t + 1] = c[3];
    }
}
KILN_EMU_UNTRACED inline void write_d(WarpCall* const* lanes, const float (&d)[16][8]) {
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        float* out = static_cast<float*>(lanes[l]->out);
        out[0] = d[g][2 * t], out[1] = d[g][2 * t + 1], out[2] = d[g + 8][2 * t], out[3] = d[g + 8][2 * t + 1];
    }
}

// lanes[l]->in = {a (4 registers), b (2), c (4 floats)}, ->out = d (4 floats); args[0]: the type.
KILN_EMU_UNTRACED inline void run_mma_m16n8k16(WarpCall* const* lanes) {
    const MmaType type = MmaType(lanes[0]->args[0]);
    float a[16][16], b[16][8], d[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const std::uint32_t* ar = static_cast<const std::uint32_t*>(lanes[l]->in[0]);
        const std::uint32_t* br = static_cast<const std::uint32_t*>(lanes[l]->in[1]);
        for (int h = 0; h < 2; h++) {  // the two values of a register
            const auto half = [&](std::uint32_t r) { return half_to_float(h ? high(r) : low(r), type); };
            a[g][2 * t + h] = half(ar[0]);
            a[g + 8][2 * t + h] = half(ar[1]);
            a[g][2 * t + 8 + h] = half(ar[2]);
            a[g + 8][2 * t + 8 + h] = half(ar[3]);
            b[2 * t + h][g] = half(br[0]);
            b[2 * t + 8 + h][g] = half(br[1]);
        }
    }
    read_c(lanes, d);
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++)
            for (int j = 0; j < 8; j++) d[i][j] += a[i][k] * b[k][j];
    write_d(lanes, d);
}

// lanes[l]->in = {a (4 registers), b (2), c (4 floats)}, ->out = d (4 floats): tf32 operands, their
// low 13 bits ignored (see the header).
KILN_EMU_UNTRACED inline void run_mma_m16n8k8_tf32(WarpCall* const* lanes) {
    const auto tf32 = [](std::uint32_t r) { return float_of(r & 0xffffe000u); };
    float a[16][8], b[8][8], d[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const std::uint32_t* ar = static_cast<const std::uint32_t*>(lanes[l]->in[0]);
        const std::uint32_t* br = static_cast<const std::uint32_t*>(lanes[l]->in[1]);
        a[g][t] = tf32(ar[0]), a[g + 8][t] = tf32(ar[1]), a[g][t + 4] = tf32(ar[2]), a[g + 8][t + 4] = tf32(ar[3]);
        b[t][g] = tf32(br[0]), b[t + 4][g] = tf32(br[1]);
    }
    read_c(lanes, d);
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 8; k++)
            for (int j = 0; j < 8; j++) d[i][j] += a[i][k] * b[k][j];
    write_d(lanes, d);
}

}  // namespace detail

// cvt.rna.tf32.f32 d, a: a rounded to 10 mantissa bits, to nearest, ties away from zero, as f32
// bits whose low 13 are zero (core/dtype.h's f32_to_tf32 says how).
inline std::uint32_t cvt_rna_tf32(float x) { return bits_of(f32_to_tf32(x)); }

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 {r0, r1, r2, r3}, [row]
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, bool trans) {
    KILN_CHECK(reinterpret_cast<std::uintptr_t>(row) % 16 == 0, "ldmatrix: lane ", threadIdx.x % 32,
               "'s row address ", row, " is not 16-byte aligned (each row is 16 bytes: pad rows to multiples of 8 "
               "16-bit values)");
    // The lane's own 16-byte read of its row, as the shared memory sees ldmatrix (8 rows, 128 bytes,
    // a wavefront): what the emulator's memory counts record (emu.h); the warp call reads the rows
    // for the whole warp, uncounted.
    unsigned char own_row[16];
    std::memcpy(own_row, row, sizeof own_row);
    WarpCall call{trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", &detail::run_ldmatrix_x4,
                  {std::uintptr_t(trans), 0, 0}, r, {row, nullptr, nullptr}};
    warp_call(call);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 d, a, b, d   (d += a·b)
inline void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2], MmaType type) {
    WarpCall call{type == MmaType::BF16 ? "mma.m16n8k16.bf16" : "mma.m16n8k16.f16", &detail::run_mma_m16n8k16,
                  {std::uintptr_t(type), 0, 0}, d, {a, b, d}};
    warp_call(call);
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 d, a, b, d   (d += a·b)
inline void mma_m16n8k8_tf32(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
    WarpCall call{"mma.m16n8k8.tf32", &detail::run_mma_m16n8k8_tf32, {0, 0, 0}, d, {a, b, d}};
    warp_call(call);
}

}  // namespace kiln::emu::ptx
