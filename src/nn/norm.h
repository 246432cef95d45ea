// norm.h — normalization layers: batch normalization (chapter 06), BatchNorm2d for
// [N, C, H, W] and BatchNorm1d for [N, C] (or [N, C, L]); and layer normalization, LayerNorm,
// over the last dimension. They call the ops of ops/cnn.h, whose kernels are in
// src/ops/cpu/norm.cpp and cuda/norm.cu.
//
// Letters: N = batch, C = channels, S = H·W (1 for [N, C]), M = N·S values per channel;
// D = LayerNorm's normalized size, R = the rows of D values it normalizes.
#pragma once
#include <cstdint>
#include <string>

#include "nn/module.h"

namespace kiln {

// Training (batch statistics, per channel over its M values):
//   mean = Σ x / M      var = Σ (x − mean)² / M   (biased, used to normalize)
//   y = weight · (x − mean) / sqrt(var + eps) + bias
//   running_mean = (1 − momentum) · running_mean + momentum · mean
//   running_var  = (1 − momentum) · running_var  + momentum · var · M / (M − 1)   (unbiased)
// Evaluation: y = weight · (x − running_mean) / sqrt(running_var + eps) + bias
// PyTorch's conventions: eps 1e-5, momentum 0.1, running_mean 0 and running_var 1 at the
// start, weight 1 and bias 0. backward (training mode):
//   dbias += Σ dy    dweight += Σ dy · x̂    dx = weight / (M·σ) · (M·dy − Σ dy − x̂ · Σ dy · x̂)
// with x̂ = (x − mean)/σ, σ = sqrt(var + eps). The cache is the input x and the per-channel
// mean and 1/σ (x̂ is recomputed, so no extra activation-sized tensor is kept).
class BatchNorm : public Module {
public:
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C, ...]: 4·N·C·S bytes; keeps x and the per-channel mean and 1/σ (2 · 4·C bytes);
    // parameters weight and bias, 2 · 4·C bytes (+ as much gradient), and the running statistics,
    // 2 · 4·C bytes more (buffers: no gradient, no optimizer state); dx [N, C, ...].
    LayerMemory memory(const Shape& in, Device device) const override;

    Parameter weight, bias;             // [C]: the affine scale and shift ("weight", "bias")
    Tensor running_mean, running_var;   // [C]: buffers ("running_mean", "running_var"): model
                                        // state, saved in checkpoints, not learned
    int64_t num_features;
    float eps = 1e-5f, momentum = 0.1f;
    // GELU fused after the normalization (nn/fuse.h sets it): the layer returns z = GELU(y),
    // one kernel each way, and its backward takes dz. It keeps what it kept before (x and the
    // statistics) and recomputes y, so the GELU layer it replaces no longer keeps y.
    bool gelu = false;

protected:
    // ranks: the input ranks this layer accepts (4 for 2d; 2 or 3 for 1d).
    BatchNorm(int64_t channels, int min_rank, int max_rank, std::string name);

private:
    int min_rank_, max_rank_;
    Tensor x_, save_mean_, save_invstd_;  // the cache for backward
};

// x [N, C, H, W]
class BatchNorm2d : public BatchNorm {
public:
    explicit BatchNorm2d(int64_t channels, std::string name = "bn") : BatchNorm(channels, 4, 4, std::move(name)) {}
};

// x [N, C] (or [N, C, L], like PyTorch)
class BatchNorm1d : public BatchNorm {
public:
    explicit BatchNorm1d(int64_t features, std::string name = "bn") : BatchNorm(features, 2, 3, std::move(name)) {}
};

// LayerNorm (PyTorch's nn.LayerNorm(D), elementwise_affine): each row of D values — x [..., D],
// every dimension but the last is a row — is normalized over its own values; there are no
// batch statistics, so training and evaluation compute the same thing.
//   mean = Σ_d x_d / D      var = Σ_d (x_d − mean)² / D   (biased)      σ = sqrt(var + eps)
//   x̂_d = (x_d − mean) / σ      y_d = weight_d · x̂_d + bias_d
// backward: with g_d = weight_d · dy_d (= dL/dx̂_d) and sums over the row's D values,
//   dx_d = (1/σ) · (g_d − Σ g / D − x̂_d · Σ g·x̂ / D)
//   dweight_d += Σ_rows dy_d · x̂_d        dbias_d += Σ_rows dy_d
// (x̂ depends on x_d directly, through the mean — the Σ g / D term — and through σ — the
// x̂ · Σ g·x̂ / D term.) eps 1e-5, weight 1 and bias 0 at the start, as in PyTorch. The cache is
// x and each row's mean and 1/σ; x̂ is recomputed.
class LayerNorm : public Module {
public:
    explicit LayerNorm(int64_t normalized_size, std::string name = "ln", float eps = 1e-5f);
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [..., D]: 4·R·D bytes; keeps x and each row's mean and 1/σ (2 · 4·R bytes); parameters
    // weight and bias, 2 · 4·D bytes (+ as much gradient); dx [..., D].
    LayerMemory memory(const Shape& in, Device device) const override;

    Parameter weight, bias;  // [D]: the affine scale and shift
    int64_t normalized_size;
    float eps;

private:
    Tensor x_, save_mean_, save_invstd_;  // the cache for backward (x_ as the op read it: f32 under autocast)
};

}  // namespace kiln
