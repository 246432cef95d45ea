// lesson-15 — the memory of a large model: one GPU's bytes by category for a transformer of any
// size (train/memory_plan.h), the largest micro-batch that fits a GPU, which ZeRO stage lets a
// model fit where, and the plan checked against kiln's own measured step.
//
//   make lesson-15                                                  # the tables below, all three
//   make lesson-15 ARGS='--plan --model llama-7b --zero 3 --gpus 8'  # one plan, by category
//   make lesson-15 ARGS='--plan --parameters 7500000000 --precision f16 --zero 1 --gpus 64'
//   make lesson-15 ARGS='--fits'      # GPT-2 and LLaMA on 80 and 141 GB GPUs: stage and batch
//   make lesson-15 ARGS='--measure'   # chapter 14's GPT: planned against measured
//   make lesson-15 ARGS='--measure-offload'   # its step on cuda, the optimizer on the GPU and offloaded
//   make lesson-15 ARGS='--figure lessons/15-large-models/figures/stages.svg'
//
// Nothing here trains: the planner is arithmetic, and --measure runs two training steps of
// chapter 14's GPT per line, on random tokens (--measure-offload on the CUDA device: kiln's
// emulator without a GPU, the GPU with make CUDA=1).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/allocator.h"     // defines: parse_bytes, format_bytes
#include "core/cuda_memory.h"   // defines: is_emulated
#include "core/error.h"         // defines: KILN_USAGE_CHECK
#include "dist/cost_model.h"    // defines: reduce_scatter_s, nvlink4, infiniband_ndr
#include "train/cli.h"          // defines: Cli
#include "train/gpt_recipe.h"   // defines: baby_gpt_config, measure_gpt_step
#include "train/memory_plan.h"  // defines: plan_memory, largest_batch, named_transformer, stages_svg, measure_gpt_offload

using namespace kiln;

namespace {

struct Flags {
    bool plan = false, fits = false, measure = false, measure_offload = false, dropout = false, offload = false;
    std::string model = "gpt2", arch = "gpt2", optimizer = "adam", recompute = "none", attention = "flash";
    std::string gpu_memory = "80GB", figure;
    DType precision = DType::BF16;
    int zero = 0;
    int64_t gpus = 1, batch = 1, parameters = 0, layers = 0, width = 0, heads = 0, vocab = 0, context = 0, ffn = 0,
            kv_heads = 0;
    float fragmentation = 0.1f;
};

OptimizerKind optimizer_of(const std::string& name) {
    if (name == "sgd") return OptimizerKind::SGD;
    if (name == "momentum") return OptimizerKind::SGDMomentum;
    return OptimizerKind::Adam;
}

Recompute recompute_of(const std::string& name) {
    if (name == "selective") return Recompute::Selective;
    if (name == "full") return Recompute::Full;
    return Recompute::None;
}

// The named model, with each shape flag the command line gave put over it.
TransformerShape shape_of(const Cli& cli, const Flags& f) {
    TransformerShape t = named_transformer(f.model);
    if (cli.given("--arch")) t.arch = f.arch == "llama" ? Architecture::LLaMA : Architecture::GPT2;
    const std::pair<const char*, std::pair<int64_t*, int64_t>> fields[] = {
        {"--layers", {&t.layers, f.layers}}, {"--width", {&t.width, f.width}},     {"--heads", {&t.heads, f.heads}},
        {"--vocab", {&t.vocab, f.vocab}},    {"--context", {&t.context, f.context}}, {"--ffn", {&t.ffn, f.ffn}},
        {"--kv-heads", {&t.kv_heads, f.kv_heads}}};
    for (const auto& [flag, field] : fields)
        if (cli.given(flag)) *field.first = field.second;
    return t;
}

MemoryPlanOptions options_of(const Cli& cli, const Flags& f) {
    MemoryPlanOptions o;
    o.parameters = f.parameters;
    if (f.parameters == 0 || cli.given("--model")) o.shape = shape_of(cli, f);
    o.batch = f.batch;
    o.precision = f.precision;
    o.optimizer = optimizer_of(f.optimizer);
    o.recompute = recompute_of(f.recompute);
    o.attention = f.attention == "textbook" ? AttentionKind::Textbook : AttentionKind::Flash;
    o.dropout = f.dropout;
    o.zero_stage = f.zero;
    o.gpus = f.gpus;
    o.offload = f.offload;
    o.fragmentation = f.fragmentation;
    return o;
}

double gb(int64_t bytes) { return double(bytes) / 1e9; }

// A number with thousands separators: 1875000000 -> "1,875,000,000".
std::string grouped(int64_t n) {
    std::string digits = std::to_string(n), out;
    for (size_t i = 0; i < digits.size(); i++) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

void print_row(const char* what, int64_t bytes, const char* note = "") {
    std::printf("  %-18s %17s bytes %9.1f GB %10s%s%s\n", what, grouped(bytes).c_str(), gb(bytes),
                format_bytes(bytes).c_str(), *note ? "  " : "", note);
}

// PCIe 5.0 x16, each direction: 32 GT/s × 16 lanes × 128/130 (its line code) / 8 bits = 63.0 GB/s,
// the specification's rate (an H100's or H200's host link); a real copy reaches less.
constexpr double kPcie5x16BytesPerS = 32e9 * 16 * 128.0 / 130.0 / 8;
// PCIe 4.0 x16: 16 GT/s, the same line code: 31.5 GB/s (an A100's host link).
constexpr double kPcie4x16BytesPerS = 16e9 * 16 * 128.0 / 130.0 / 8;

// The step's collectives (communication_bytes) and, with offload, its PCIe traffic, in bytes
// and as the α–β model's least time: a ring inside one node of 8 on NVLink 4, beyond on
// InfiniBand NDR (a flat ring runs at its slowest link).
void print_communication(const MemoryPlanOptions& o) {
    if (o.gpus > 1) {
        const int64_t psi = o.parameters > 0 ? o.parameters : transformer_parameters(o.shape);
        const double whole = double(psi) * (o.precision == DType::F32 ? 4 : 2);
        const Link link = o.gpus <= 8 ? nvlink4() : infiniband_ndr();
        const int collectives = o.zero_stage == 3 ? 3 : 2;
        const double seconds = collectives * reduce_scatter_s(whole, int(o.gpus), link);
        std::printf("each GPU sends a step: %s bytes in %d collectives; at least %.1f ms on %s\n",
                    grouped(communication_bytes(o)).c_str(), collectives, 1e3 * seconds, link.name.c_str());
    }
    if (o.offload) {
        const int64_t each_way = offload_bytes_each_way(o);
        std::printf("over PCIe each way a step: %s bytes; at least %.1f ms at 31.5 GB/s (PCIe 4.0 x16), %.1f ms at "
                    "63.0 GB/s (PCIe 5.0 x16)\n", grouped(each_way).c_str(), 1e3 * double(each_way) / kPcie4x16BytesPerS,
                    1e3 * double(each_way) / kPcie5x16BytesPerS);
    }
}

// --plan: one GPU's memory by category, one layer's activations, the largest micro-batch.
void print_plan(const MemoryPlanOptions& o, const Flags& f) {
    const MemoryPlan p = plan_memory(o);
    const TransformerShape& t = o.shape;
    const int64_t psi = o.parameters > 0 ? o.parameters : transformer_parameters(t);
    std::printf("plan: %s parameters", grouped(psi).c_str());
    if (t.layers > 0)
        std::printf(" (%s: L %lld, h %lld, %lld heads, V %lld, s %lld)", f.model.c_str(), (long long)t.layers,
                    (long long)t.width, (long long)t.heads, (long long)t.vocab, (long long)t.context);
    std::printf(", %s%s, %s, ZeRO stage %d on %lld GPU%s\n", dtype_name(o.precision),
                o.precision == DType::F32 ? "" : " mixed", f.optimizer.c_str(), o.zero_stage, (long long)o.gpus,
                o.gpus == 1 ? "" : "s");
    if (t.layers > 0)
        std::printf("      micro-batch %lld, %s attention, %s, recomputation %s%s\n", (long long)o.batch,
                    attention_kind_name(o.attention), o.dropout ? "dropout" : "no dropout", recompute_name(o.recompute),
                    o.offload ? ", optimizer offloaded" : "");
    std::printf("one GPU holds:\n");
    print_row("parameters", p.parameters);
    print_row("gradients", p.gradients);
    print_row("optimizer state", p.optimizer_state, o.precision == DType::F32 ? "" : "(with the f32 master weights)");
    print_row("model states", p.model_states());
    if (t.layers > 0) {
        print_row("activations", p.activations);
        print_row("temporary buffers", p.temporary);
    }
    print_row("fragmentation", p.fragmentation, "(the slabs' rounding, and the allowance)");
    print_row("total", p.total());
    if (o.offload) print_row("host (offloaded)", p.host);
    print_communication(o);
    if (t.layers == 0) return;
    std::printf("one layer's activations: %s bytes\n",
                grouped(layer_activation_bytes(t, o.batch, o.precision, o.recompute, o.attention, o.dropout)).c_str());
    const int64_t gpu = parse_bytes(f.gpu_memory);
    std::printf("largest micro-batch on a %s GPU: %lld\n", f.gpu_memory.c_str(), (long long)largest_batch(o, gpu));
}

// --fits: for GPT-2's four sizes and LLaMA's, on 80 and 141 GB: the largest micro-batch of each
// stage on the given GPUs (8 unless --gpus says), and the fewest GPUs (a power of two, up to 1024)
// on which each stage fits one sequence.
void print_fits(const Cli& cli, const Flags& f) {
    const char* models[] = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-7b", "llama-13b", "llama-2-70b"};
    const int64_t memories[] = {80'000'000'000, 141'000'000'000};
    MemoryPlanOptions o = options_of(cli, f);
    const int64_t gpus = cli.given("--gpus") ? f.gpus : 8;
    std::printf("what fits: %s%s, %s, %s attention, %s, recomputation %s, fragmentation allowance %.0f%%\n",
                dtype_name(o.precision), o.precision == DType::F32 ? "" : " mixed", f.optimizer.c_str(),
                attention_kind_name(o.attention), o.dropout ? "dropout" : "no dropout", recompute_name(o.recompute),
                100.0 * o.fragmentation);
    std::printf("each model: the largest micro-batch per GPU on %lld GPUs (0: not one sequence), then the fewest GPUs\n"
                "on which one sequence fits (-: not on 1024)\n",
                (long long)gpus);
    std::printf("%-34s | %-27s | %-27s\n", "", "      80 GB, ZeRO stage", "     141 GB, ZeRO stage");
    std::printf("%-12s %14s %6s | %6s %6s %6s %6s | %6s %6s %6s %6s\n", "model", "parameters", "s", "0", "1", "2", "3", "0",
                "1", "2", "3");
    for (const char* name : models) {
        o.shape = named_transformer(name);
        o.parameters = 0;
        std::string batches, fewest;
        for (int64_t memory : memories) {
            batches += " |", fewest += " |";
            for (int stage = 0; stage <= 3; stage++) {
                o.zero_stage = stage;
                o.gpus = gpus;
                batches += " " + std::string(6 - std::min<size_t>(6, std::to_string(largest_batch(o, memory)).size()), ' ') +
                           std::to_string(largest_batch(o, memory));
                for (o.gpus = 1; o.gpus <= 1024 && largest_batch(o, memory) == 0; o.gpus *= 2) {}
                const std::string n = o.gpus <= 1024 ? std::to_string(o.gpus) : "-";
                fewest += " " + std::string(6 - std::min<size_t>(6, n.size()), ' ') + n;
            }
        }
        std::printf("%-12s %14s %6lld%s\n", name, grouped(transformer_parameters(o.shape)).c_str(),
                    (long long)o.shape.context, batches.c_str());
        std::printf("%-34s%s\n", "  fewest GPUs for one sequence", fewest.c_str());
    }
}

// --measure: chapter 14's GPT at two sizes, both attentions, with and without recomputation: the
// plan's total against the allocators' peaks of a real training step on the CPU.
void print_measured() {
    struct Size { int64_t layers, width, heads, context, batch; };
    std::printf("chapter 14's GPT, f32 AdamW, one steady training step on the CPU: planned and measured\n");
    std::printf("%-26s %-9s %-9s %10s %10s %7s\n", "model", "attention", "recompute", "planned", "measured", "error");
    for (const Size z : {Size{4, 128, 4, 64, 12}, Size{2, 192, 6, 128, 4}})
        for (AttentionKind kind : {AttentionKind::Textbook, AttentionKind::Flash})
            for (bool recompute : {false, true}) {
                GPTConfig c = baby_gpt_config(83);
                c.n_layer = z.layers, c.n_embd = z.width, c.n_head = z.heads, c.block_size = z.context;
                c.attention = kind, c.recompute = recompute;
                const int64_t planned = plan_memory(gpt_plan_options(c, z.batch)).total();
                const int64_t measured = measure_gpt_step(c, z.batch, z.context, Device::CPU);
                const std::string name = "L " + std::to_string(z.layers) + " h " + std::to_string(z.width) + " s " +
                                         std::to_string(z.context) + " b " + std::to_string(z.batch);
                std::printf("%-26s %-9s %-9s %10s %10s %+6.2f%%\n", name.c_str(), attention_kind_name(kind),
                            recompute ? "full" : "none", format_bytes(planned).c_str(), format_bytes(measured).c_str(),
                            100.0 * double(planned - measured) / double(measured));
            }
}

// --measure-offload: chapter 14's baby GPT (textbook attention), one steady step on the CUDA device
// with AdamW on the GPU and offloaded (optim/offload.h; serial and overlapped schedules, which hold
// the same device bytes): the plan's device bytes against the
// allocators' peaks, what offload saves, the host's pinned bytes, and the PCIe bytes a step with
// their least time at each bus's rate (computed, not measured).
void print_measured_offload() {
    GPTConfig c = baby_gpt_config(65);
    c.attention = AttentionKind::Textbook;
    const int64_t B = 12;
    const OffloadMeasured m = measure_gpt_offload(c, B, true);
    std::printf("chapter 14's GPT (L %lld, h %lld, s %lld, b %lld, textbook), f32 AdamW, one steady training step on %s\n",
                (long long)c.n_layer, (long long)c.n_embd, (long long)c.block_size, (long long)B,
                cuda::is_emulated() ? "cuda (kiln's emulator: its allocators' accounting)" : "a GPU");
    std::printf("%-26s %12s %12s %7s\n", "device bytes", "planned", "measured", "error");
    const auto row = [](const char* what, int64_t planned, int64_t measured) {
        std::printf("%-26s %12s %12s %+6.2f%%\n", what, grouped(planned).c_str(), grouped(measured).c_str(),
                    100.0 * double(planned - measured) / double(measured));
    };
    row("AdamW on the GPU", m.resident.total(), m.resident_bytes);
    row("AdamW offloaded, serial", m.offloaded.total(), m.offloaded_bytes);
    row("AdamW offloaded, overlap", m.offloaded.total(), m.overlapped_bytes);
    row("saved", m.resident.total() - m.offloaded.total(), m.resident_bytes - m.offloaded_bytes);
    row("host, pinned (offloaded)", m.offloaded.host, m.host_bytes);
    MemoryPlanOptions o = gpt_plan_options(c, B);
    o.offload = true;
    const int64_t each_way = offload_bytes_each_way(o);
    std::printf("over PCIe each way a step: %s bytes; at least %.3f ms at PCIe 4.0 x16 (31.5 GB/s), %.3f ms at "
                "PCIe 5.0 x16 (63.0 GB/s): computed from the rates, not measured\n",
                grouped(each_way).c_str(), 1e3 * double(each_way) / kPcie4x16BytesPerS,
                1e3 * double(each_way) / kPcie5x16BytesPerS);
}

// --figure: one GPU's memory against the number of GPUs (1 to 1024), one line per stage, for the
// model and options of the command line.
void draw_figure(const Cli& cli, const Flags& f) {
    const MemoryPlanOptions o = options_of(cli, f);
    const std::string title = f.model + ", " + dtype_name(o.precision) + (o.precision == DType::F32 ? "" : " mixed") +
                              " " + f.optimizer + ", micro-batch " + std::to_string(o.batch);
    std::ofstream out(f.figure);
    KILN_USAGE_CHECK(out, "cannot write --figure ", f.figure, ": does its folder exist?");
    out << stages_svg(o, 1024, {}, title);
    KILN_USAGE_CHECK(out.good(), "writing --figure ", f.figure, " failed");
    std::printf("wrote %s\n", f.figure.c_str());
}

}  // namespace

int main(int argc, char** argv) try {
    Flags f;
    Cli cli("lesson-15", "Plans one GPU's memory for training a transformer of any size, and checks the plan against kiln's measured steps.");
    cli.add("--plan", &f.plan, "print one plan: one GPU's memory by category");
    cli.add("--fits", &f.fits, "print which ZeRO stage and micro-batch fit GPT-2's and LLaMA's sizes on 80 and 141 GB");
    cli.add("--measure", &f.measure, "print the plan against kiln's measured step for chapter 14's GPT");
    cli.add("--measure-offload", &f.measure_offload, "print the baby GPT's step on the CUDA device, AdamW on the GPU "
            "and offloaded to the host: planned against measured");
    cli.add("--figure", &f.figure, "draw one GPU's memory against the GPU count, each stage, into this SVG file");
    std::vector<std::string> names;
    for (const NamedTransformer& m : named_transformers()) names.push_back(m.name);
    cli.add("--model", &f.model, "the model's shape", names);
    cli.add("--parameters", &f.parameters, "a bare parameter count Ψ instead of a shape (model states only)", Cli::at_least(0));
    cli.add("--arch", &f.arch, "the layout over the model's: gpt2 or llama", {"gpt2", "llama"});
    cli.add("--layers", &f.layers, "layers L, over the model's", Cli::at_least(1));
    cli.add("--width", &f.width, "width h, over the model's", Cli::at_least(1));
    cli.add("--heads", &f.heads, "attention heads a, over the model's", Cli::at_least(1));
    cli.add("--vocab", &f.vocab, "vocabulary V, over the model's", Cli::at_least(1));
    cli.add("--context", &f.context, "sequence length s, over the model's", Cli::at_least(1));
    cli.add("--ffn", &f.ffn, "the MLP's width f, over the model's", Cli::at_least(1));
    cli.add("--kv-heads", &f.kv_heads, "K/V heads (grouped-query attention), over the model's", Cli::at_least(1));
    cli.add("--precision", &f.precision, "f32, or bf16/f16 mixed with f32 master weights", {DType::F32, DType::BF16, DType::F16});
    cli.add("--optimizer", &f.optimizer, "the optimizer's state", {"sgd", "momentum", "adam"});
    cli.add("--zero", &f.zero, "the ZeRO stage", Cli::between(0, 3));
    cli.add("--gpus", &f.gpus, "data-parallel GPUs Nd", Cli::at_least(1));
    cli.add("--batch", &f.batch, "the micro-batch, sequences a GPU", Cli::at_least(1));
    cli.add("--recompute", &f.recompute, "activation recomputation", {"none", "selective", "full"});
    cli.add("--attention", &f.attention, "textbook keeps the s×s scores, flash their log-sum-exp", {"textbook", "flash"});
    cli.add("--dropout", &f.dropout, "count dropout's masks and outputs (Korthikanti et al.'s layer)");
    cli.add("--offload", &f.offload, "the optimizer state and master weights in the host's memory");
    cli.add_size("--gpu-memory", &f.gpu_memory, "one GPU's memory for the largest micro-batch (80GB, 141GB, 24GiB)");
    cli.add("--fragmentation", &f.fragmentation, "the allowance beyond the slabs' rounding, a fraction of the rest",
            Cli::between(0.0, 0.99));
    cli.parse(argc, argv);

    const bool all = !f.plan && !f.fits && !f.measure && !f.measure_offload && f.figure.empty();
    if (f.plan) print_plan(options_of(cli, f), f);
    if (f.fits || all) print_fits(cli, f);
    if (f.measure || all) print_measured();
    if (f.measure_offload) print_measured_offload();
    if (!f.figure.empty()) draw_figure(cli, f);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-15: %s\n", e.what());
    return 1;
}
