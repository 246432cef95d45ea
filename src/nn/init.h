// init.h — two initializations of chapter 13's fast CIFAR-10 trainer (airbench's), for Conv2d:
//
//   dirac_init(conv);                    the first C filters pass their input channel through
//   whitening_init(conv, patches_from);  a 2×2 conv that decorrelates the pixels of each patch
//
// Both write the weight in place, on the CPU (move the model to its device after).
#pragma once
#include "core/tensor.h"
#include "nn/conv.h"

namespace kiln {

// PyTorch's nn.init.dirac_ on the first min(O, C) filters: w[o, c, kh, kw] = 1 when c == o and
// (kh, kw) is the kernel's centre ((KH−1)/2, (KW−1)/2), 0 elsewhere in those filters; the other
// filters keep their initialization. With "same" padding the layer then starts as the identity
// on its first channels, plus what the other filters add: a deep net starts close to a shallow
// one. The layer must have one group.
void dirac_init(Conv2d& conv);

// Patch whitening (airbench, after Page's ResNet-9 work). For the images x [N, C, H, W] (CPU,
// f32), take every KH×KW patch p (stride 1, no padding) as a vector of D = C·KH·KW values and
// their covariance Σ = E[(p − E p)(p − E p)ᵀ] (D×D). With its eigen-decomposition Σ = V Λ Vᵀ,
//   filter i     = v_i / sqrt(λ_i + eps)        i = 0 .. D−1
//   filter D + i = −filter i
// so the first D outputs of a patch are its coordinates along Σ's principal axes, each scaled to
// variance λ_i / (λ_i + eps) ≈ 1: decorrelated, unit-variance features, and their negatives (the
// GELU after it keeps both signs). The layer must be C → 2·C·KH·KW, one group, stride 1,
// no padding; its bias, if any, is left as it is. eps keeps the axes of tiny variance (noise)
// from being blown up.
void whitening_init(Conv2d& conv, const Tensor& x, float eps = 5e-4f);

// The eigenvalues (ascending) and unit eigenvectors of a symmetric n×n matrix a (row-major):
// a = V diag(values) Vᵀ, vectors[i·n + j] = component j of eigenvector i. Cyclic Jacobi
// rotations until the off-diagonal part is below 1e-12 of the whole (n is small: 12 for a 2×2
// RGB patch). Throws if a is not symmetric.
void symmetric_eigen(const std::vector<double>& a, int64_t n, std::vector<double>& values,
                     std::vector<double>& vectors);

}  // namespace kiln
