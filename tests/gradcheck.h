// gradcheck.h — a finite-difference gradient check for any kiln::Module (Catch2 assertions).
//
//   kiln::Linear fc(4, 3, rng);
//   check_module_gradients(fc, kiln::Tensor::normal({2, 4}, 0, 1, rng));
//
// The scalar checked is L = Σ_i y_i · r_i for a fixed random r (seeded), so dL/dy = r and one
// backward(r) gives the analytic dL/dx and dL/dW for every parameter. Each is compared with
// central differences
//   dL/dv ≈ (L(v + ε) − L(v − ε)) / (2ε)        (ε = 1e-2, L summed in double)
// for every element of x and of each parameter (at most 96 elements each, chosen at random,
// when a tensor is bigger). An element passes when
//   |analytic − numeric| ≤ tol · max(|analytic|, |numeric|) + tol · 0.05 · (1 + max |grad| of that tensor)
// (a relative test with an absolute floor that absorbs f32 rounding of near-zero entries).
// One CHECK per tensor, reporting the worst element.
//
// On the CUDA device: move the module there first (m.to(Device::CUDA)) and pass x on it; the
// perturbed values are written to the device, and y and the gradients read back to the CPU.
//
// The module must be a fixed function of its input between forwards: a Dropout needs
// fixed_mask = true; for BatchNorm in training mode the batch statistics are part of the
// function, as they should be. Avoid inputs at kinks (ReLU at 0, max-pool ties): spread them.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "nn/module.h"

void check_module_gradients(kiln::Module& m, const kiln::Tensor& x, uint64_t seed = 0, double tol = 2e-2);
