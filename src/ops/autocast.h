// autocast.h — automatic mixed precision (PyTorch's torch.autocast, chapter 09): while an
// AutocastScope(f16 or bf16) is open on a thread, each layer runs its op in the type the policy
// table below gives that op, casting its inputs on the way in. The parameters stay f32 (the
// "master weights"); an op that runs in the low type reads a low-precision copy of each weight,
// made once per scope (a training step opens one scope around all its micro-batches) and
// counted in the memory report under its own category, "autocast copy".
//
// The policy table — cast_policy() in autocast.cpp is the one place it is written (PyTorch's
// is aten/src/ATen/autocast_mode.h):
//
//   LowPrecision  conv2d, linear              GEMMs: the f16/bf16 tensor-core and AMX math,
//                                             accumulated in f32 inside the kernels
//   F32           cross-entropy (softmax,     exp overflows f16 above 11.09 and a sum of
//                 log-softmax), layer norm    many terms loses what u = 2^-11 cannot hold:
//                                             these run on f32 inputs
//   Widest        add (a residual's sum)      mixed inputs are promoted to the wider type
//                                             (PyTorch's type promotion, scope or not)
//   Input         everything else: relu,      elementwise or a window's max/mean: as exact in
//                 gelu, dropout, pooling,     the low type as the low type itself; batch norm
//                 batch norm                  keeps its statistics and affine parameters in
//                                             f32 inside the kernel (ops/cnn.h)
//
// Gradients keep the type of what they are the gradient of: a layer's backward gets dy in its
// output's type and returns dx in its input's type, so a layer that cast its input casts dx
// back (the cast's backward). The gradient of a weight's low copy is computed in the low type
// (that is where small gradients flush to zero, and why f16 needs a GradScaler,
// optim/grad_scaler.h) and then added, widened, to the f32 parameter's grad (LowGrad below):
// the optimizer updates f32 weights from f32 gradients.
//
// With no scope open, every function here returns its argument: one thread-local load.
#pragma once
#include <memory>

#include "core/tensor.h"

namespace kiln {

// The ops whose type autocast decides, grouped as the table groups them.
enum class AmpOp { Conv2d, Linear, CrossEntropy, LayerNorm, Add, BatchNorm, Pool, Activation, Dropout };
enum class CastPolicy { LowPrecision, F32, Widest, Input };
CastPolicy cast_policy(AmpOp op);

class AutocastScope {
public:
    explicit AutocastScope(DType low);  // DType::F16 or DType::BF16
    ~AutocastScope();
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

private:
    struct Copies;                    // the weights' low-precision copies made in this scope
    DType low_;
    std::unique_ptr<Copies> copies_;
    AutocastScope* previous_;         // the scope this one is nested in (restored at the end)
    friend DType autocast_dtype();
    friend const Tensor& autocast_param(const Tensor& p);
};

// The open scope's low type; DType::F32 when none is open (autocast off).
DType autocast_dtype();

// The type `op` runs in for an input of type `in` (for Add: `in` and `other`, the wider).
DType autocast_target(AmpOp op, DType in, DType other = DType::F32);

// x as op should read it: x itself when its type is already the target (or no scope is open),
// else a converted copy (an activation).
Tensor autocast(const Tensor& x, AmpOp op);

// A parameter as a LowPrecision op reads it: with a scope open, its low-precision copy (made on
// first use in the scope, then the same tensor; Category::AutocastCopy); else p itself. An
// undefined p (a layer without bias) gives itself.
const Tensor& autocast_param(const Tensor& p);

// The gradient a backward op accumulates a weight's dW into. Forward read `used`: the parameter
// itself (then target() is its f32 grad) or its low copy (then target() is a zeroed tensor of
// the copy's type, and add_to_grad() adds it, widened, to the f32 grad).
class LowGrad {
public:
    LowGrad(Tensor& grad, const Tensor& used);
    Tensor& target() { return low_.defined() ? low_ : grad_; }
    void add_to_grad();  // grad += f32(target), when target is a low copy's gradient

private:
    Tensor& grad_;
    Tensor low_;
};

}  // namespace kiln
