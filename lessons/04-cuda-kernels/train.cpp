// lesson-04 — chapter 02's multi-layer perceptron, trained on the CUDA kernels of cuda/*.cu.
//
//   make lesson-04                          # 4 epochs on --device cuda: the GPU, or the emulator
//   make lesson-04 ARGS='--device cpu'      # the same run on the CPU kernels, to compare
//   make lesson-04 ARGS='--limit 2000 --epochs 1'   # a quick look
//   make lesson-04 ARGS='--cuda-graph'      # each step one CUDA Graph launch (train/step_graph.h)
//
// Nothing here is CUDA-specific: the tensors live on Device::CUDA, so every op in the step
// (src/ops/<family>.h) calls its kiln::cuda:: kernel instead of its kiln::cpu:: twin, and the
// allocator takes device memory (src/core/allocator.cpp -> cuda/memory.cu).
//
// The network (N = batch size), as in lesson 02:
//   x [N, 1, 28, 28] -> Flatten [N, 784] -> Linear 784→512 -> ReLU -> Linear 512→256 -> ReLU
//                    -> Linear 256→10 -> logits [N, 10] -> softmax cross-entropy
#include <chrono>
#include <cstdio>
#include <memory>

#include "core/allocator.h"       // defines: BumpAllocator, memory_summary
#include "nn/models.h"            // defines: mlp
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: MnistData, only_measure, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.device = "cuda";
    flags.epochs = 4;
    flags.lr = 0.05f;
    Cli cli("lesson-04", "Trains lesson 02's MLP on MNIST with the CUDA kernels (a GPU, or the emulator).");
    flags.add_to(cli);
    cli.add("--cuda-graph", &flags.cuda_graph,
            "launch each training step as one captured CUDA Graph (--device cuda; the README's \"launch overhead\")");
    cli.parse(argc, argv);
    Device device = flags.apply();
    auto start = std::chrono::steady_clock::now();

    MnistData mnist(flags, device);  // the loaders copy each batch to the device

    // Each step's activations and workspaces, reset after every step (train/loop.cpp); the
    // arena starts empty and grows to the largest step's size (core/allocator.h).
    BumpAllocator arena("step arena", device);

    // Model: drawn on the CPU from the seed (the same weights as lesson 02), then moved.
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> model = mlp(rng);
    model->to(device);
    SGD sgd(model->parameters(), flags.lr, SGD::Options{}.with_momentum(0.9f));
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(*model, sgd, mnist.train, flags, &arena)) return 0;
    std::printf("lesson-04: MLP 784-512-256-10, %lld parameters, %lld training images, device %s\n",
                (long long)model->num_parameters(), (long long)mnist.train_set.n, device_name(device));

    double test_acc = fit(*model, sgd, mnist.train, mnist.test, flags, &arena);  // as lesson 02
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-04: %s\n", e.what());
    return 1;
}
