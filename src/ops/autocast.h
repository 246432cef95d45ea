// autocast.h — automatic mixed precision (PyTorch's torch.autocast, chapter 09): while an
// AutocastScope(f16 or bf16) is open on a thread, each op runs in the type the policy table
// below gives it, casting its inputs on the way in. The decision is made where the op dispatches
// (PyTorch's autocast is a dispatch key): the layers never mention precision. The parameters stay
// f32 (the "master weights"); an op that runs in the low type reads a low-precision copy of each
// weight, made once per scope (a training step opens one scope around all its micro-batches) and
// counted in the memory report under its own category, "weight copy".
//
// The policy table — default_cast_policy() below is the one place it is written (PyTorch's is
// aten/src/ATen/autocast_mode.h); each row names the ops that read it:
//
//   LowPrecision  Conv2d: conv2d,           GEMMs: the f16/bf16 tensor-core and AMX math,
//                 conv2d_backward           accumulated in f32 inside the kernels
//                 Linear: linear,
//                 linear_backward
//                 Attention:                (attention's softmax is inside its kernels, in
//                 causal_self_attention     f32, as in PyTorch's scaled_dot_product_attention)
//                 (+ backward),
//                 cached_attention
//   F32           CrossEntropy:             exp overflows f16 above 11.09 and a sum of
//                 softmax_cross_entropy     many terms loses what u = 2^-11 cannot hold:
//                 LayerNorm: layernorm,     these run on f32 inputs
//                 layernorm_backward
//                 Softmax: softmax
//                 (+ backward)
//   Widest        Add: add (a residual's    mixed inputs are promoted to the wider type
//                 sum)                      (PyTorch's type promotion, scope or not)
//   Input         BatchNorm: batchnorm_*    elementwise or a window's max/mean: as exact in
//                 Pool: maxpool2d, avgpool2d, the low type as the low type itself; batch norm
//                 global_avgpool (+ backward) keeps its statistics and affine parameters in
//                 Activation: relu, gelu    f32 inside the kernel (ops/cnn.h)
//                 (+ backward)
//                 Dropout: dropout (+ backward)
//
// An op that writes into its input (relu_, fill_, axpy_, scale_) runs in that tensor's own type
// whatever the table says: a cast would not be in place (PyTorch's autocast leaves in-place ops
// alone too). The other ops (matmul, sum, argmax_rows, ...) have no row: they run in their
// inputs' type.
//
// Gradients keep the type of what they are the gradient of: a backward op returns dx in the type
// its forward computed in, and Module::call_backward (nn/module.h) converts it to the type the
// layer was given (the cast's backward). The gradient of a weight's low copy is computed in the
// low type (that is where small gradients flush to zero, and why f16 needs a GradScaler,
// optim/grad_scaler.h) and then added, widened, to the f32 parameter's grad (GradInto below):
// the optimizer updates f32 weights from f32 gradients.
//
// With no scope open the ops' casts return their arguments (but Add's promotion): one
// thread-local load.
#pragma once
#include <memory>

#include "core/tensor.h"

namespace kiln {

// The ops whose type autocast decides, grouped as the table groups them. An op with a policy of
// its own adds its row here and in default_cast_policy, nowhere else in the engine (and a check of
// the row in tests/test_autocast.cpp); an op that shares a row, or runs in its inputs' type,
// adds nothing.
enum class AmpOp { Conv2d, Linear, CrossEntropy, LayerNorm, Add, BatchNorm, Pool, Activation, Dropout, Attention, Softmax };
constexpr int kNumAmpOps = int(AmpOp::Softmax) + 1;  // Softmax: the last row
enum class CastPolicy { LowPrecision, F32, Widest, Input };

// The table as written (the comment above explains each row).
constexpr CastPolicy default_cast_policy(AmpOp op) {
    switch (op) {
        case AmpOp::Conv2d:
        case AmpOp::Linear:
        case AmpOp::Attention: return CastPolicy::LowPrecision;
        case AmpOp::CrossEntropy:
        case AmpOp::LayerNorm:
        case AmpOp::Softmax: return CastPolicy::F32;
        case AmpOp::Add: return CastPolicy::Widest;
        case AmpOp::BatchNorm:
        case AmpOp::Pool:
        case AmpOp::Activation:
        case AmpOp::Dropout: return CastPolicy::Input;
    }
    return CastPolicy::Input;
}

CastPolicy cast_policy(AmpOp op);  // the row in force: the table's, or an override's

// Runs one row differently until the override ends (tests and experiments: each op reads its
// row where it dispatches, so a changed row changes what runs).
class CastPolicyOverride {
public:
    CastPolicyOverride(AmpOp op, CastPolicy policy);
    ~CastPolicyOverride();
    CastPolicyOverride(const CastPolicyOverride&) = delete;
    CastPolicyOverride& operator=(const CastPolicyOverride&) = delete;

private:
    AmpOp op_;
    int previous_;
};

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
    friend class AmpCast;
};

// The open scope's low type; DType::F32 when none is open (autocast off).
DType autocast_dtype();

// The type `op` runs in for an input of type `in` (for Add: `in` and `other`, the wider).
DType autocast_target(AmpOp op, DType in, DType other = DType::F32);

// ---- autocast where an op dispatches -----------------------------------------------------------
// Each op with a row in the table starts with
//     const AmpCast amp(AmpOp::Conv2d, x_in.dtype());   // the type conv2d runs in
//     const Tensor x = amp.input(x_in), w = amp.weight(w_in);
// then checks and dispatches in amp.dtype().
// Outside a scope nothing is cast but Add's mixed pair: any other mixed pair reaches the op's
// checks, which name it.
class AmpCast {
public:
    AmpCast(AmpOp op, DType in, DType other = DType::F32);
    DType dtype() const { return dtype_; }
    bool casts() const { return casts_; }  // a scope is open, or the row is Add's
    // An activation as the op reads it: x itself when it has that type (or is undefined) or
    // nothing is cast, else a converted copy.
    Tensor input(const Tensor& x) const;
    // A parameter as the op reads it: with a scope open and p of another type, its copy in the
    // op's type, made on first use in the scope and then the same tensor (Category::WeightCopy);
    // else p itself (an undefined p, a layer without bias, stays undefined).
    Tensor weight(const Tensor& p) const;

private:
    DType dtype_;
    bool casts_;
};

// The gradient a backward op accumulates a weight's dW into: the parameter's grad itself when
// the op ran in its type (or casts nothing), else a zeroed tensor of the op's type
// (Category::Gradient), which add_to_grad() adds, widened, to the grad. An undefined grad (no
// bias) stays undefined.
class GradInto {
public:
    GradInto(Tensor& grad, const AmpCast& amp);
    Tensor& target() { return low_.defined() ? low_ : grad_; }
    void add_to_grad();  // grad += f32(target), when target is a low copy's gradient

private:
    Tensor& grad_;
    Tensor low_;
};

}  // namespace kiln
