// wmma.h — the emulator's nvcuda::wmma: the warp-level matrix multiply-accumulate API of
// CUDA's <mma.h> (tensor cores), run on the CPU. nvcc builds use the real <mma.h>; a .cu file
// gets one or the other through kiln_cuda.h, and is written the same way for both.
//
// What a kernel sees (as NVIDIA's CUDA C++ Programming Guide documents it):
//   fragment<Use, M, N, K, T, Layout>   one warp's share of a matrix tile
//       Use = matrix_a (M×K), matrix_b (K×N) or accumulator (M×N); shapes M×N×K = 16×16×16,
//       32×8×16 or 8×32×16; T = __half or __nv_bfloat16 for matrix_a/b (with Layout =
//       row_major or col_major: how load_matrix_sync reads memory), float for the accumulator
//       (no Layout: its loads and stores take a layout_t)
//       num_elements, x[0 .. num_elements-1]: this lane's elements
//   fill_fragment(f, v)                           every element of f = v
//   load_matrix_sync(f, p, ldm)                   f = the tile at p, ldm elements between rows
//   load_matrix_sync(acc, p, ldm, layout)         (row_major) or columns (col_major)
//   store_matrix_sync(p, acc, ldm, layout)        the tile at p = acc
//   mma_sync(d, a, b, c)                          d = a·b + c   (d may be c)
//
// Rules (checked here; a GPU would misbehave or fault instead):
//   - load, store and mma are warp-wide collectives: all 32 lanes of a warp call them, with the
//     same fragment types and the same pointer, ldm and layout. A lane that skips one, or lanes
//     that disagree, fail the launch with a message naming the call (emu.cpp, WarpCall).
//   - the pointer is 256-bit (32-byte) aligned, and ldm is a multiple of 16 bytes: 8 elements
//     of __half / __nv_bfloat16, 4 of float. A violation throws kiln::Error naming the call,
//     which fails the launch.
//   fill_fragment is not a collective (it touches only the lane's own elements), but because of
//   the next point it is called by the whole warp with one value.
//
// Which elements a lane holds is unspecified by NVIDIA (and differs between GPUs), so a kernel
// may only treat x[] elementwise (scale every element, ...) and must never depend on the
// mapping. This emulator's: element e of lane l is element p = e·32 + l of the fragment's
// matrix in row-major order, i.e. row p / cols, column p % cols (cols = K for matrix_a, N for
// matrix_b and the accumulator), whatever the layout the fragment was loaded with.
//
// mma_sync's arithmetic: every product a[i][k]·b[k][j] is exact in float (11- or 8-bit
// significands multiply to at most 22 bits), and the sums are float additions in a fixed
// order:  d[i][j] = (((c[i][j] + a[i][0]·b[0][j]) + a[i][1]·b[1][j]) + ...) + a[i][K-1]·b[K-1][j],
// each rounded to nearest. Real tensor cores promise no order (and may round differently),
// so a test compares with a tolerance derived from K and float's unit roundoff.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace nvcuda::wmma {

// ---- tags ---------------------------------------------------------------------------------------
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

// The shapes of <mma.h> for 16-bit inputs.
template <int M, int N, int K>
constexpr bool kShape = K == 16 && ((M == 16 && N == 16) || (M == 32 && N == 8) || (M == 8 && N == 32));

// Rows and columns of a fragment's matrix: A is M×K, B is K×N, the accumulator M×N.
template <typename Use, int M, int N, int K>
constexpr int kRows = std::is_same_v<Use, matrix_b> ? K : M;
template <typename Use, int M, int N, int K>
constexpr int kCols = std::is_same_v<Use, matrix_a> ? K : N;

template <typename T>
constexpr bool kInput = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

inline float to_float(float v) { return v; }
inline float to_float(__half v) { return __half2float(v); }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

}  // namespace detail

// ---- fragment -----------------------------------------------------------------------------------
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
    static_assert(detail::kShape<M, N, K>, "wmma fragments for __half / __nv_bfloat16 come in the shapes "
                                           "M×N×K = 16×16×16, 32×8×16 and 8×32×16");
    static_assert(std::is_same_v<Use, accumulator>
                      ? std::is_same_v<T, float> && std::is_void_v<Layout>
                      : detail::kInput<T> && (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>),
                  "matrix_a and matrix_b fragments hold __half or __nv_bfloat16 and take row_major or col_major; "
                  "the emulator's accumulator holds float and takes no layout");

public:
    static constexpr int rows = detail::kRows<Use, M, N, K>, cols = detail::kCols<Use, M, N, K>;
    enum { num_elements = rows * cols / 32, num_storage_elements = num_elements };
    using element_type = T;
    using storage_element_type = T;
    T x[num_elements];

    // This lane's element e is the matrix's (row, col) = (p / cols, p % cols), p = e·32 + lane.
    static int row_of(int lane, int e) { return (e * 32 + lane) / cols; }
    static int col_of(int lane, int e) { return (e * 32 + lane) % cols; }
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const std::common_type_t<T>& value) {
    for (int e = 0; e < f.num_elements; e++) f.x[e] = value;
}

namespace detail {

// The alignment rules of load_matrix_sync and store_matrix_sync, checked on every lane.
template <typename T>
void check_pointer(const char* call, const T* p, unsigned ldm) {
    KILN_CHECK(reinterpret_cast<std::uintptr_t>(p) % 32 == 0, "wmma::", call, ": the pointer ",
               static_cast<const void*>(p),
               " is not 256-bit (32-byte) aligned; align the array (__align__(32) on shared memory) and start "
               "tiles at multiples of 16 rows and columns");
    KILN_CHECK(ldm * sizeof(T) % 16 == 0, "wmma::", call, ": ldm = ", ldm, " must be a multiple of ",
               16 / sizeof(T), " for ", sizeof(T) == 2 ? "16-bit" : "float",
               " elements (16 bytes); pad the rows of the array");
}

// Element (r, c) of the tile at p: p[r·ldm + c] row-major, p[c·ldm + r] column-major. Read and
// written as bytes, so the array may hold another 16-bit type (kiln::f16) with the same bits.
template <typename T>
T* element(std::uintptr_t p, unsigned ldm, bool row, int r, int c) {
    return reinterpret_cast<T*>(p) + (row ? std::size_t(r) * ldm + c : std::size_t(c) * ldm + r);
}

// The WarpCall functions: one call for the whole warp, lanes[l] holding lane l's fragments.
template <typename Frag>
KILN_EMU_UNTRACED void run_load(kiln::emu::WarpCall* const* lanes) {
    using T = typename Frag::element_type;
    const kiln::emu::WarpCall& c = *lanes[0];
    for (int l = 0; l < 32; l++) {
        Frag& f = *static_cast<Frag*>(lanes[l]->out);
        for (int e = 0; e < f.num_elements; e++)
            std::memcpy(&f.x[e], element<T>(c.args[0], unsigned(c.args[1]), c.args[2] == mem_row_major,
                                             Frag::row_of(l, e), Frag::col_of(l, e)),
                        sizeof(T));
    }
}

template <typename Frag>
KILN_EMU_UNTRACED void run_store(kiln::emu::WarpCall* const* lanes) {
    using T = typename Frag::element_type;
    const kiln::emu::WarpCall& c = *lanes[0];
    for (int l = 0; l < 32; l++) {
        const Frag& f = *static_cast<const Frag*>(lanes[l]->in[0]);
        for (int e = 0; e < f.num_elements; e++)
            std::memcpy(element<T>(c.args[0], unsigned(c.args[1]), c.args[2] == mem_row_major, Frag::row_of(l, e),
                                   Frag::col_of(l, e)),
                        &f.x[e], sizeof(T));
    }
}

// A fragment's whole matrix, gathered from the 32 lanes (in[i] of each), as floats.
template <typename Frag>
void gather(kiln::emu::WarpCall* const* lanes, int i, float (*m)[Frag::cols]) {
    for (int l = 0; l < 32; l++) {
        const Frag& f = *static_cast<const Frag*>(lanes[l]->in[i]);
        for (int e = 0; e < f.num_elements; e++) m[Frag::row_of(l, e)][Frag::col_of(l, e)] = to_float(f.x[e]);
    }
}

//   d[i][j] = c[i][j] + Σ_k a[i][k]·b[k][j]      the sum in the order k = 0, 1, ..., K-1
template <typename FragD, typename FragA, typename FragB>
void run_mma(kiln::emu::WarpCall* const* lanes) {
    constexpr int M = FragA::rows, K = FragA::cols, N = FragB::cols;
    float a[M][K], b[K][N], d[M][N];
    gather<FragA>(lanes, 0, a);
    gather<FragB>(lanes, 1, b);
    gather<FragD>(lanes, 2, d);  // c, which d may alias: read whole before any lane's d is written
    for (int i = 0; i < M; i++)  // (k before j: each d[i][j] still adds k in order, and j vectorizes)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) d[i][j] += a[i][k] * b[k][j];
    for (int l = 0; l < 32; l++) {
        FragD& f = *static_cast<FragD*>(lanes[l]->out);
        for (int e = 0; e < f.num_elements; e++) f.x[e] = d[FragD::row_of(l, e)][FragD::col_of(l, e)];
    }
}

constexpr layout_t layout_of(row_major) { return mem_row_major; }
constexpr layout_t layout_of(col_major) { return mem_col_major; }

template <typename Frag, typename T>
void load(const char* call, Frag& f, const T* p, unsigned ldm, layout_t layout) {
    check_pointer(call, p, ldm);
    kiln::emu::WarpCall c{"wmma::load_matrix_sync", &run_load<Frag>,
                          {reinterpret_cast<std::uintptr_t>(p), ldm, std::uintptr_t(layout)}, &f, {}};
    kiln::emu::warp_call(c);
}

}  // namespace detail

// ---- load, store, mma ----------------------------------------------------------------------------
template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(!std::is_same_v<Use, accumulator>, "an accumulator's load_matrix_sync takes a layout_t");
    detail::load("load_matrix_sync", f, p, ldm, detail::layout_of(Layout{}));
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
    detail::load("load_matrix_sync", f, p, ldm, layout);
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
    using Frag = fragment<accumulator, M, N, K, float>;
    detail::check_pointer("store_matrix_sync", p, ldm);
    kiln::emu::WarpCall c{"wmma::store_matrix_sync", &detail::run_store<Frag>,
                          {reinterpret_cast<std::uintptr_t>(p), ldm, std::uintptr_t(layout)}, nullptr, {&f}};
    kiln::emu::warp_call(c);
}

template <int M, int N, int K, typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    using FragD = fragment<accumulator, M, N, K, float>;
    using FragA = fragment<matrix_a, M, N, K, T, LA>;
    using FragB = fragment<matrix_b, M, N, K, T, LB>;
    kiln::emu::WarpCall call{"wmma::mma_sync", &detail::run_mma<FragD, FragA, FragB>, {0, 0, 0}, &d, {&a, &b, &c}};
    kiln::emu::warp_call(call);
}

}  // namespace nvcuda::wmma
