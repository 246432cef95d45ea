// lesson-09 — chapter 06's CIFAR net trained in mixed precision: the convolutions and the linear
// layer in f16 or bf16 under autocast (ops/autocast.h), the weights and the optimizer in f32,
// and with f16 a GradScaler (optim/grad_scaler.h) so that small gradients do not flush to zero.
//
//   make lesson-09                                   # 10 epochs in f16 with loss scaling
//   make lesson-09 ARGS='--amp bf16'                 # bf16: f32's range, no scaler
//   make lesson-09 ARGS='--amp f32'                  # the f32 run to compare with (chapter 06's)
//   make lesson-09 ARGS='--limit 2560 --epochs 1'    # a quick look
//
// Before training it prints the three formats' ranges, and after the first step the gradients'
// binary exponents against f16's range (--grad-hist, on here): what would underflow without the
// scale, and what the scale lifts.
#include <chrono>
#include <cstdio>
#include <optional>

#include "core/allocator.h"       // defines: BumpAllocator
#include "core/dtype.h"           // defines: float_format
#include "nn/models.h"            // defines: cifar_net, CifarNetWidths
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: CifarData, only_measure, fit (--amp, GradScaler), report

using namespace kiln;

// f32, f16, bf16: bits, largest value, smallest normal and subnormal, epsilon.
void print_formats() {
    std::printf("format  exponent/mantissa bits  max          min normal   min subnormal  epsilon\n");
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
        const FloatFormat f = float_format(t);
        std::printf("%-7s %2d / %-2d                   %-12.5g %-12.5g %-14.5g %.5g\n", dtype_name(t), f.exponent_bits,
                    f.mantissa_bits, f.max, f.min_normal, f.min_subnormal, f.epsilon);
    }
}

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.batch_size = 128;
    flags.lr = 0.05f;
    flags.data = "data/cifar10";
    flags.amp = DType::F16;
    flags.grad_hist = true;
    float weight_decay = 5e-4f;
    CifarNetWidths widths{32, 64, 128};
    Cli cli("lesson-09", "Trains lesson 06's CNN in mixed precision: f16 with loss scaling, or bf16 (--amp).");
    flags.add_to(cli);
    cli.add("--weight-decay", &weight_decay, "L2 weight decay", Cli::at_least(0));
    cli.parse(argc, argv);
    Device device = flags.apply();
    auto start = std::chrono::steady_clock::now();
    print_formats();

    CifarData cifar(flags, device);  // crops and flips for training (train/fit.h)
    BumpAllocator arena("step arena", device);  // each step's activations, as in chapter 06
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = cifar_net(rng, widths);
    Sequential& model = *net;
    model.to(device);
    SGD sgd(model.parameters(), flags.lr,
            SGD::Options{}.with_momentum(0.9f).with_weight_decay(weight_decay).with_nesterov());
    flags.apply_memory_limit(device);
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(model, sgd, cifar.train, flags, &arena)) return 0;
    std::printf("lesson-09: %s, %lld parameters, %lld training images, device %s, %s%s\n", model.name().c_str(),
                (long long)model.num_parameters(), (long long)cifar.train_set.n, device_name(device),
                flags.amp == DType::F32 ? "f32 (no autocast)" : dtype_name(flags.amp),
                flags.amp == DType::F16 ? " autocast with a GradScaler" : flags.amp == DType::BF16 ? " autocast" : "");

    double test_acc = fit(model, sgd, cifar.train, cifar.test, flags, &arena);
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-09: %s\n", e.what());
    return 1;
}
