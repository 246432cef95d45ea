// poolnorm.cu — the kernel lab's max pooling 2×2 in front of batch norm (chapter 06's --fuse): a
// training step's forward and backward of the pair, the two layers' kernels one after the other
// and the fused kernels, side by side, each validated against the CPU; the emulator counts what
// each moves, a GPU times them.
//
// Letters as in ops/params.h: x [N, C, H, W] → pool [N, C, P, Q], P = H / 2, Q = W / 2 (floor);
// E = N·C·P·Q pooled values, 4 bytes each here (f32).
//   version 1  separate   maxpool2d_forward (cuda/pool.cu: writes the pool and an i32 argmax),
//              batchnorm_forward_train, then batchnorm_backward (writes the pool's gradient) and
//              maxpool2d_backward (reads it and the argmax, writes dx): 4 launches
//   version 2  fused      maxpool2x2_batchnorm_forward_train (writes the pool and a u8 window per
//              value), maxpool2x2_batchnorm_backward (writes dx straight from batch norm's
//              gradient, 0 at each window's three other places): 2 launches (cuda/norm.cu)
// Both give the same bits (tests/test_fuse.cpp); here each is checked against the CPU's separate
// kernels (the device's sums are in another order: 1e-5).
//
// Build and run (from the repository root; `make lab` builds and runs every lab file):
//   make lab                  the emulator: validates at the CIFAR net's block-1 pool, batch 2
//                             (32 channels of 31×31), and under each version its kernels'
//                             global loads and stores (requests; sectors of 32 bytes per request)
//   make CUDA=1 lab           a GPU: the CIFAR net's three pooled layers at batch 256, then per
//                             version "bench poolnorm_...: ... GB/s (..% of separate)" — GB/s of
//                             the separate kernels' least traffic, so the share is the speed-up
//   build/lab/poolnorm 2      version 2 only
#include <cstdint>
#include <string>

#include "common.h"
#include "ops/all.h"

namespace kiln::lab {

const std::vector<Version> kVersions = {{1, "separate", {0}}, {2, "fused", {0}}};

// One layer: x [N, C, H, W], the CPU's separate kernels as the reference, both versions validated,
// then (on a GPU) timed.
bool run_shape(int chosen, int64_t N, int64_t C, int64_t H, int64_t W) {
    const Pool2dParams pool{N, C, H, W, 2, 2, 2, 0};
    const int64_t P = H / 2, Q = W / 2, E = N * C * P * Q;
    BatchNormParams p;
    p.N = N, p.C = C, p.S = P * Q;
    const std::string problem = "poolnorm_" + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(H) +
                                "x" + std::to_string(W);
    std::printf("%s: N = %lld, C = %lld, H = %lld, W = %lld\n", problem.c_str(), (long long)N, (long long)C,
                (long long)H, (long long)W);
    const std::vector<float> x = random_floats(size_t(N * C * H * W), 1, -1.0f, 3.0f);
    const std::vector<float> dz = random_floats(size_t(E), 2);
    const std::vector<float> gamma = random_floats(size_t(C), 3, 0.5f, 1.5f), beta = random_floats(size_t(C), 4);
    // The CPU: pool, batch norm, its backward, the pool's backward.
    const size_t e = size_t(E), c = size_t(C);
    std::vector<float> pooled(e), y(e), dpool(e), dx(x.size()), stats(2 * c);
    std::vector<int32_t> argmax(e);
    std::vector<float> run_mean(c, 0.0f), run_var(c, 1.0f), dgamma(c), dbeta(c);
    cpu::maxpool2d_forward(x.data(), pooled.data(), argmax.data(), pool);
    cpu::batchnorm_forward_train(pooled.data(), gamma.data(), beta.data(), y.data(), run_mean.data(), run_var.data(),
                                 stats.data(), stats.data() + C, p);
    cpu::batchnorm_backward(dz.data(), pooled.data(), gamma.data(), beta.data(), stats.data(), stats.data() + C,
                            dpool.data(), dgamma.data(), dbeta.data(), p);
    cpu::maxpool2d_backward(dpool.data(), argmax.data(), dx.data(), pool);

    DeviceArray<float> d_x(x), d_dz(dz), d_gamma(gamma), d_beta(beta), d_y(y.size()), d_dx(dx.size());
    DeviceArray<float> d_pooled(e), d_dpool(e), d_stats(6 * c);
    DeviceArray<int32_t> d_argmax(argmax.size());
    DeviceArray<uint8_t> d_window(e);
    float *mean = d_stats.get(), *invstd = mean + C, *rmean = invstd + C, *rvar = rmean + C, *dg = rvar + C,
          *db = dg + C;
    const auto launch = [&](int version, int) {
        if (version == 1) {
            cuda::maxpool2d_forward(d_x.get(), d_pooled.get(), d_argmax.get(), pool);
            cuda::batchnorm_forward_train(d_pooled.get(), d_gamma.get(), d_beta.get(), d_y.get(), rmean, rvar, mean,
                                          invstd, p);
            cuda::batchnorm_backward(d_dz.get(), d_pooled.get(), d_gamma.get(), d_beta.get(), mean, invstd,
                                     d_dpool.get(), dg, db, p);
            cuda::maxpool2d_backward(d_dpool.get(), d_argmax.get(), d_dx.get(), pool);
        } else {
            const MaxPool2x2 front{H, W};
            cuda::maxpool2x2_batchnorm_forward_train(d_x.get(), d_gamma.get(), d_beta.get(), d_pooled.get(),
                                                     d_window.get(), d_y.get(), rmean, rvar, mean, invstd, p, front);
            cuda::maxpool2x2_batchnorm_backward(d_dz.get(), d_pooled.get(), d_window.get(), d_gamma.get(),
                                                d_beta.get(), mean, invstd, d_dx.get(), dg, db, p, front);
        }
    };
    const bool ok = validate_versions(
        kVersions, chosen,
        [&](int version, int block) {
            d_y.poison();
            d_dx.poison();
            launch(version, block);
        },
        [&](const std::string& label) {
            const bool y_ok = validate_result(d_y.get(), y, label + " y", 1e-5, 1e-5);
            return validate_result(d_dx.get(), dx, label + " dx", 1e-5, 1e-5) && y_ok;
        });
    if (!ok || !kTiming) return ok;
#ifdef KILN_CUDA
    // The separate kernels' least traffic: x (4E) read, pool and argmax written (2E), the pool read
    // for the statistics and y (E), y written (E); dz and the pool read (2E), the pool's gradient
    // written (E), it and the argmax read (2E), dx written (4E): 17E values of 4 bytes.
    const double separate_ms = time_ms([&] { launch(1, 0); });
    time_versions(kVersions, chosen, launch, problem, 17.0 * double(E) * 4 / 1e9, "GB/s", separate_ms, "separate");
#endif
    return true;
}

bool run_lab(int chosen) {
    // On a GPU: the CIFAR net's pooled layers at batch 256 (src/nn/models.cpp, widths 64/256/256:
    // block 1a pools 64 channels of 31×31, 2a 256 of 15×15, 3a 256 of 7×7); the emulator: block
    // 1a of the default widths (32 channels) at batch 2.
    if (!kTiming) return run_shape(chosen, 2, 32, 31, 31);
    bool ok = true;
    ok = run_shape(chosen, 256, 64, 31, 31) && ok;
    ok = run_shape(chosen, 256, 256, 15, 15) && ok;
    ok = run_shape(chosen, 256, 256, 7, 7) && ok;
    return ok;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    return lab_main("poolnorm", [&] { return run_lab(chosen_version(argc, argv, kVersions)); });
}
