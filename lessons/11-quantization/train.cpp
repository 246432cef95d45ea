// lesson-11 — int8 post-training quantization: a trained network's weights and activations in 8
// bits, integer kernels, and what that buys (4× smaller, faster) and costs (accuracy).
//
//   make lesson-11                                  # LeNet: trained here (chapter 03's recipe), then int8
//   make lesson-11 ARGS='--from runs/lesson-03/last.safetensors'          # a LeNet lesson-03 trained
//   make lesson-11 ARGS='--model cifar --from runs/lesson-06/last.safetensors'   # chapter 06's net
//   make lesson-11 ARGS='--model cifar --from ... --qat-epochs 1'         # + quantization-aware training
//   make lesson-11 ARGS='--model mobilenet --from runs/lesson-13-mobilenet/last.safetensors'   # chapter 13's
//
// The steps, each printed with what it gives:
//   1. the f32 model: trained here or loaded (--from; MobileNetV2, hours to train, is only
//      loaded); its test accuracy and inference speed
//   2. batch norm folded into the convolutions (quant/fold.h): the same accuracy
//   3. calibration: --calib-batches training batches through the model with observers on every
//      layer's output (quant/qmodel.h Calibrator; --observer histogram|minmax|moving)
//   4. conversion to int8 (convert), its steps, its test accuracy and speed, and which int8
//      kernel ran (ops/cpu/qgemm.h: avx512-vnni, avx-vnni, avx2-maddubs, avx2-madd, portable)
//   5. both models saved (f32.safetensors, int8.safetensors in --save DIR or runs/lesson-11/)
//      and their sizes; the int8 file loaded back gives the same logits
//   6. histogram.svg: the output of the first layer whose range an int8 step takes (or --histogram
//      LAYER's) as the histogram observer saw it, with the clip range it chose: the step's scale
//   7. with --qat-epochs N: quantization-aware fine-tuning (quant/qat.h), converted again with
//      the ranges it was fine-tuned with, against step 4
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <sys/stat.h>

#include "core/allocator.h"       // defines: BumpAllocator
#include "core/cpu_features.h"    // defines: cpu_features_line
#include "nn/models.h"            // defines: lenet, cifar_net, mobilenet_v2
#include "ops/quant.h"            // defines: int8_kernel_path
#include "optim/optimizer.h"      // defines: SGD
#include "quant/fold.h"           // defines: fold_batchnorm
#include "quant/histogram_svg.h"  // defines: histogram_svg
#include "quant/qat.h"            // defines: QuantAwareTraining
#include "quant/qmodel.h"         // defines: Calibrator, convert, QuantizedNet, QuantizedModule
#include "train/checkpoint.h"     // defines: read_safetensors, load_model, save_model, write_safetensors
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/evaluate.h"       // defines: evaluate_timed
#include "train/fit.h"            // defines: MnistData, CifarData, only_measure, fit, report
#include "train/run_log.h"        // defines: run_info (the run's folder)

using namespace kiln;

namespace {

struct Options {
    std::string model = "lenet", from, observer = "histogram", reduce_range = "auto";
    std::string histogram;  // the layer whose output histogram.svg shows; "": the first
    int calib_batches = 32, qat_epochs = 0;
    float qat_lr = 0.001f, width = 1.0f;  // width: MobileNetV2's multiplier
};

double file_kib(const std::string& path) {
    struct stat st {};
    KILN_CHECK(::stat(path.c_str(), &st) == 0, "cannot stat ", path);
    return double(st.st_size) / 1024.0;
}

// Step 3: the observers see `batches` training batches.
void calibrate(Calibrator& cal, DataLoader& train, int batches) {
    train.start_epoch(0);
    Batch b;
    for (int i = 0; i < batches && train.next(b); i++) cal.run(b.x);
}

// The int8 network's test accuracy and speed, printed with `label`.
TimedAccuracy score_int8(const QuantizedNet& q, DataLoader& test, const char* label) {
    QuantizedModule int8(q);
    const TimedAccuracy scored = evaluate_timed(int8, test);
    std::printf("%s: test accuracy %.2f%%, inference %.0f img/s\n", label, 100 * scored.acc, scored.images_per_second);
    return scored;
}

// Steps 3 and 4: calibrate, convert.
QuantizedNet calibrate_and_convert(Module& model, const QuantConfig& config, DataLoader& train, int batches) {
    Calibrator cal(model, config);
    calibrate(cal, train, batches);
    return convert(model, cal);
}

// Step 6: a layer's output as its histogram observer saw it: `layer`, or by default the first
// whose range an int8 step takes (a conv's fused ReLU, not the conv's own output), so that the
// figure's scale and zero point are that step's.
void save_histogram(Module& model, const QuantizedNet& q, const QuantConfig& config, DataLoader& train, int batches,
                    std::string layer, const std::string& path) {
    if (config.activations != QuantConfig::Observer::Histogram) return;
    Calibrator cal(model, config);
    calibrate(cal, train, batches);
    for (const auto& step : q.steps)
        if (layer.empty() && step->new_range && !step->range_layer.empty()) layer = step->range_layer;
    const auto& obs = static_cast<const HistogramObserver&>(cal.observer(layer));
    histogram_svg(obs, layer + " output over " + std::to_string(batches) + " calibration batches").save(path);
    std::printf("wrote %s\n", path.c_str());
}

// Step 5: the two files, their sizes, and the int8 one read back.
void save_both(Module& model, const QuantizedNet& q, const std::string& dir, const Tensor& probe) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    KILN_CHECK(!error, "cannot create the folder ", dir, ": ", error.message());
    StateDict f32;
    save_model(f32, model);
    write_safetensors(dir + "/f32.safetensors", f32);
    q.save(dir + "/int8.safetensors");
    const double a = file_kib(dir + "/f32.safetensors"), b = file_kib(dir + "/int8.safetensors");
    QuantizedNet back = QuantizedNet::load(dir + "/int8.safetensors");
    back.to(q.device());
    const Tensor l1 = q.forward(probe).to(Device::CPU), l2 = back.forward(probe).to(Device::CPU);
    const bool same = std::memcmp(l1.data<float>(), l2.data<float>(), l1.nbytes()) == 0;
    std::printf("files: f32 (folded) %.1f KiB, int8 %.1f KiB (%.1f%%, %.2fx smaller); int8 file loaded back: %s\n", a,
                b, 100 * b / a, a / b, same ? "the same logits, bit for bit" : "DIFFERENT logits");
}

int run(CommonFlags& flags, const Options& o) {
    const Device device = flags.apply();
    const auto start = std::chrono::steady_clock::now();
    const bool cifar = o.model != "lenet";  // the CIFAR net or MobileNetV2
    std::optional<MnistData> mnist;
    std::optional<CifarData> cifar_data;
    if (cifar) cifar_data.emplace(flags, device); else mnist.emplace(flags, device);
    DataLoader& train = cifar ? cifar_data->train : mnist->train;
    DataLoader& test = cifar ? cifar_data->test : mnist->test;
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = o.model == "mobilenet" ? mobilenet_v2(rng, 10, o.width)
                                      : cifar                ? cifar_net(rng, {32, 64, 128})
                                                             : lenet(rng);
    Sequential& model = *net;
    model.to(device);
    flags.apply_memory_limit(device);  // --mem-limit, now that the model exists (its optimizer's state comes under it)
    if (!o.histogram.empty()) {
        bool found = false;
        for (auto& [name, m] : model.named_modules()) found = found || name == o.histogram;
        KILN_USAGE_CHECK(found, "--histogram ", o.histogram, ": no such layer in the model (names as in the int8 "
                   "steps lesson-11 prints, e.g. block3b or block3b.body.project.conv)");
    }

    // 1. the f32 model
    if (o.from.empty()) {
        std::printf("lesson-11: %s trained here first (%d epochs; --from a checkpoint skips this)\n",
                    cifar ? "chapter 06's CIFAR net" : "LeNet", flags.epochs);
        SGD sgd(model.parameters(), flags.lr,
                cifar ? SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov()
                      : SGD::Options{}.with_momentum(0.9f));
        if (only_measure(model, sgd, train, flags, &arena)) return 0;  // --find-batch-size, --time-report
        fit(model, sgd, train, test, flags, &arena);
    } else {
        load_model(read_safetensors(o.from), model);
    }
    const TimedAccuracy f32 = evaluate_timed(model, test, &arena);
    std::printf("f32:    %lld parameters, test accuracy %.2f%%, inference %.0f img/s\n",
                (long long)model.num_parameters(), 100 * f32.acc, f32.images_per_second);

    // 2. batch norm folded
    const auto folded = fold_batchnorm(model);
    if (!folded.empty())
        std::printf("folded: %zu batch norms into their convolutions, test accuracy %.2f%%\n", folded.size(),
                    100 * evaluate_timed(model, test, &arena, 1).acc);

    // 3, 4. calibration and conversion
    QuantConfig config;
    config.activations = parse_observer(o.observer);
    config.reduce_range = o.reduce_range == "on" || (o.reduce_range == "auto" && reduced_range_is_faster(device));
    std::printf("int8 kernels: %s, activations in [0, %d] (--reduce-range %s); %s\n",
                int8_kernel_path(device, config.act_qmax()), config.act_qmax(), o.reduce_range.c_str(),
                cpu_features_line().c_str());
    QuantizedNet q = calibrate_and_convert(model, config, train, o.calib_batches);
    const TimedAccuracy ptq = score_int8(q, test, "int8");
    std::printf("%s", q.summary().c_str());
    // the speed paired (f32, int8, f32, ...) in CPU seconds: the rates above are wall seconds, taken
    // minutes apart, which on a machine others share say more about the others than about int8
    QuantizedModule int8(q);
    const double speedup = paired_speedup(model, &arena, int8, &arena, test);
    std::printf("int8 against f32: %+.2f points, %.2fx the speed of the folded f32 model (paired, CPU seconds; "
                "%s observer, %d calibration batches)\n",
                100 * (ptq.acc - f32.acc), speedup, o.observer.c_str(), o.calib_batches);

    // 5, 6. the files and the figure
    const std::string dir = run_info(flags).dir;
    Batch probe;
    test.start_epoch(0);
    test.next(probe);
    save_both(model, q, dir, probe.x);
    save_histogram(model, q, config, train, o.calib_batches, o.histogram, dir + "/histogram.svg");

    // 7. quantization-aware training
    double final_acc = ptq.acc;
    if (o.qat_epochs > 0) {
        QuantAwareTraining qat(model, q, config);
        SGD sgd(model.parameters(), o.qat_lr,
                SGD::Options{}.with_momentum(0.9f).with_weight_decay(cifar ? 5e-4f : 0.0f).with_nesterov(cifar));
        TrainOptions opt;
        opt.epochs = o.qat_epochs;
        opt.arena = &arena;
        std::printf("quantization-aware training: %d epochs at lr %g\n", o.qat_epochs, o.qat_lr);
        fit(model, sgd, train, test, opt);
        qat.finish();
        const TimedAccuracy tuned = score_int8(convert(model, qat.range_of()), test, "int8 after QAT");
        std::printf("QAT against post-training int8: %+.2f points (f32 %.2f%%, PTQ %.2f%%, QAT %.2f%%)\n",
                    100 * (tuned.acc - ptq.acc), 100 * f32.acc, 100 * ptq.acc, 100 * tuned.acc);
        final_acc = tuned.acc;
    }
    report(flags, device, final_acc, start);
    return 0;
}

}  // namespace

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 12;  // chapter 03's recipe for LeNet
    flags.lr = 0.05f;
    Options o;
    Cli cli("lesson-11", "Quantizes a trained network to int8 and measures its size, accuracy and speed.");
    flags.add_to(cli);
    cli.add("--model", &o.model, "lenet (chapter 03's), cifar (chapter 06's net) or mobilenet (chapter 13's MobileNetV2)",
            {"lenet", "cifar", "mobilenet"});
    cli.add("--width", &o.width, "mobilenet: the width multiplier it was trained with", Cli::positive());
    cli.add("--from", &o.from, "the trained f32 model: a lesson-03 (lenet), lesson-06 (cifar) or lesson-13-mobilenet "
            "checkpoint; else trained here (not mobilenet)");
    cli.add("--observer", &o.observer, "activation ranges: histogram (L2-optimal clipping), minmax or moving",
            {"histogram", "minmax", "moving"});
    cli.add("--calib-batches", &o.calib_batches, "training batches the observers see", Cli::at_least(1));
    cli.add("--histogram", &o.histogram, "the layer whose output histogram.svg shows (default: the first whose range an "
            "int8 step takes: a conv's fused ReLU)");
    cli.add("--reduce-range", &o.reduce_range, "activations in [0, 127]: auto (when the CPU's int8 path is faster so), on, off",
            {"auto", "on", "off"});
    cli.add("--qat-epochs", &o.qat_epochs, "epochs of quantization-aware fine-tuning after post-training quantization "
            "(0: none; a step keeps the f32 step's activations and the fake quantizers' masks)", Cli::at_least(0));
    cli.add("--qat-lr", &o.qat_lr, "learning rate of the quantization-aware fine-tuning", Cli::positive());
    if (command_line_has(argc, argv, "--model", "cifar")) {  // chapter 06's settings, before the command line may change them
        flags.batch_size = 128;
        flags.data = "data/cifar10";
        flags.epochs = 10;
    }
    if (command_line_has(argc, argv, "--model", "mobilenet")) {  // lesson-13-mobilenet's data and batch
        flags.batch_size = 128;
        flags.data = "data/cifar10-png";
    }
    cli.parse(argc, argv);
    KILN_USAGE_CHECK(o.model != "mobilenet" || !o.from.empty(), "--model mobilenet needs --from: the checkpoint of a "
                     "lesson-13-mobilenet run with --save DIR (DIR/last.safetensors); training it takes hours");
    KILN_USAGE_CHECK(o.model != "mobilenet" || o.qat_epochs == 0, "--qat-epochs: quantization-aware training of residual "
                     "nets such as MobileNetV2 is not written (quant/qat.h); post-training int8 is");
    KILN_USAGE_CHECK(o.qat_epochs > 0 || !cli.given("--qat-lr"), "--qat-lr is the quantization-aware fine-tuning's; "
                     "add --qat-epochs N");
    // --from loads the f32 model: the flags that shape its training do not apply
    if (!o.from.empty())
        flags.refuse_training_flags("--from loads the trained f32 model (--qat-epochs N fine-tunes the int8 one)" +
                                    std::string(o.model == "mobilenet" ? "; lesson-13-mobilenet trains and measures MobileNetV2" : ""));
    return run(flags, o);
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-11: %s\n", e.what());
    return 1;
}
