// lesson-14-memory_figure — a training step's activation memory against the context length,
// for both attentions: chapter 08's prediction (train/memory_model.h) at every context from 32
// to 1024 (the lines), and measured steps up to --measure-up-to (the points), for the baby GPT
// at batch 12 on the CPU. "Activation memory" is the step's peak less what is resident before
// it (weights, gradients, AdamW's moments, the batch). Prints the table, writes the figure.
//
//   make lesson-14-memory_figure                  # lessons/14-attention/figures/memory.svg
#include <cstdio>
#include <vector>

#include "io/svg.h"             // defines: Svg, Plot
#include "train/cli.h"          // defines: Cli
#include "train/gpt_recipe.h"   // defines: baby_gpt_config, measure_gpt_step
#include "train/memory_model.h" // defines: predict_memory

using namespace kiln;

namespace {

constexpr int64_t kBatch = 12, kVocab = 83;  // lesson-14's batch, Moby-Dick's characters

// The step's predicted activation memory (peak − resident) for attention `kind` at context T.
int64_t predicted(AttentionKind kind, int64_t T) {
    GPTConfig c = baby_gpt_config(kVocab);
    c.attention = kind, c.block_size = T;
    auto model = make_gpt(c, 1);
    model->train();
    const Shape batch{kBatch, T};
    const MemoryPrediction p = predict_memory(*model, {batch, OptimizerKind::Adam, Device::CPU, true, DType::F32, {}, batch});
    return p.allocator_peaks() - p.resident;
}

// The same, measured: a real step's peak, less the prediction's resident bytes (which the test
// of the model checks to the byte).
int64_t measured(AttentionKind kind, int64_t T) {
    GPTConfig c = baby_gpt_config(kVocab);
    c.attention = kind, c.block_size = T;
    auto model = make_gpt(c, 1);
    const Shape batch{kBatch, T};
    const int64_t resident = predict_memory(*model, {batch, OptimizerKind::Adam, Device::CPU, true, DType::F32, {}, batch}).resident;
    return measure_gpt_step(c, kBatch, T, Device::CPU) - resident;
}

double mib(int64_t bytes) { return double(bytes) / double(1 << 20); }

}  // namespace

int main(int argc, char** argv) try {
    std::string out = "lessons/14-attention/figures/memory.svg";
    int64_t measure_up_to = 256;
    Cli cli("lesson-14-memory_figure", "Draws a GPT step's activation memory against the context, textbook and flash attention.");
    cli.add("--out", &out, "the figure's file");
    cli.add("--measure-up-to", &measure_up_to, "measure real steps at contexts up to this (powers of two from 32)", Cli::at_least(0));
    cli.parse(argc, argv);

    const AttentionKind kinds[2] = {AttentionKind::Textbook, AttentionKind::Flash};
    const char* colours[2] = {"#d62728", "#1f77b4"};
    std::vector<double> Ts;
    std::vector<double> lines[2];
    for (int64_t T = 32; T <= 1024; T += 32) {
        Ts.push_back(double(T));
        for (int k = 0; k < 2; k++) lines[k].push_back(mib(predicted(kinds[k], T)));
    }
    std::printf("context  attention  predicted  measured\n");
    std::vector<double> points_T[2], points[2];
    for (int64_t T = 32; T <= 1024; T *= 2)
        for (int k = 0; k < 2; k++) {
            const double p = mib(predicted(kinds[k], T));
            std::printf("%7lld  %-9s  %7.1f MiB", (long long)T, attention_kind_name(kinds[k]), p);
            if (T <= measure_up_to) {
                const double m = mib(measured(kinds[k], T));
                points_T[k].push_back(double(T)), points[k].push_back(m);
                std::printf("  %7.1f MiB", m);
            }
            std::printf("\n");
        }

    Svg svg(640, 400);
    Plot plot(svg, {80, 40, 520, 300}, {0, 1024}, {0, lines[0].back() * 1.05});
    plot.axes("context length T (characters)", "activation memory of a step (MiB)");
    for (int k = 0; k < 2; k++) {
        svg.polyline(plot.points(Ts, lines[k]), colours[k], 2);
        for (size_t i = 0; i < points[k].size(); i++) {
            const Point c = plot.at(points_T[k][i], points[k][i]);
            svg.rect({c.x - 4, c.y - 4, 8, 8}, colours[k]);
        }
    }
    plot.legend({{"textbook (predicted; squares measured)", colours[0]}, {"flash (predicted; squares measured)", colours[1]}});
    svg.text({320, 24}, "Baby GPT (4 layers, 128 channels, 4 heads), batch 12, f32, CPU", 14, Anchor::Middle);
    svg.save(out);
    std::printf("wrote %s\n", out.c_str());
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-14-memory_figure: %s\n", e.what());
    return 1;
}
