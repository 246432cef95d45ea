// autocast.h — automatic mixed precision (PyTorch's torch.autocast, chapter 09): while an
// AutocastScope(f16 or bf16) is open on a thread, each op runs in the type the policy table
// below gives it, casting its inputs on the way in. The decision is made where the op dispatches
// (PyTorch's autocast is a dispatch key): the layers never mention precision. The parameters stay
// f32 (the "master weights"); an op that runs in the low type reads a low-precision copy of each
// weight, made once per scope (a training step opens one scope around all its micro-batches) and
// counted in the memory report under its own category, "weight copy".
//
// The policy table: four classes of ops, each with a policy. An op joins a class where it
// dispatches, by naming it — `AmpCast amp(CastPolicy::F32, x.dtype())` — so a new op edits
// nothing here (PyTorch's autocast lists its ops per class the same way, in
// aten/src/ATen/autocast_mode.cpp). Today's members (grep CastPolicy:: in src/ops to see each op's):
//
//   LowPrecision  conv2d, linear,           GEMMs: the f16/bf16 tensor-core and AMX math,
//                 causal_self_attention,    accumulated in f32 inside the kernels
//                 cached_attention          (attention's softmax is inside its kernels, in
//                 (+ backward)              f32, as in PyTorch's scaled_dot_product_attention)
//   F32           softmax_cross_entropy,    exp overflows f16 above 11.09 and a sum of
//                 layernorm, softmax        many terms loses what u = 2^-11 cannot hold:
//                 (+ backward)              these run on f32 inputs
//   Widest        add (a residual's sum)    mixed inputs are promoted to the wider type
//                                           (PyTorch's type promotion, scope or not)
//   Input         batchnorm_*, maxpool2d,   elementwise or a window's max/mean: as exact in
//                 avgpool2d, global_avgpool, the low type as the low type itself; batch norm
//                 relu, gelu, dropout       keeps its statistics and affine parameters in
//                 (+ backward)              f32 inside the kernel
//
// An op that writes into its input (relu_, fill_, axpy_, scale_) runs in that tensor's own type
// whatever its class says: a cast would not be in place (PyTorch's autocast leaves in-place ops
// alone too). The other ops (matmul, sum, argmax_rows, ...) name no class: they run in their
// inputs' type.
//
// Gradients keep the type of what they are the gradient of: a backward op returns dx in the type
// its forward computed in, and Module::call_backward (nn/module.h) converts it to the type the
// layer was given (the cast's backward). The gradient of a weight's low copy is computed in the
// low type (that is where small gradients flush to zero, and why f16 needs a GradScaler,
// optim/grad_scaler.h) and then added, widened, to the f32 parameter's grad (GradInto below):
// the optimizer updates f32 weights from f32 gradients.
//
// With no scope open the ops' casts return their arguments (but Widest's promotion): one
// thread-local load.
#pragma once
#include <memory>

#include "core/tensor.h"

namespace kiln {

// The classes, each named by the policy it has unless overridden (below).
//   LowPrecision: the scope's low type; F32: f32; Widest: the wider of two inputs' types;
//   Input: the input's own type.
enum class CastPolicy { LowPrecision, F32, Widest, Input };

// The policy a class's ops run under: its own, or an override's.
CastPolicy cast_policy(CastPolicy op_class);

// Runs every op of one class under another policy until the override ends (chapter 09's
// exercise 4 and the tests: each op reads its class's policy where it dispatches, so the
// override changes what runs). CastPolicyOverride(CastPolicy::Input, CastPolicy::F32) runs batch
// norm, pooling, the activations and dropout in f32.
class CastPolicyOverride {
public:
    CastPolicyOverride(CastPolicy op_class, CastPolicy policy);
    ~CastPolicyOverride();
    CastPolicyOverride(const CastPolicyOverride&) = delete;
    CastPolicyOverride& operator=(const CastPolicyOverride&) = delete;

private:
    CastPolicy class_;
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

// The type an op of class `op_class` runs in for an input of type `in` (for Widest: `in` and
// `other`, the wider).
DType autocast_target(CastPolicy op_class, DType in, DType other = DType::F32);

// ---- autocast where an op dispatches -----------------------------------------------------------
// Each op whose type autocast decides starts with
//     const AmpCast amp(CastPolicy::LowPrecision, x_in.dtype());   // conv2d's class
//     const Tensor x = amp.input(x_in), w = amp.weight(w_in);
// then checks and dispatches in amp.dtype().
// Outside a scope nothing is cast but a Widest op's mixed pair: any other mixed pair reaches the op's
// checks, which name it.
class AmpCast {
public:
    AmpCast(CastPolicy op_class, DType in, DType other = DType::F32);
    DType dtype() const { return dtype_; }
    bool casts() const { return casts_; }  // a scope is open, or the class is Widest
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
