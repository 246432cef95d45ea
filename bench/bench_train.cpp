// bench_train.cpp — training throughput of the chapters' models on the CPU (images/second),
// on random inputs of the real shapes (the data pipeline is not what is measured).
//
//   build/bench/bench_train            prints "bench mlp_train_cpu: 21000 img/s", ...
//   mlp_params, lenet_params, ...        each chapter model's parameters (bench/run.sh checks
//                        that PyTorch's twin has as many)
//   mlp_train_cpu        chapter 02's MLP, batch 64 (compare: bench/torch_train.py mlp)
//   lenet_train_cpu      chapter 03's LeNet, batch 64 (compare: bench/torch_lenet.py)
//   cifar_net_train_cpu  chapter 06's network at widths 64/256/256 (the capstone's), batch 256,
//                        SGD Nesterov (compare: bench/torch_train.py cifar_net)
//   lenet_train_cpu_f16, _bf16, cifar_net_train_cpu_f16, _bf16
//                        the same in mixed precision (chapter 09: autocast, and with f16 a
//                        GradScaler), then their ratio to f32 ("..._vs_f32")
//   mobilenet_v2_train_cpu
//                        chapter 13's MobileNetV2 (width 1.0), batch 128, SGD Nesterov
//                        (compare: bench/torch_train.py mobilenet_v2)
//   cifar_net_l06_*      chapter 10: lesson 06's CIFAR net (widths 32, 64, 128, stem 24), batch
//                        128 (compare: bench/torch_train.py cifar_net:32,64,128), against its
//                        twin with half the channels of every conv removed by
//                        remove_channels (nn/surgery.h): parameters, a training step's peak
//                        memory (chapter 08's prediction), training and inference img/s of
//                        each (the two measured in turn, 5 times), and the speedups
//                        ("..._speedup", the median of the 5 ratios, with their _min and _max)
//   cifar_net_train_cpu_im2col, _winograd, _winograd_speedup
//                        the CIFAR net with every conv by im2col (as KILN_CONV=im2col) and with
//                        its big 3×3 layers by Winograd (chapter 03), in turn, 5 times: the
//                        medians, and of the 5 ratios (with their _min and _max)
//   gpt_params, gpt_train_cpu
//                        chapter 14's baby GPT (nanoGPT's: 4 layers, 4 heads, 128 channels,
//                        context 64), batch 12, lesson-14's AdamW and clipping, on random ids of
//                        Moby-Dick's 83 characters: training tokens a second (compare:
//                        bench/torch_gpt.py --bench)
//   build/bench/bench_train gpt        only the gpt_* figures
//   build/bench/bench_train surgery    only the cifar_net_l06_* figures
//   build/bench/bench_train f32 SUFFIX
//                        every chapter model (the GPT too) in f32 only, named MODEL_train_cpu SUFFIX: bench/run.sh
//                        runs it as "f32 _busy" while another program keeps one core busy (a
//                        learner's machine is rarely idle) and, on a CPU with AVX-512, as
//                        "f32 _avx2" with KILN_CPU=avx2 (what a learner's AVX2 CPU would run)
//   build/bench/bench_train cuda [quick]
//                        the chapter models that train on a GPU (04-12), on the CUDA device, in
//                        f32 and under --amp bf16's autocast: "bench NAME_train_cuda: X img/s",
//                        "..._cuda_bf16", "NAME_params", and a "model NAME: ..." line naming the
//                        network, its batch and its chapters; scripts/gpu-check.sh sets them beside
//                        PyTorch's twins (bench/torch_train_gpu.py) in a table. quick: 1 step at
//                        a batch of 2 (the check's dry run, on the emulator)
//   build/bench/bench_train attention-cuda [quick]
//                        chapter 14's causal self-attention alone on the CUDA device, kiln's
//                        FlashAttention-2 and textbook kernels, f32 and bf16, GPT-2 small's heads
//                        (12 of 64 channels), batch 8, contexts 256, 512, 1024: "bench
//                        attention_KIND_DTYPE_T256_fwd: X ms" (a forward) and "..._fwdbwd" (forward +
//                        backward); scripts/gpu-check.sh sets them beside PyTorch's
//                        scaled_dot_product_attention (bench/torch_attention_gpu.py). quick: batch
//                        1, 2 heads, context 64, one call (the dry run)
// Threads: OMP_NUM_THREADS (make bench sets 2). The figure is the median of 5 timed rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda_memory.h"
#include "nn/conv.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/surgery.h"
#include "ops/attention.h"
#include "ops/autocast.h"
#include "ops/cpu/winograd.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "train/gpt_recipe.h"
#include "train/loop.h"
#include "train/memory_model.h"

using namespace kiln;

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Median images/second of `rounds` rounds of `steps` calls of step, each on a batch of B images,
// after `warmup` untimed calls (caches, page faults, thread pool). On a CUDA device each round
// ends when the device has finished its kernels (launches return before the kernels run).
static double median_rate(int64_t B, int steps, int rounds, const std::function<void()>& step,
                          Device device = Device::CPU, int warmup = 3) {
    const auto finish = [&] {
        if (device == Device::CUDA) cuda::synchronize();
    };
    for (int i = 0; i < warmup; i++) step();
    finish();
    std::vector<double> rates;
    for (int r = 0; r < rounds; r++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; i++) step();
        finish();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(double(B) * steps / s);
    }
    return median(rates);
}

// Median images/second of `rounds` rounds of `steps` training steps at batch B, with the SGD
// settings of the PyTorch script it is compared with; amp f16 or bf16: under autocast (f16 with
// a GradScaler), as --amp trains; on `device` (the model is moved there), after `warmup` steps.
static double train_throughput(Module& model, const Shape& input, int64_t classes, int steps, int rounds,
                               SGD::Options options, DType amp = DType::F32, Device device = Device::CPU,
                               int warmup = 3) {
    Rng rng(0);
    int64_t B = input[0];
    Tensor x = Tensor::normal(input, 0, 1, rng).to(device);
    Tensor y = Tensor::empty({B}, DType::I32);
    for (int64_t i = 0; i < B; i++) y.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(classes)));
    y = y.to(device);
    model.to(device);
    model.input_needs_grad = false;  // as train_epoch (and PyTorch: the input has no requires_grad)
    SGD sgd(model.parameters(), 0.01f, options);
    CrossEntropyLoss criterion;
    BumpAllocator arena("bench arena", device, size_t(1) << 30);
    GradScaler scaler(GradScaler::Options{65536.0f, 2.0, 0.5, 2000, amp == DType::F16});
    auto step = [&] {
        {
            std::optional<AutocastScope> autocast;
            if (amp != DType::F32) autocast.emplace(amp);
            AllocatorScope scope(arena);
            sgd.zero_grad();
            criterion.forward(model.forward(x), y);
            model.backward(criterion.backward(scaler.loss_scale()));
        }
        scaler.step(sgd, model);  // disabled (f32, bf16): the optimizer's step
        scaler.update();
        arena.reset();
    };
    return median_rate(B, steps, rounds, step, device, warmup);
}

// The chapter models as bench/torch_train.py and bench/torch_lenet.py train them: batch size
// (input[0]), SGD settings, and how many training steps a timed round takes.
struct ChapterModel {
    std::string name;
    std::function<std::unique_ptr<Sequential>()> build;  // from the same seed each time
    Shape input;
    int steps;
    SGD::Options sgd;
};
// The chapters' SGD settings: momentum 0.9 (04, 05, 10-12), Nesterov with weight decay (06-09).
static const SGD::Options momentum = SGD::Options{}.with_momentum(0.9f),
                          nesterov = SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov();
static const std::vector<ChapterModel>& chapter_models() {
    static const SGD::Options lenet_sgd = SGD::Options{}.with_momentum(0.5f);
    static const std::vector<ChapterModel> models{
        {"mlp", [] { Rng r(1); return mlp(r); }, {64, 1, 28, 28}, 100, momentum},
        {"lenet", [] { Rng r(1); return lenet(r); }, {64, 1, 28, 28}, 40, lenet_sgd},
        {"cifar_net_l06", [] { Rng r(1); return cifar_net(r, {32, 64, 128}); }, {128, 3, 32, 32}, 4, nesterov},
        {"cifar_net", [] { Rng r(1); return cifar_net(r); }, {256, 3, 32, 32}, 2, nesterov},
        {"mobilenet_v2", [] { Rng r(1); return mobilenet_v2(r, 10, 1.0f); }, {128, 3, 32, 32}, 2, nesterov},
    };
    return models;
}
// The chapter models whose trainers take --device cuda (04-12), as those trainers build them,
// with the chapters that train each one and the steps of a timed round on a GPU.
struct GpuModel {
    ChapterModel model;
    std::string what, chapters;
    int gpu_steps;
};
static const std::vector<GpuModel>& gpu_models() {
    static const std::vector<GpuModel> models{
        {{"mlp", [] { Rng r(1); return mlp(r); }, {64, 1, 28, 28}, 0, momentum}, "MLP 784-512-256-10", "04", 200},
        {{"lenet", [] { Rng r(1); return lenet(r); }, {64, 1, 28, 28}, 0, momentum}, "LeNet", "05 11 12", 200},
        {{"mlp_300_100", [] { Rng r(1); return mlp(r, 300, 100); }, {64, 1, 28, 28}, 0, momentum},
         "LeNet-300-100 (MLP 784-300-100-10)", "10", 200},
        {{"cifar_net_l06", [] { Rng r(1); return cifar_net(r, {32, 64, 128}); }, {128, 3, 32, 32}, 0, nesterov},
         "CIFAR net 32/64/128", "06 08 09 10", 50},
        {{"cifar_net_l07", [] { Rng r(1); return cifar_net(r, {48, 96, 192}); }, {128, 3, 32, 32}, 0, nesterov},
         "CIFAR net 48/96/192", "07", 40},
        {{"cifar_net", [] { Rng r(1); return cifar_net(r); }, {256, 3, 32, 32}, 0, nesterov},
         "CIFAR net 64/256/256 (the capstone's widths)", "12 13", 20},
        {{"mobilenet_v2", [] { Rng r(1); return mobilenet_v2(r, 10, 1.0f); }, {128, 3, 32, 32}, 0, nesterov},
         "MobileNetV2 (width 1.0: depthwise convolutions)", "13", 20},
    };
    return models;
}

// Each GPU model in f32 and bf16 on the CUDA device, 5 rounds of gpu_steps steps after 3 (quick:
// one step at batch 2 and no warm-up, enough to run every kernel once).
static void bench_cuda(bool quick) {
    for (const GpuModel& g : gpu_models()) {
        const ChapterModel& m = g.model;
        Shape input = m.input;
        if (quick) input.dims[0] = 2;
        std::printf("model %s: %s, batch %lld, chapters %s\n", m.name.c_str(), g.what.c_str(), (long long)input[0],
                    g.chapters.c_str());
        std::printf("bench %s_params: %lld parameters\n", m.name.c_str(), (long long)m.build()->num_parameters());
        for (DType amp : {DType::F32, DType::BF16}) {
            auto model = m.build();
            const double rate = train_throughput(*model, input, 10, quick ? 1 : g.gpu_steps, quick ? 1 : 5, m.sgd, amp,
                                                 Device::CUDA, quick ? 0 : 3);
            std::printf("bench %s_train_cuda%s: %.1f img/s\n", m.name.c_str(), amp == DType::F32 ? "" : "_bf16", rate);
            std::fflush(stdout);
        }
    }
}

// Chapter 14's attention op alone on the CUDA device (the header above): the median of 3 rounds
// of 3 calls after one, in ms a call; quick: one call.
static void bench_attention_cuda(bool quick) {
    const int64_t B = quick ? 1 : 8, H = quick ? 2 : 12, D = 64, C = H * D;
    const std::vector<int64_t> contexts = quick ? std::vector<int64_t>{64} : std::vector<int64_t>{256, 512, 1024};
    std::printf("attention: batch %lld, %lld heads of %lld channels, causal, no dropout\n", (long long)B, (long long)H,
                (long long)D);
    for (DType dtype : {DType::F32, DType::BF16})
        for (int64_t T : contexts) {
            Rng rng(T);
            const Tensor qkv = Tensor::normal({B, T, 3 * C}, 0, 1, rng).to(dtype).to(Device::CUDA);
            const Tensor dy = Tensor::normal({B, T, C}, 0, 1, rng).to(dtype).to(Device::CUDA);
            for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::Textbook}) {
                const auto forward = [&] {
                    Tensor saved;
                    return std::make_pair(causal_self_attention(qkv, H, kind, {}, &saved), saved);
                };
                const auto both = [&] {
                    const auto [y, saved] = forward();
                    causal_self_attention_backward(qkv, y, saved, dy, H, kind, {});
                };
                const int calls = quick ? 1 : 3, rounds = quick ? 1 : 3, warmup = quick ? 0 : 1;
                const std::string name = std::string("attention_") + attention_kind_name(kind) + "_" + dtype_name(dtype) +
                                         "_T" + std::to_string(T);
                const double fwd = 1e3 / median_rate(1, calls, rounds, [&] { forward(); }, Device::CUDA, warmup);
                const double fwdbwd = 1e3 / median_rate(1, calls, rounds, both, Device::CUDA, warmup);
                std::printf("bench %s_fwd: %.3f ms\nbench %s_fwdbwd: %.3f ms\n", name.c_str(), fwd, name.c_str(), fwdbwd);
                std::fflush(stdout);
            }
        }
}

static const ChapterModel& chapter_model(const std::string& name) {
    for (const ChapterModel& m : chapter_models())
        if (m.name == name) return m;
    KILN_FAIL("bench_train: no chapter model \"", name, "\"");
}

// "bench NAME_train_cpu<suffix>: X img/s", the model trained in f32; returns X.
static double bench_f32(const ChapterModel& m, const std::string& suffix = "") {
    auto model = m.build();
    const double rate = train_throughput(*model, m.input, 10, m.steps, 5, m.sgd);
    std::printf("bench %s_train_cpu%s: %.1f img/s\n", m.name.c_str(), suffix.c_str(), rate);
    std::fflush(stdout);
    return rate;
}

// The model in f32, f16 and bf16 (each from the same initial weights), and each low type's ratio to f32.
static void bench_precisions(const ChapterModel& m) {
    const double f32 = bench_f32(m);
    for (DType amp : {DType::F16, DType::BF16}) {
        auto model = m.build();
        const double rate = train_throughput(*model, m.input, 10, m.steps, 5, m.sgd, amp);
        std::printf("bench %s_train_cpu_%s: %.1f img/s\n", m.name.c_str(), dtype_name(amp), rate);
        std::printf("bench %s_train_cpu_%s_vs_f32: %.2f ratio\n", m.name.c_str(), dtype_name(amp), rate / f32);
        std::fflush(stdout);
    }
}

// Median images/second of `rounds` rounds of `steps` forward passes at batch B in eval mode under
// a NoGradScope, as evaluate() runs them.
static double infer_throughput(Module& model, const Shape& input, int steps, int rounds) {
    Rng rng(0);
    Tensor x = Tensor::normal(input, 0, 1, rng);
    BumpAllocator arena("bench arena", Device::CPU, size_t(1) << 30);
    NoGradScope no_grad;
    model.eval();
    auto step = [&] {
        {
            AllocatorScope scope(arena);
            model.call(x);
        }
        arena.reset();
    };
    return median_rate(input[0], steps, rounds, step);
}

// Two measurements taken in turn, `pairs` times (a, b, a, b, ...), so that a change in the
// load of a shared machine falls on both alike: the median of each, and of the pairs' ratios
// b/a with their smallest and largest (the noise).
struct InTurn {
    double a, b, ratio, ratio_min, ratio_max;
};
static InTurn in_turn(int pairs, const std::function<double()>& a, const std::function<double()>& b) {
    std::vector<double> as, bs, ratios;
    for (int i = 0; i < pairs; i++) {
        as.push_back(a());
        bs.push_back(b());
        ratios.push_back(bs.back() / as.back());
    }
    const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
    return {median(as), median(bs), median(ratios), *lo, *hi};
}

// The two figures a and b (img/s) named a_name and b_name, and b's speedup over a as
// speedup_name with its _min and _max.
static void print_in_turn(const std::string& a_name, const std::string& b_name, const std::string& speedup_name,
                          const InTurn& m) {
    std::printf("bench %s: %.0f img/s\n", a_name.c_str(), m.a);
    std::printf("bench %s: %.0f img/s\n", b_name.c_str(), m.b);
    std::printf("bench %s: %.2f ratio\n", speedup_name.c_str(), m.ratio);
    std::printf("bench %s_min: %.2f ratio\n", speedup_name.c_str(), m.ratio_min);
    std::printf("bench %s_max: %.2f ratio\n", speedup_name.c_str(), m.ratio_max);
    std::fflush(stdout);
}

// "bench gpt_train_cpu<suffix>: X tok/s": chapter 14's baby GPT trained as lesson-14 trains it,
// on random ids (the data pipeline is not what is measured), 5 rounds of 10 steps after 3.
static void bench_gpt(const std::string& suffix = "") {
    const int64_t B = 12, V = 83;  // Moby-Dick's characters
    const GPTConfig c = baby_gpt_config(V);
    auto model = make_gpt(c, 1);
    const GPTRecipe recipe;
    auto opt = gpt_optimizer(*model, recipe);
    Rng rng(0);
    Tensor x = Tensor::empty({B, c.block_size}, DType::I32), y = x.clone();
    for (Tensor* t : {&x, &y})
        for (int64_t i = 0; i < t->numel(); i++) t->data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(V)));
    BumpAllocator arena("bench arena", Device::CPU);
    const StepOptions options{&arena, recipe.clip};
    if (suffix.empty()) std::printf("bench gpt_params: %lld parameters\n", (long long)model->num_parameters());
    const double rate = median_rate(B * c.block_size, 10, 5, [&] { train_step(*model, *opt, x, y, options); });
    std::printf("bench gpt_train_cpu%s: %.0f tok/s\n", suffix.c_str(), rate);
    std::fflush(stdout);
}

// Lesson 06's CIFAR net, and the same net after structured pruning has removed half the output
// channels of every conv (here the first half is kept: which half does not change the speed).
static void bench_surgery() {
    const ChapterModel& l06 = chapter_model("cifar_net_l06");
    const Shape& input = l06.input;
    auto dense = l06.build(), cut = l06.build();
    std::vector<std::string> convs;
    for (auto& [path, m] : cut->named_modules())
        if (dynamic_cast<Conv2d*>(m)) convs.push_back(path);
    for (const std::string& path : convs) {
        std::vector<int64_t> keep(size_t(static_cast<Conv2d&>(cut->module_at(path)).out_channels / 2));
        for (size_t i = 0; i < keep.size(); i++) keep[i] = int64_t(i);
        remove_channels(*cut, path, keep);
    }
    std::printf("bench cifar_net_l06_params: %lld parameters\n", (long long)dense->num_parameters());
    std::printf("bench cifar_net_l06_halved_params: %lld parameters\n", (long long)cut->num_parameters());
    // A training step's peak memory (SGD with momentum, activations from the step's arena), as
    // chapter 08's memory model predicts it from the layers' shapes.
    const MemoryModelOptions step{input};
    std::printf("bench cifar_net_l06_train_peak: %.1f MiB\n", double(predict_memory(*dense, step).peak) / (1 << 20));
    std::printf("bench cifar_net_l06_halved_train_peak: %.1f MiB\n", double(predict_memory(*cut, step).peak) / (1 << 20));
    for (const std::string what : {"train", "infer"}) {
        const bool train = what == "train";
        auto rate = [&](Module& m) {
            return train ? train_throughput(m, input, 10, 2, 1, l06.sgd) : infer_throughput(m, input, 8, 1);
        };
        print_in_turn("cifar_net_l06_" + what + "_cpu", "cifar_net_l06_halved_" + what + "_cpu",
                      "cifar_net_l06_halved_" + what + "_speedup",
                      in_turn(5, [&] { return rate(*dense); }, [&] { return rate(*cut); }));
    }
}

// The CIFAR net's training with its big 3×3 layers by Winograd (the default) and with every
// layer by im2col (as KILN_CONV=im2col), in turn (chapter 03).
static void bench_winograd() {
    const ChapterModel& cifar = chapter_model("cifar_net");
    auto net = cifar.build();
    auto rate = [&](bool winograd) {
        cpu::set_winograd_choice(winograd ? cpu::WinogradChoice::Auto : cpu::WinogradChoice::Never);
        const double v = train_throughput(*net, cifar.input, 10, 2, 1, cifar.sgd);
        cpu::set_winograd_choice(cpu::WinogradChoice::Auto);
        return v;
    };
    print_in_turn("cifar_net_train_cpu_im2col", "cifar_net_train_cpu_winograd", "cifar_net_train_cpu_winograd_speedup",
                  in_turn(5, [&] { return rate(false); }, [&] { return rate(true); }));
}

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "cuda") {
        bench_cuda(argc > 2 && std::string(argv[2]) == "quick");
        return 0;
    }
    if (argc > 1 && std::string(argv[1]) == "attention-cuda") {
        bench_attention_cuda(argc > 2 && std::string(argv[2]) == "quick");
        return 0;
    }
    if (argc > 1 && std::string(argv[1]) == "gpt") {
        bench_gpt();
        return 0;
    }
    if (argc > 1 && std::string(argv[1]) == "surgery") {
        bench_surgery();
        return 0;
    }
    if (argc > 2 && std::string(argv[1]) == "f32") {
        for (const ChapterModel& m : chapter_models()) bench_f32(m, argv[2]);
        bench_gpt(argv[2]);
        return 0;
    }
    for (const ChapterModel& m : chapter_models())  // cifar_net_l06's: bench_surgery, beside its halved twin's
        if (m.name != "cifar_net_l06")
            std::printf("bench %s_params: %lld parameters\n", m.name.c_str(), (long long)m.build()->num_parameters());
    bench_f32(chapter_model("mlp"));
    bench_precisions(chapter_model("lenet"));
    bench_precisions(chapter_model("cifar_net"));
    bench_f32(chapter_model("mobilenet_v2"));
    bench_gpt();
    bench_winograd();
    bench_surgery();
    return 0;
}
