// qgemm.h — the paths of the int8 matrix products qgemm_u8s8 and qgemm_s8u8 (ops/quant.h has
// their contracts), for tests, benchmarks and logs (chapter 11). qgemm.cpp explains each one.
//
// Each picks its path on every call from what the CPU reports (core/cpu_features.h),
// capped by cpu_level() (KILN_CPU=portable forces the portable path):
//   avx512-vnni   cpu_level() ≥ avx512 and AVX512-VNNI: vpdpbusd on zmm, 4 products per lane
//   avx-vnni      cpu_level() ≥ avx2 and AVX-VNNI: the same instruction on ymm
//   avx2-maddubs  cpu_level() ≥ avx2, no VNNI, a_max ≤ 127: vpmaddubsw + vpmaddwd
//   avx2-madd     cpu_level() ≥ avx2, no VNNI, a_max > 127: u8 and i8 widened to i16, vpmaddwd
//   portable      plain C++
// Every path gives the same integers: they are exact (the sums are of integers in int32).
#pragma once
#include <cstdint>
#include <vector>

namespace kiln::cpu {

enum class QgemmPath : uint8_t { Portable, Avx2Madd, Avx2Maddubs, AvxVnni, Avx512Vnni };

const char* qgemm_path_name(QgemmPath path);  // "portable", "avx2-madd", ... as above

// The path qgemm_u8s8 takes now for an A whose values are at most a_max (and qgemm_s8u8 for such a B).
QgemmPath qgemm_path(int32_t a_max);

// Whether this CPU can run `path` (cpu_features(); the KILN_CPU cap does not count), and all
// the paths it can run, portable first.
bool qgemm_path_available(QgemmPath path);
std::vector<QgemmPath> qgemm_available_paths();

// qgemm_u8s8 on a given path (tests and benchmarks compare them): a kiln::Error when this CPU
// cannot run it, or when it is avx2-maddubs and a_max > 127.
void qgemm_u8s8_on(QgemmPath path, int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda,
                   const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc, int32_t a_max);

// qgemm_s8u8 (ops/quant.h) on a given path, as qgemm_u8s8_on; b_max bounds B, its u8 operand.
void qgemm_s8u8_on(QgemmPath path, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
                   const uint8_t* B, int64_t ldb, int32_t* C, int64_t ldc, int32_t b_max);

}  // namespace kiln::cpu
