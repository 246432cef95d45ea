// loss.h — the softmax cross-entropy (chapters 01 and 13): the kernel's contract, declared once
// for both backends (core/backend.h; src/ops/cpu/loss.cpp ↔ cuda/loss.cu), then the ops on
// tensors that check their arguments and dispatch to it (autocast class F32: the logits are cast
// to f32 under autocast): declared here, defined at the end of this file and compiled once, in
// src/ops/ops.cpp (KILN_DEFINE_OPS). The loss layer (nn/layers.h) and the training loop call the ops.
#pragma once
#include <cstdint>

#include "core/allocator.h"  // Workspace
#include "core/backend.h"
#include "core/cuda_memory.h"
#include "core/tensor.h"
#include "ops/autocast.h"
#include "ops/check.h"

namespace kiln {

// ==== the kernel =============================================================================
// What the loss kernel leaves in the device's memory (host memory on the CPU) for the host to
// read when it wants to: one 32-byte copy brings back a step's loss, its correct count and any bad label.
// The op (softmax_cross_entropy, below) reads it at once; a training loop may keep many and read
// them together, one wait for many steps (train/loss_log.h).
struct LossTotals {
    double total;                // Σ_n loss_n: the mean loss is total / N
    unsigned long long correct;  // rows whose first maximum is their label (argmax_rows's answer)
    unsigned long long bad;      // a label outside [0, C): N − (the first such row); 0: none
    unsigned long long classes;  // C, for the message that names a bad label
};

// Softmax cross-entropy of N rows of C logits z against integer labels y:
//   loss_n = log Σ_c exp(z[n,c]) − z[n,y_n]
// computed as m + log Σ exp(z − m) with m = max_c z[n,c], so exp never overflows (in double on
// the CPU, in float on CUDA: cuda/loss.cu says how it keeps the digits). dz (if not null) =
// (softmax(z) − onehot(y)) / N, rounded once to T. With label smoothing ε > 0 the target is
// q = (1 − ε)·onehot(y) + ε/C instead of onehot(y) (below): loss_n = log Σ exp(z) − Σ_c q_c z_c,
// dz = (softmax(z) − q) / N. The rows' losses are added in a fixed order (the same bits on every
// run) into out->total, the correct rows counted into out->correct; a label outside [0, C) is
// recorded in out->bad (nothing else of the result is meaningful then) and not thrown: the
// kernel does not wait for the host, nor the host for it. T = float, f16 or bf16 (the logits'
// type); y and out are on z's device.
KILN_KERNEL(softmax_cross_entropy,
            template <typename T> void softmax_cross_entropy(const T* z, const int32_t* y, T* dz, int64_t N,
                                                             int64_t C, float smoothing, LossTotals* out));


// ==== the ops on tensors ====================================================================
// Mean softmax cross-entropy of logits[N,C] (f32, f16 or bf16) against labels[N] (i32, each in
// [0, C)), computed in f32 (double on the CPU) whatever the logits' dtype; the loss is a float.
// If dlogits is given it is filled with the gradient: (softmax − onehot) / N, computed in f32
// and rounded once to the logits' dtype — a gradient has its tensor's dtype (as in PyTorch),
// so it feeds the backward GEMM of the layer that made the logits in that layer's type. In f16,
// entries below 2^-24 flush to 0 there: chapter 09's loss scaling is what keeps them.
// A dlogits of another shape, dtype or device is replaced.
// correct (if not null): how many rows' argmax_rows is their label; on the GPU it comes back with
// the loss in one copy, with no copy of the labels to check them (cuda/loss.cu).
// smoothing: PyTorch's label_smoothing ε in [0, 1): the target is (1 − ε)·onehot(y) + ε/C, so
//   loss = 1/N Σ_n [ log Σ_c exp(z[n,c]) − (1 − ε)·z[n,y_n] − (ε/C)·Σ_c z[n,c] ]
//   dz   = (softmax(z) − (1 − ε)·onehot(y) − ε/C) / N
// A net is then never pushed to make one logit infinitely larger than the others (chapter 13).
// On a GPU the call waits once, for the 32-byte copy of the loss, the count and any bad label.
float softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* dlogits = nullptr,
                            int64_t* correct = nullptr, float smoothing = 0.0f);

// The same without the wait, for a training loop that reads many steps' losses at once
// (train/loss_log.h): the kernel's totals (above) go to `totals`, sizeof(LossTotals)
// bytes of the logits' device memory, and nothing is read back; loss_from_totals reads them.
void softmax_cross_entropy_into(const Tensor& logits, const Tensor& labels, Tensor* dlogits, float smoothing,
                                LossTotals* totals);

// The mean loss of N rows from totals brought back to the host, *correct (if not null) their
// correct count; a bad label the kernel recorded is a kiln::Error naming its row — and its value,
// when the labels (on any device) are still at hand.
float loss_from_totals(const LossTotals& totals, int64_t N, int64_t* correct, const Tensor* labels = nullptr);

}  // namespace kiln


#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
namespace kiln {

void softmax_cross_entropy_into(const Tensor& logits_in, const Tensor& labels, Tensor* dlogits,
                                float smoothing, LossTotals* totals) {
    const Tensor logits = AmpCast(CastPolicy::F32, logits_in.dtype()).input(logits_in);
    check_args("softmax_cross_entropy", {{logits, "logits"}});
    KILN_CHECK(smoothing >= 0.0f && smoothing < 1.0f, "softmax_cross_entropy: label smoothing must be in [0, 1), got ",
               smoothing);
    check_dtype(labels, DType::I32, "softmax_cross_entropy", "labels");
    check_same_device(logits, labels, "softmax_cross_entropy");
    KILN_CHECK(logits.ndim() == 2 && labels.ndim() == 1 && labels.size(0) == logits.size(0) && logits.size(0) > 0,
               "softmax_cross_entropy: logits should be [N, C] and labels [N], got ", logits.desc(), " and ",
               labels.desc());
    const int64_t N = logits.size(0), C = logits.size(1);
    if (dlogits) {
        if (!dlogits->defined() || dlogits->shape() != logits.shape() || dlogits->dtype() != logits.dtype() ||
            dlogits->device() != logits.device())
            *dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device(), Category::Activation);
    }
    // The kernel checks the labels (a label outside [0, C) would read outside its row) and counts
    // the rows predicted right; on the GPU all of it stays there until the host reads `totals`.
    dispatch(logits.device(), logits.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        T* dz = dlogits ? dlogits->data<T>() : nullptr;
        kernel::softmax_cross_entropy(be, logits.data<T>(), labels.data<int32_t>(), dz, N, C, smoothing, totals);
    });
}

float loss_from_totals(const LossTotals& totals, int64_t N, int64_t* correct, const Tensor* labels) {
    const unsigned long long C = totals.classes;
    if (totals.bad != 0) {
        const int64_t row = N - int64_t(totals.bad);
        KILN_CHECK(labels, "softmax_cross_entropy: the label at row ", row, " is outside [0, ", C, ") classes");
        KILN_FAIL("softmax_cross_entropy: label ", labels->to(Device::CPU).data<int32_t>()[row], " at row ", row,
                  " is outside [0, ", C, ") classes");
    }
    if (correct) *correct = int64_t(totals.correct);
    return float(totals.total / double(N));
}

float softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* dlogits, int64_t* correct,
                            float smoothing) {
    LossTotals host{};
    if (logits.device() == Device::CUDA) {
        const Workspace totals(sizeof host);  // scratch, as the kernels' own (core/allocator.h)
        softmax_cross_entropy_into(logits, labels, dlogits, smoothing, totals.as<LossTotals>());
        cuda::copy_to_host(&host, totals.as<LossTotals>(), sizeof host);  // the one wait
    } else {
        softmax_cross_entropy_into(logits, labels, dlogits, smoothing, &host);
    }
    return loss_from_totals(host, labels.numel(), correct, &labels);
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
