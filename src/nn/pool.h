// pool.h — pooling layers (chapter 03): MaxPool2d, AvgPool2d, GlobalAvgPool.
// The kernels are in src/ops/cpu/pool.cpp and cuda/pool.cu; the input's device picks them.
//
// Letters: N = batch, C = channels, H, W = input size, K = window size, P, Q = output size,
//   P = (H + 2·padding − K) / stride + 1,   Q likewise.
#pragma once
#include <cstdint>
#include <string>

#include "nn/module.h"

namespace kiln {

// y[n, c, p, q] = max over the K×K window at (p·stride − pad, q·stride − pad) of x[n, c, ·, ·]
// (padding counts as −inf). x [N, C, H, W] → y [N, C, P, Q]. stride 0 means stride = K.
// backward: dx[n, c, argmax] += dy[n, c, p, q] — the argmax indices [N, C, P, Q] (i32, the
// position ih·W + iw inside the plane) are saved by forward, one per output.
class MaxPool2d : public Module {
public:
    explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0, std::string name = "maxpool");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C, P, Q]: 4·N·C·P·Q bytes, and the argmax kept: as many i32, 4·N·C·P·Q bytes more
    // (x is not kept); dx [N, C, H, W] in backward.
    LayerMemory memory(const Shape& in, Device device) const override;
    int64_t kernel, stride, padding;

private:
    Tensor argmax_;  // i32 [N, C, P, Q]
    Shape in_shape_;
};

// y[n, c, p, q] = (1 / K²) Σ over the window of x (padding counts as 0 and is counted:
// PyTorch's count_include_pad = true). dx: each dy / K² spread over its window.
class AvgPool2d : public Module {
public:
    explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0, std::string name = "avgpool");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C, P, Q]: 4·N·C·P·Q bytes; nothing kept (backward needs only x's shape); dx [N, C, H, W].
    LayerMemory memory(const Shape& in, Device device) const override;
    int64_t kernel, stride, padding;

private:
    Shape in_shape_;
    Device in_device_ = Device::CPU;  // where the forward ran: dy must be there too
};

// [N, C, H, W] → [N, C]: y[n, c] = mean over H·W of x[n, c];  dx[n, c, ·, ·] = dy[n, c] / (H·W)
class GlobalAvgPool : public Module {
public:
    explicit GlobalAvgPool(std::string name = "global_avgpool") : Module(std::move(name)) {}
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C]: 4·N·C bytes; nothing kept; dx [N, C, H, W].
    LayerMemory memory(const Shape& in, Device device) const override;

private:
    Shape in_shape_;
    Device in_device_ = Device::CPU;  // where the forward ran: dy must be there too
};

}  // namespace kiln
