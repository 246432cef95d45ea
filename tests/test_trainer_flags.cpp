// test_trainer_flags.cpp — every trainer honours or refuses each shared flag (train/cli.h), run
// as a learner runs it: the binaries of build/bin/, on tiny data sets made here.
//
// For each trainer: its --help lists every shared flag either among its flags or under "does
// not take"; each refused one is refused by name; each listed one is exercised by a short run —
// a training run with all the flags that shape training at once, a resumed run, a
// --find-batch-size run, a --time-report run, a --mem-limit below the model — which must succeed
// and show the flag's effect (a file written, a line printed). A trainer that takes a flag and
// does nothing with it fails at the end of its run (CommonFlags::check_used), so the successful
// run is itself the check that the flag was used.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.h"
#include "io/archive.h"      // read_file
#include "io/safetensors.h"  // read_safetensors
#include "train/cli.h"

using namespace kiln;
using Catch::Contains;
using kiln::test::TempDir;

namespace {

namespace fs = std::filesystem;

// The folder of the trainers: build/bin beside this binary's build/tests (build-san/ with SAN=1).
std::string bin_dir() {
    return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin").string();
}

// The path of trainer `name` (lesson-NN), which must exist: make test builds the trainers first.
std::string trainer_path(const std::string& name) {
    const std::string path = bin_dir() + "/" + name;
    REQUIRE(fs::exists(path));
    return path;
}

struct Run {
    int status;
    std::string output;  // stdout and stderr
};

// Runs `command` through the shell; its output and exit status.
Run run(const std::string& command) {
    Run r{-1, ""};
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    REQUIRE(pipe);
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) r.output.append(buf.data(), n);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

// The shared flags, in add_to's order.
std::vector<std::string> shared_flags() {
    CommonFlags f;
    Cli cli("any", "");
    f.add_to(cli);
    return f.shared_flags();
}

// --help's two lists: the flags it takes and the shared ones it does not.
struct Help {
    std::set<std::string> takes, refuses;
};

Help read_help(const std::string& text) {
    Help h;
    std::istringstream in(text);
    bool refused = false;
    for (std::string line; std::getline(in, line);) {
        if (line.find("does not take:") != std::string::npos) refused = true;
        if (line.rfind("  --", 0) != 0) continue;
        const std::string flag = line.substr(2, line.find(' ', 2) - 2);
        (refused ? h.refuses : h.takes).insert(flag);
    }
    return h;
}

// A tiny MNIST: 96 training and 32 test images of 28×28, pixels and labels from a fixed pattern.
void write_tiny_mnist(const std::string& dir) {
    const auto put = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
        test::write_bytes(dir + "/" + name + ".gz", test::gzip_bytes(bytes));
    };
    for (auto [name, n] : {std::pair<std::string, uint32_t>{"train", 96}, {"t10k", 32}}) {
        std::vector<uint8_t> px(size_t(n) * 784), labels(n);
        for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t((i * 37 + i / 784 * 11) % 251);
        for (uint32_t i = 0; i < n; ++i) labels[i] = uint8_t(i % 10);
        put(name + "-images-idx3-ubyte", test::idx_images(n, 28, 28, px));
        put(name + "-labels-idx1-ubyte", test::idx_labels(labels));
    }
}

// A tiny CIFAR-10 in the official binary layout: 5 batches of 20 training images, 32 test ones.
void write_tiny_cifar(const std::string& dir) {
    const auto batch = [](int first, int count) {
        std::vector<uint8_t> out;
        for (int k = first; k < first + count; ++k) {
            out.push_back(uint8_t(k % 10));
            for (int p = 0; p < 3072; ++p) out.push_back(uint8_t((k * 29 + p * 7) % 253));
        }
        return out;
    };
    std::vector<test::TarFile> files = {
        {"cifar-10-batches-bin/batches.meta.txt",
         test::bytes_of("airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n")}};
    for (int b = 1; b <= 5; ++b)
        files.push_back({"cifar-10-batches-bin/data_batch_" + std::to_string(b) + ".bin", batch(20 * (b - 1), 20)});
    files.push_back({"cifar-10-batches-bin/test_batch.bin", batch(1000, 32)});
    test::write_bytes(dir + "/cifar-10-binary.tar.gz", test::gzip_bytes(test::make_tar(files)));
}

// A folder with a moby-dick.txt of a few lines (lesson-14's data): every character of the
// default prompt ("\n") among its first 64.
void write_tiny_text(const std::string& dir) {
    fs::create_directories(dir);
    std::ofstream f(dir + "/moby-dick.txt");
    for (int i = 0; i < 40; i++) f << "Call me Ishmael.\nSome years ago, never mind how long.\n";
}

// lesson-14 on a tiny text (written into tmp/text by the first call): a GPT of `layers` layers,
// 2 heads, width 8, windows of 8 tokens, batches of 4, one thread, trained `iters` steps with a
// validation loss every 2 (one window). The caller appends the flags the test is about.
std::string tiny_lesson14(const TempDir& tmp, int iters, int layers) {
    const std::string text = tmp.file("text");
    if (!fs::exists(text)) write_tiny_text(text);
    return trainer_path("lesson-14") + " --data " + text + " --iters " + std::to_string(iters) +
           " --eval-interval 2 --eval-windows 1 --block-size 8 --n-layer " + std::to_string(layers) +
           " --n-head 2 --n-embd 8 --batch-size 4 --threads 1";
}

// Whether the files at paths a and b hold the same bytes (a function, so that a failing CHECK prints
// its paths rather than megabytes of both).
bool same_file(const std::string& a, const std::string& b) { return read_file(a) == read_file(b); }

enum class Data { mnist, cifar, text };

struct Trainer {
    std::string name;   // lesson-NN
    Data data;          // what it trains on
    std::string own;    // its own flags for a short run
    std::string device; // the device it trains on by default
};

// A value for each shared flag that takes one, in the training run (the other runs add theirs).
std::string flag_with_value(const std::string& flag, const Trainer& t, const std::string& data, const std::string& dir) {
    static const std::map<std::string, std::string> values = {
        {"--epochs", "1"}, {"--batch-size", "16"}, {"--lr", "0.01"}, {"--seed", "2"}, {"--threads", "1"},
        {"--limit", "64"}, {"--mem-limit", "1GiB"}, {"--accumulate", "2"}, {"--mem-trace-steps", "1"}, {"--amp", "bf16"}};
    if (flag == "--data") return flag + " " + data;
    if (flag == "--device") return flag + " " + t.device;
    if (flag == "--save") return flag + " " + dir + "/run";
    if (flag == "--mem-trace") return flag + " " + dir + "/trace.json";
    const auto v = values.find(flag);
    return v == values.end() ? flag : flag + " " + v->second;
}

// The flags a run of each kind exercises; the training run takes every other listed one.
const std::set<std::string> kOwnRuns = {"--resume", "--find-batch-size", "--time-report", "--time-svg", "--tf32"};

}  // namespace

TEST_CASE("every trainer honours each shared flag its --help lists and refuses the others by name",
          "[flags][trainer][cpu]") {
    const std::vector<Trainer> trainers = {
        {"lesson-01", Data::mnist, "", "cpu"},
        {"lesson-02", Data::mnist, "--hidden1 32 --hidden2 16", "cpu"},
        {"lesson-03", Data::mnist, "", "cpu"},
        {"lesson-04", Data::mnist, "", "cuda"},
        {"lesson-05", Data::mnist, "", "cuda"},
        {"lesson-06", Data::cifar, "--width1 8 --width2 8 --width3 8", "cpu"},
        {"lesson-07", Data::cifar, "--width1 8 --width2 8 --width3 8", "cpu"},
        {"lesson-08", Data::cifar, "", "cpu"},
        {"lesson-09", Data::cifar, "", "cpu"},
        {"lesson-10", Data::mnist, "--rounds 1 --finetune-epochs 1", "cpu"},
        {"lesson-11", Data::mnist, "--calib-batches 1", "cpu"},
        {"lesson-12", Data::mnist, "", "cpu"},
        {"lesson-13", Data::cifar, "--tta 0", "cpu"},
        {"lesson-13-mobilenet", Data::cifar, "--width 0.25", "cpu"},
        {"lesson-14", Data::text, "--iters 2 --block-size 4 --n-layer 1 --n-head 2 --n-embd 8 --sample 5", "cpu"},
    };
    TempDir tmp;
    const std::string mnist = tmp.file("mnist"), cifar = tmp.file("cifar"), text = tmp.file("text");
    write_tiny_mnist(mnist);
    write_tiny_cifar(cifar);
    write_tiny_text(text);
    const std::vector<std::string> shared = shared_flags();
    for (const Trainer& t : trainers) {
        SECTION(t.name) {
            const std::string bin = trainer_path(t.name), data = t.data == Data::cifar ? cifar : t.data == Data::text ? text : mnist;
            const std::string dir = tmp.file(t.name);
            fs::create_directories(dir);
            const Run help = run(bin + " --help");
            REQUIRE(help.status == 0);
            const Help h = read_help(help.output);

            // every shared flag is either taken or refused, never both, never neither
            for (const std::string& flag : shared) {
                INFO(t.name << " " << flag);
                CHECK(h.takes.count(flag) + h.refuses.count(flag) == 1);
            }
            for (const std::string& flag : h.refuses) {  // refused by name, not "unknown flag" nor a source line
                const Run r = run(bin + " " + flag_with_value(flag, t, data, dir));
                INFO(r.output);
                CHECK(r.status != 0);
                CHECK_THAT(r.output, Contains(t.name + " does not take " + flag + ": ") && !Contains(".cpp:"));
            }

            // 1. training: every listed flag but those of the runs below, at once
            const auto takes = [&](const std::string& flag) { return h.takes.count(flag) > 0; };
            std::string base = bin + " " + t.own, train_flags;
            for (const std::string& flag : shared)
                if (takes(flag) && !kOwnRuns.count(flag)) train_flags += " " + flag_with_value(flag, t, data, dir);
            // the runs below share the data, the batch, the seed, the lr; a resumed run also what the
            // checkpoint must agree with (the epochs, the loss scaling of --amp)
            for (const char* same : {"--data", "--limit", "--batch-size", "--seed", "--lr", "--device"})
                if (takes(same)) base += " " + flag_with_value(same, t, data, dir);
            std::string as_trained = base;
            for (const char* same : {"--epochs", "--amp"})
                if (takes(same)) as_trained += " " + flag_with_value(same, t, data, dir);
            const Run trained = run(bin + " " + t.own + train_flags);
            INFO(trained.output);
            REQUIRE(trained.status == 0);
            if (takes("--save")) CHECK(fs::exists(dir + "/run/last.safetensors"));
            if (takes("--mem-trace")) CHECK((fs::exists(dir + "/trace.json") && fs::exists(dir + "/trace.svg")));
            if (takes("--mem-report")) CHECK_THAT(trained.output, Contains("predicted") || Contains("no prediction"));
            if (takes("--mem-limit")) CHECK_THAT(trained.output, Contains("limit: 1.0GiB"));
            if (takes("--grad-hist")) CHECK_THAT(trained.output, Contains("f16"));
            if (takes("--amp")) CHECK_THAT(trained.output, Contains("bf16"));

            // 2. resumed from the checkpoint it wrote
            if (takes("--resume")) {
                const Run resumed = run(as_trained + " --resume " + dir + "/run/last.safetensors");
                INFO(resumed.output);
                CHECK(resumed.status == 0);
                CHECK_THAT(resumed.output, Contains("resumed from"));
            }
            // 3. the largest batch under a limit
            if (takes("--find-batch-size")) {
                const Run found = run(base + " --find-batch-size --mem-limit 256MiB");
                INFO(found.output);
                CHECK(found.status == 0);
                CHECK_THAT(found.output, Contains("largest batch") || Contains("not even one image fits"));
            }
            // 4. a step's time by layer, and its figure
            if (takes("--time-report")) {
                const Run timed = run(base + " --time-report 1" + (takes("--time-svg") ? " --time-svg " + dir + "/time.svg" : ""));
                INFO(timed.output);
                CHECK(timed.status == 0);
                CHECK_THAT(timed.output, Contains("time of one training step"));
                if (takes("--time-svg")) CHECK(fs::exists(dir + "/time.svg"));
            }
            // 5. a limit below the model: refused before training, naming the flag
            if (takes("--mem-limit")) {
                const Run small = run(base + " --mem-limit 1KiB");
                INFO(small.output);
                CHECK(small.status != 0);
                CHECK_THAT(small.output, Contains("--mem-limit 1KiB is below what the model needs"));
            }
            // 6. TF32: a CUDA trainer trains with it and says so; on the CPU it is refused before training
            if (takes("--tf32")) {
                const Run tf32 = run(base + " --tf32");
                INFO(tf32.output);
                if (t.device == "cuda") {
                    CHECK(tf32.status == 0);
                    CHECK_THAT(tf32.output, Contains("tf32: f32 matrix products (linear, conv) on the tensor cores"));
                } else {
                    CHECK(tf32.status != 0);
                    CHECK_THAT(tf32.output, Contains("--tf32 runs f32 matrix products on a GPU's tensor cores"));
                }
            }
        }
    }
}

// The text a lesson-14 run sampled: what follows its "sample (...):" line ("" without one).
std::string sample_text(const std::string& output) {
    const size_t at = output.find("sample (");
    return at == std::string::npos ? "" : output.substr(output.find('\n', at) + 1);
}

// lesson-14's --save as a learner runs it: DIR/last.safetensors and DIR/vocab.json at every
// --eval-interval and at the end; --resume of the mid-run checkpoint ends where the straight run
// ends, bit for bit, whatever its --seed; --from samples from the last one, without the text, what the trainer wrote.
TEST_CASE("lesson-14 --save keeps the GPT and its vocabulary; --resume goes on bit for bit; --from samples without the text",
          "[flags][lesson14][checkpoint][cpu]") {
    const std::string bin = trainer_path("lesson-14");
    TempDir tmp;
    const std::string lesson14 = tiny_lesson14(tmp, 4, 1) + " --sample 40 --save ";
    const std::string text = tmp.file("text"), straight = tmp.file("straight"), resumed = tmp.file("resumed");
    const Run first = run(lesson14 + straight);
    INFO(first.output);
    REQUIRE(first.status == 0);
    REQUIRE(read_safetensors(straight + "/prev.safetensors").get_int("train.step") == 3);  // saved after step 2
    REQUIRE(read_safetensors(straight + "/last.safetensors").get_int("train.step") == 4);
    REQUIRE(fs::exists(straight + "/vocab.json"));

    fs::create_directories(resumed);
    fs::copy_file(straight + "/prev.safetensors", resumed + "/step3.safetensors");
    fs::copy_file(straight + "/vocab.json", resumed + "/vocab.json");
    // another --seed: the batches go on with the checkpoint's
    const Run second = run(lesson14 + resumed + " --resume " + resumed + "/step3.safetensors --seed 7");
    INFO(second.output);
    REQUIRE(second.status == 0);
    CHECK_THAT(second.output, Contains("resumed from") && Contains("3 steps done") && Contains("--seed 1 (not 7)"));
    CHECK(same_file(resumed + "/last.safetensors", straight + "/last.safetensors"));

    fs::remove_all(text);
    const Run sampled = run(bin + " --from " + straight + "/last.safetensors --sample 40 --threads 1");
    INFO(sampled.output);
    REQUIRE(sampled.status == 0);
    CHECK_THAT(sampled.output, Contains("trained 4 steps"));
    CHECK(sample_text(sampled.output).size() > 40);
    CHECK(sample_text(sampled.output) == sample_text(first.output));
    const Run shaped = run(bin + " --from " + straight + "/last.safetensors --n-head 4");
    CHECK(shaped.status != 0);
    CHECK_THAT(shaped.output, Contains("--n-head shapes a model") && Contains("--from takes the checkpoint's model"));
}

// Each "step N: loss X" line of a lesson-14 run: the losses, in order.
std::vector<double> step_losses(const std::string& output) {
    std::vector<double> losses;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) {
        const size_t at = line.find(": loss ");
        if (line.rfind("step ", 0) == 0 && at != std::string::npos) losses.push_back(std::stod(line.substr(at + 7)));
    }
    return losses;
}

// lesson-14 --device cuda --offload (chapter 15, optim/offload.h): AdamW's state on the host, the
// update on the CPU, overlapped with the GPU's work (the default) or after it (--offload-schedule
// serial). On kiln's emulator both runs are the GPU-resident run's bit for bit: the same output (but
// the offload lines and the timings) and the same checkpoint file. --offload on the CPU and with
// --memory, and --offload-schedule without --offload, are refused by name. (Tagged [cpu]: it runs the CPU build's lesson-14 on the
// emulator; the GPU check's kiln-gpu holds no lesson-14, which links Open MPI.)
TEST_CASE("lesson-14 --device cuda --offload trains and saves as the run without it, bit for bit; refused where "
          "it cannot run",
          "[flags][lesson14][lesson15][offload][cpu]") {
    const std::string bin = trainer_path("lesson-14");
    TempDir tmp;
    const std::string lesson14 = tiny_lesson14(tmp, 3, 1) + " --device cuda --log-interval 1 --sample 20 --save ";
    const std::string text = tmp.file("text"), resident = tmp.file("resident"), offloaded = tmp.file("offloaded"),
                      serial = tmp.file("serial");
    const Run a = run(lesson14 + resident), b = run(lesson14 + offloaded + " --offload"),
              c = run(lesson14 + serial + " --offload --offload-schedule serial");
    INFO(a.output << "\n----\n" << b.output << "\n----\n" << c.output);
    REQUIRE(a.status == 0);
    REQUIRE(b.status == 0);
    REQUIRE(c.status == 0);
    CHECK_THAT(b.output, Contains("offload: AdamW's moments and the f32 master weights on the host") &&
                             Contains("the overlapped schedule") && Contains("host, pinned (offload)"));
    CHECK_THAT(c.output, Contains("the serial schedule"));
    CHECK(step_losses(a.output).size() == 3);
    for (const Run* offload : {&b, &c}) {
        CHECK(step_losses(a.output) == step_losses(offload->output));
        CHECK(sample_text(a.output) == sample_text(offload->output));
    }
    CHECK(same_file(resident + "/last.safetensors", offloaded + "/last.safetensors"));
    CHECK(same_file(resident + "/last.safetensors", serial + "/last.safetensors"));

    const Run cpu = run(bin + " --data " + text + " --iters 1 --offload");
    CHECK(cpu.status != 0);
    CHECK_THAT(cpu.output, Contains("--offload moves AdamW's state") && Contains("it needs --device cuda"));
    const Run memory = run(bin + " --device cuda --data " + text + " --iters 1 --offload --memory");
    CHECK(memory.status != 0);
    CHECK_THAT(memory.output, Contains("lesson-15 --plan --model baby-gpt --offload"));
    const Run schedule = run(bin + " --device cuda --data " + text + " --iters 1 --offload-schedule serial");
    CHECK(schedule.status != 0);
    CHECK_THAT(schedule.output, Contains("--offload-schedule serial schedules the offloaded optimizer: add --offload"));
}

// lesson-14 started by mpirun (chapter 12's data parallel training; lessons/14-attention/README.md):
// 2 ranks × 2 windows with --zero 1 print one process × 4 windows' losses (within rounding: the
// MPI test '[lesson14]' compares the two exactly), once — rank 0 speaks — and rank 0 writes the
// checkpoint, with AdamW's whole moments (every rank helped gather them), from which one process
// resumes, and 2 ranks again, bit for bit. A batch the ranks cannot share, and --amp f16 with
// --zero 1, are refused by rank 0 alone.
TEST_CASE("lesson-14 under mpirun: --zero 1 on 2 ranks trains as one process does; rank 0 prints and saves",
          "[flags][lesson14][checkpoint][cpu]") {
    const std::string mpirun = "mpirun --allow-run-as-root --oversubscribe -np 2 ";
    TempDir tmp;
    const std::string lesson14 = tiny_lesson14(tmp, 4, 1) + " --log-interval 1 --sample 0";
    const std::string alone = tmp.file("alone"), ranks = tmp.file("ranks");
    const Run one = run(lesson14 + " --save " + alone);
    const Run two = run(mpirun + lesson14 + " --save " + ranks + " --zero 1");
    INFO(one.output << "\n---- on 2 ranks:\n" << two.output);
    REQUIRE(one.status == 0);
    REQUIRE(two.status == 0);
    CHECK_THAT(two.output, Contains("2 ranks × 2 windows, ZeRO-1"));
    const std::vector<double> a = step_losses(one.output), b = step_losses(two.output);
    REQUIRE(a.size() == 4);
    REQUIRE(b.size() == 4);  // rank 0's lines only
    for (size_t s = 0; s < 4; s++) CHECK(b[s] == Approx(a[s]).margin(2e-4));  // printed to 4 decimals
    CHECK(two.output.find("result:") == two.output.rfind("result:"));

    const StateDict saved = read_safetensors(ranks + "/last.safetensors"), whole = read_safetensors(alone + "/last.safetensors");
    REQUIRE(fs::exists(ranks + "/vocab.json"));
    CHECK(saved.get_int("train.step") == 4);
    size_t moments = 0;
    for (const auto& [key, t] : whole.tensors) {
        INFO(key);
        REQUIRE(saved.tensors.count(key) == 1);
        CHECK(saved.tensors.at(key).shape() == t.shape());
        moments += key.find(".exp_avg") != std::string::npos;
    }
    CHECK(moments > 0);
    const Run resumed = run(lesson14 + " --iters 5 --resume " + ranks + "/last.safetensors");
    INFO(resumed.output);
    CHECK(resumed.status == 0);
    CHECK_THAT(resumed.output, Contains("4 steps done") && Contains("step 4: loss"));
    // on 2 ranks again, from the mid-run checkpoint: each rank takes its pieces of the moments back,
    // and the run ends where the straight one ended, bit for bit
    const std::string again = tmp.file("again");
    fs::create_directories(again);
    fs::copy_file(ranks + "/prev.safetensors", again + "/step3.safetensors");
    const Run second = run(mpirun + lesson14 + " --save " + again + " --zero 1 --resume " + again + "/step3.safetensors");
    INFO(second.output);
    CHECK(second.status == 0);
    CHECK_THAT(second.output, Contains("3 steps done"));
    CHECK(same_file(again + "/last.safetensors", ranks + "/last.safetensors"));

    for (const char* bad : {" --batch-size 3", " --zero 1 --amp f16"}) {
        const Run refused = run(mpirun + lesson14 + bad);
        INFO(refused.output);
        CHECK(refused.status != 0);
        size_t lines = 0;
        for (size_t at = refused.output.find("lesson-14:"); at != std::string::npos; at = refused.output.find("lesson-14:", at + 1))
            lines++;
        CHECK(lines == 1);
        CHECK_THAT(refused.output, (Contains("--batch-size 3 must split into 2 equal shares") ||
                                    Contains("--zero 1 reduces the gradients inside the optimizer")) &&
                                       !Contains("MPI_ABORT"));
    }
}

// ZeRO-2 and ZeRO-3 (chapter 15, dist/zero2.h and zero3.h) under lesson-14's mpirun: the same
// sums and updates as ZeRO-1, so the same printed losses, validation loss and sample (ZeRO-3
// gathers the model whole after training to sample it). ZeRO-2's checkpoint (rank 0's, AdamW's
// moments gathered) resumes in one process, and --zero 2 --memory points to chapter 15's planner.
TEST_CASE("lesson-14 under mpirun: --zero 2 and 3 print --zero 1's losses and sample; --zero 2 saves",
          "[flags][lesson14][lesson15][checkpoint][cpu]") {
    const std::string bin = trainer_path("lesson-14"), mpirun = "mpirun --allow-run-as-root --oversubscribe -np 2 ";
    TempDir tmp;
    const std::string lesson14 = mpirun + tiny_lesson14(tmp, 4, 2) + " --log-interval 1 --sample 30";
    const std::string text = tmp.file("text"), saved = tmp.file("zero2");
    const Run one = run(lesson14 + " --zero 1"), two = run(lesson14 + " --zero 2 --save " + saved),
              three = run(lesson14 + " --zero 3");
    INFO(one.output << "\n---- --zero 2:\n" << two.output << "\n---- --zero 3:\n" << three.output);
    REQUIRE(one.status == 0);
    REQUIRE(two.status == 0);
    REQUIRE(three.status == 0);
    CHECK_THAT(three.output, Contains("2 ranks × 2 windows, ZeRO-3"));
    const auto result = [](const std::string& output) { return output.substr(output.find("result: val_loss"), 36); };
    for (const Run* r : {&two, &three}) {
        CHECK(step_losses(r->output).size() == 4);
        CHECK(step_losses(r->output) == step_losses(one.output));
        CHECK(result(r->output) == result(one.output));
        CHECK(sample_text(r->output).size() > 20);
        CHECK(sample_text(r->output) == sample_text(one.output));
    }
    const Run resumed = run(bin + " --data " + text + " --iters 5 --block-size 8 --n-layer 2 --n-head 2 --n-embd 8 "
                            "--batch-size 4 --threads 1 --sample 0 --resume " + saved + "/last.safetensors");
    INFO(resumed.output);
    CHECK(resumed.status == 0);
    CHECK_THAT(resumed.output, Contains("4 steps done") && Contains("step 4: loss"));

    const Run memory = run(lesson14 + " --zero 2 --memory");
    INFO(memory.output);
    CHECK(memory.status != 0);
    CHECK_THAT(memory.output, Contains("lesson-15 --plan --model baby-gpt --zero 2 --gpus 2"));
}

// lesson-14 --zero 3 --save (chapter 15, dist/zero3.h's save_gpt_shard): every rank writes its own
// shard, DIR/last.rank<r>-of-2.safetensors, with the run's record (shape, vocabulary, seed, step);
// --resume of the mid-run shards on 2 ranks ends where the straight run ended, bit for bit (each
// rank's file the same bytes, the same losses); one process, or a whole checkpoint, is refused
// naming the world that wrote the folder.
TEST_CASE("lesson-14 under mpirun: --zero 3 --save writes a shard a rank; --resume on 2 ranks goes on bit for bit; "
          "another world is refused",
          "[flags][lesson14][lesson15][checkpoint][zero3][cpu]") {
    const std::string mpirun = "mpirun --allow-run-as-root --oversubscribe -np 2 ";
    TempDir tmp;
    const std::string lesson14 = tiny_lesson14(tmp, 4, 2) + " --log-interval 1 --sample 0 --zero 3 --save ";
    const std::string straight = tmp.file("straight"), resumed = tmp.file("resumed");
    const Run first = run(mpirun + lesson14 + straight);
    INFO(first.output);
    REQUIRE(first.status == 0);
    CHECK_THAT(first.output, Contains("one file a rank, 2 ranks"));
    for (int r = 0; r < 2; r++) {
        const std::string name = "rank" + std::to_string(r) + "-of-2.safetensors";
        REQUIRE(read_safetensors(straight + "/prev." + name).get_int("train.step") == 3);  // saved after step 2
        const StateDict last = read_safetensors(straight + "/last." + name);
        CHECK(last.get_int("train.step") == 4);
        CHECK(last.get_int("optimizer.shard.rank") == r);
        CHECK(last.has("train.gpt.vocabulary"));
        CHECK(!last.has("transformer.wte.weight"));  // nothing gathered
        fs::create_directories(resumed);
        fs::copy_file(straight + "/prev." + name, resumed + "/step3." + name);
    }
    const Run second = run(mpirun + lesson14 + resumed + " --resume " + resumed + "/step3.safetensors");
    INFO(second.output);
    REQUIRE(second.status == 0);
    CHECK_THAT(second.output, Contains("3 steps done"));
    const std::vector<double> all = step_losses(first.output), rest = step_losses(second.output);
    REQUIRE(all.size() == 4);
    CHECK(rest == std::vector<double>(all.begin() + 3, all.end()));
    for (int r = 0; r < 2; r++) {
        const std::string name = "/last.rank" + std::to_string(r) + "-of-2.safetensors";
        CHECK(same_file(resumed + name, straight + name));
    }

    const Run alone = run(lesson14 + tmp.file("alone") + " --resume " + resumed + "/step3.safetensors");
    INFO(alone.output);
    CHECK(alone.status != 0);
    CHECK_THAT(alone.output, Contains("step3.rank0-of-1.safetensors, which does not exist") &&
                                 Contains("a checkpoint of 2 ranks") && Contains("resume with mpirun -np 2"));
}

// Chapter 10's --save as a learner runs it: DIR/pruned.safetensors after every round (PyTorch's
// weight_orig and weight_mask), the round before as pruned-prev.safetensors, the CSR model as
// sparse.safetensors; --resume of the first round's file ends where the straight run ends, bit
// for bit: the same last round, the same CSR model.
TEST_CASE("lesson-10 --save keeps each round's pruned model and the CSR one; --resume goes on with the next round",
          "[flags][lesson10][prune][checkpoint][cpu]") {
    TempDir tmp;
    const std::string mnist = tmp.file("mnist"), straight = tmp.file("straight"), resumed = tmp.file("resumed");
    write_tiny_mnist(mnist);
    const std::string lesson10 = trainer_path("lesson-10") + " --data " + mnist +
                                 " --epochs 1 --batch-size 16 --rounds 2 --finetune-epochs 1 --threads 1 --save ";
    const Run first = run(lesson10 + straight);
    INFO(first.output);
    REQUIRE(first.status == 0);
    const StateDict round1 = read_safetensors(straight + "/pruned-prev.safetensors");
    const StateDict round2 = read_safetensors(straight + "/pruned.safetensors");
    REQUIRE(round1.get_int("prune.rounds_done") == 1);
    REQUIRE(round2.get_int("prune.rounds_done") == 2);
    for (const char* name : {"fc1.weight_orig", "fc1.weight_mask", "fc3.weight_orig", "fc3.weight_mask"})
        CHECK(round2.tensors.count(name));
    CHECK_FALSE(round2.tensors.count("fc1.weight"));
    const StateDict csr = read_safetensors(straight + "/sparse.safetensors");
    for (const char* name : {"fc1.weight_values", "fc1.weight_col_index", "fc1.weight_row_start"})
        CHECK(csr.tensors.count(name));

    fs::create_directories(resumed);
    fs::copy_file(straight + "/pruned-prev.safetensors", resumed + "/round1.safetensors");
    const Run second = run(lesson10 + resumed + " --resume " + resumed + "/round1.safetensors");
    INFO(second.output);
    REQUIRE(second.status == 0);
    CHECK_THAT(second.output, Contains("1 of 2 rounds done") && !Contains("round 1/2"));
    for (const char* file : {"/pruned.safetensors", "/sparse.safetensors"}) {
        INFO(file);
        CHECK(same_file(resumed + file, straight + file));
    }
    const auto accuracy = [](const std::string& output) {  // "result: test_acc=NN.NN%"
        const size_t at = output.rfind("result: ");
        return at == std::string::npos ? "" : output.substr(at, output.find(" time=", at) - at);
    };
    CHECK(accuracy(second.output) == accuracy(first.output));
}

// Issue 46, item 9: a command line that cannot run fails alike on every rank; one rank says so
// (not every rank, each followed by MPI_Abort's notice).
TEST_CASE("lesson-12 under mpirun: a bad flag is reported once, by rank 0, without MPI_Abort", "[flags][lesson12][cpu]") {
    const Run r = run("mpirun --allow-run-as-root --oversubscribe -np 2 " + bin_dir() + "/lesson-12 --limit -5");
    INFO(r.output);
    CHECK(r.status != 0);
    size_t lines = 0;
    for (size_t at = r.output.find("lesson-12"); at != std::string::npos; at = r.output.find("lesson-12", at + 1)) lines++;
    CHECK(lines == 1);
    CHECK_THAT(r.output, Contains("lesson-12: flag --limit: -5 is not allowed") && !Contains("MPI_ABORT"));
}

// The line of `output` that starts with `prefix`, without what follows `until` in it.
static std::string line_of(const std::string& output, const std::string& prefix, const std::string& until) {
    const size_t at = output.find(prefix);
    if (at == std::string::npos) return "";
    const std::string line = output.substr(at, output.find('\n', at) - at);
    return line.substr(0, line.find(until));
}

TEST_CASE("lesson-04 and lesson-05 --cuda-graph train as without it, and refuse the CPU and --amp",
          "[flags][trainer][graph][cuda]") {
    TempDir tmp;
    const std::string mnist = tmp.file("mnist");
    write_tiny_mnist(mnist);
    for (const std::string name : {"lesson-04", "lesson-05"}) {
        SECTION(name) {
            const std::string cmd = trainer_path(name) + " --data " + mnist + " --epochs 1 --batch-size 8";
            const Run plain = run(cmd + " --device cuda --save " + tmp.file(name + "-plain"));
            const Run graph = run(cmd + " --device cuda --cuda-graph --save " + tmp.file(name + "-graph"));
            INFO(plain.output << "\n---\n" << graph.output);
            REQUIRE(plain.status == 0);
            REQUIRE(graph.status == 0);
            const std::string acc = line_of(plain.output, "result: test_acc=", " time=");
            CHECK(!acc.empty());
            CHECK(line_of(graph.output, "result: test_acc=", " time=") == acc);
            const std::string loss = line_of(plain.output, "epoch 1: ", "\n");
            CHECK(line_of(graph.output, "epoch 1: ", "\n") == loss);

            const Run cpu = run(cmd + " --device cpu --cuda-graph");
            CHECK(cpu.status != 0);
            CHECK_THAT(cpu.output, Catch::Contains("--cuda-graph captures CUDA kernels: use it with --device cuda"));
            const Run amp = run(cmd + " --device cuda --cuda-graph --amp bf16");
            CHECK(amp.status != 0);
            CHECK_THAT(amp.output, Catch::Contains("--cuda-graph with --amp bf16"));
        }
    }
}
