// batchnorm.cu — the kernel lab's batch-norm forward (training): two versions side by side,
// each validated against the CPU, then timed against cuDNN on a GPU.
//
// Letters as in ops/params.h: x [N, C, S], S = H·W (1 for BatchNorm1d), M = N·S values per
// channel; value m of channel c sits at x[(m / S · C + c)·S + m mod S].
//   mean = Σ x / M      var = Σ (x − mean)² / M      invstd = 1 / sqrt(var + eps)
//   y = gamma · (x − mean) · invstd + beta
//   running_mean, running_var: moving averages (momentum; the variance unbiased, · M/(M − 1))
//   save_mean, save_invstd: kept for the backward pass
//
//   version 1  naive          the CPU's loops ported as they are: one thread per channel, three
//              passes over its M values (mean, variance, y), sums in double. Only C threads run
//              (64 to 256 in the CIFAR net: a fraction of one SM), and a warp's 32 threads read
//              32 channels, S floats apart: no coalescing when S > 1.
//   version 2  batchnorm_forward_train   (cuda/norm.cu, the engine's) one block of 256 per
//              channel, the same three passes with the block's threads side by side along m
//              (coalesced reads of each row of S values), the sums folded by
//              detail::block_reduce (tree, then warp shuffles), in double.
//   cuDNN      cudnnBatchNormalizationForwardTraining (spatial mode), the reference on a GPU
// Each call first restores the running statistics (two copies of C floats) so that every
// version and every call starts from the same state; cuDNN's calls do the same.
//
// Build and run (from the repository root; `make lab` builds and runs every lab file):
//   make lab                       the emulator: validates each version on a BatchNorm2d
//                                  shape (N, C, S = 3, 5, 63) and a BatchNorm1d one (16, 7, 1)
//   make CUDA=1 lab                a GPU: validates on the CIFAR net's batch-norm shapes at
//                                  batch 256, then prints, per version and shape,
//                                  "bench batchnorm_256x64x225_v2_...: ... GB/s (..% of cudnn)"
//                                  (GB/s of the minimum traffic: x read once, y written once)
//   build-cuda/lab/batchnorm 1     version 1 only (build/lab/batchnorm on the emulator)
#include <cstdint>
#include <string>

#include "common.h"
#include "ops/all.h"

namespace kiln::lab {

// ---- version 1: one thread per channel ---------------------------------------------------------
__global__ void batchnorm_naive_kernel(const float* x, const float* gamma, const float* beta, float* y,
                                       float* running_mean, float* running_var, float* save_mean, float* save_invstd,
                                       BatchNormParams p) {
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= p.C) return;
    const int64_t M = p.N * p.S;
    const auto at = [&](int64_t m) { return (m / p.S * p.C + c) * p.S + m % p.S; };
    double sum = 0.0;
    for (int64_t m = 0; m < M; m++) sum += x[at(m)];
    const double mean = sum / double(M);
    double squares = 0.0;
    for (int64_t m = 0; m < M; m++) {
        const double d = double(x[at(m)]) - mean;
        squares += d * d;
    }
    const double var = squares / double(M);
    const float invstd = float(1.0 / sqrt(var + double(p.eps)));
    const float scale = gamma[c] * invstd, shift = beta[c];
    for (int64_t m = 0; m < M; m++) y[at(m)] = (x[at(m)] - float(mean)) * scale + shift;
    save_mean[c] = float(mean);
    save_invstd[c] = invstd;
    const double k = p.momentum;
    running_mean[c] = float((1.0 - k) * running_mean[c] + k * mean);
    running_var[c] = float((1.0 - k) * running_var[c] + k * var * double(M) / double(M - 1));
}

void batchnorm1(const float* x, const float* gamma, const float* beta, float* y, float* running_mean,
                float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p, int block_size) {
    const dim3 grid(unsigned((p.C + block_size - 1) / block_size)), block(block_size);
    KILN_LAUNCH(batchnorm_naive_kernel, grid, block, 0)(x, gamma, beta, y, running_mean, running_var, save_mean,
                                                        save_invstd, p);
    KILN_CHECK_LAUNCH(batchnorm_naive_kernel, grid, block);
}

const std::vector<Version> kVersions = {{1, "naive", {32, 64, 128}}, {2, "batchnorm_forward_train", {0}}};

// One shape: the CPU reference, every version validated, then (on a GPU) timed against cuDNN.
bool run_shape(int chosen, const BatchNormParams& p) {
    const int64_t C = p.C, count = p.N * p.C * p.S;
    const std::string problem =
        "batchnorm_" + std::to_string(p.N) + "x" + std::to_string(p.C) + "x" + std::to_string(p.S);
    std::printf("%s: N = %lld, C = %lld, S = %lld\n", problem.c_str(), (long long)p.N, (long long)C, (long long)p.S);
    // x around 1, not 0: a one-pass variance (Σx² − (Σx)²/M) would lose digits here.
    const std::vector<float> x = random_floats(size_t(count), 1, -1.0f, 3.0f);
    const std::vector<float> gamma = random_floats(size_t(C), 2, 0.5f, 1.5f), beta = random_floats(size_t(C), 3);
    const std::vector<float> run_mean0 = random_floats(size_t(C), 4), run_var0 = random_floats(size_t(C), 5, 0.5f, 2.0f);
    std::vector<float> y(x.size()), run_mean = run_mean0, run_var = run_var0;
    std::vector<float> save_mean(gamma.size()), save_invstd(gamma.size());
    cpu::batchnorm_forward_train(x.data(), gamma.data(), beta.data(), y.data(), run_mean.data(), run_var.data(),
                                 save_mean.data(), save_invstd.data(), p);
    std::vector<float> want_stats = save_mean;  // save_mean, save_invstd, running_mean, running_var
    for (const auto* v : {&save_invstd, &run_mean, &run_var}) want_stats.insert(want_stats.end(), v->begin(), v->end());

    DeviceArray<float> dx(x), dgamma(gamma), dbeta(beta), dy(x.size()), mean0(run_mean0), var0(run_var0);
    DeviceArray<float> stats(size_t(4 * C));  // as want_stats
    float *d_save_mean = stats.get(), *d_save_invstd = d_save_mean + C, *d_run_mean = d_save_invstd + C,
          *d_run_var = d_run_mean + C;
    const auto restore_running = [&] {
        KILN_CUDA_CHECK(cudaMemcpy(d_run_mean, mean0.get(), size_t(C) * sizeof(float), cudaMemcpyDeviceToDevice));
        KILN_CUDA_CHECK(cudaMemcpy(d_run_var, var0.get(), size_t(C) * sizeof(float), cudaMemcpyDeviceToDevice));
    };
    const auto launch = [&](int version, int block) {
        restore_running();
        if (version == 1)
            batchnorm1(dx.get(), dgamma.get(), dbeta.get(), dy.get(), d_run_mean, d_run_var, d_save_mean, d_save_invstd,
                       p, block);
        else
            cuda::batchnorm_forward_train(dx.get(), dgamma.get(), dbeta.get(), dy.get(), d_run_mean, d_run_var,
                                          d_save_mean, d_save_invstd, p);
    };
    // Both sum in double in another order than the CPU: the statistics agree to ~1e-7, y to a
    // few float ulps.
    const bool ok = validate_versions(
        kVersions, chosen,
        [&](int version, int block) {
            dy.poison();
            stats.poison();
            launch(version, block);
        },
        [&](const std::string& label) {
            const bool y_ok = validate_result(dy.get(), y, label + " y", 1e-5, 1e-5);
            return validate_result(stats.get(), want_stats, label + " stats", 1e-5, 1e-5) && y_ok;
        });
    if (!ok || !kTiming) return ok;
#ifdef KILN_CUDA
    cudnnHandle_t handle;
    CUDNN_CHECK(cudnnCreate(&handle));
    cudnnTensorDescriptor_t x_desc, stats_desc;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&stats_desc));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(p.N), int(C), int(p.S), 1));
    CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(stats_desc, x_desc, CUDNN_BATCHNORM_SPATIAL));
    const float one = 1.0f, zero = 0.0f;
    const double cudnn_ms = time_ms([&] {
        restore_running();
        CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_desc,
                                                           dx.get(), x_desc, dy.get(), stats_desc, dgamma.get(),
                                                           dbeta.get(), double(p.momentum), d_run_mean, d_run_var,
                                                           double(p.eps), d_save_mean, d_save_invstd));
    });
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(x_desc));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(stats_desc));
    CUDNN_CHECK(cudnnDestroy(handle));
    time_versions(kVersions, chosen, launch, problem, 2.0 * double(count) * sizeof(float) / 1e9, "GB/s", cudnn_ms,
                  "cudnn");
#endif
    return true;
}

bool run_lab(int chosen) {
    // On a GPU: the CIFAR net's batch norms at batch 256 (src/nn/models.cpp, widths 64/256/256:
    // 64 channels of 15×15, 256 of 7×7, 256 of 3×3).
    std::vector<BatchNormParams> shapes;
    if (kTiming)
        shapes = {{256, 64, 225}, {256, 256, 49}, {256, 256, 9}};
    else
        shapes = {{3, 5, 63}, {16, 7, 1}};
    bool ok = true;
    for (const BatchNormParams& p : shapes) ok = run_shape(chosen, p) && ok;
    return ok;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    return lab_main("batchnorm", [&] { return run_lab(chosen_version(argc, argv, kVersions)); });
}
