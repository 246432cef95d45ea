// lesson-12 — data parallel training: several processes (MPI) or GPUs (NCCL) train one model,
// each on its share of every batch, and ZeRO-1 shards the optimizer's state over them.
//
//   make lesson-12                                    # mpirun -np 2: LeNet on MNIST, 2 ranks × 32 images
//   mpirun -np 2 build/bin/lesson-12 --zero 1         # the optimizer's state sharded over the ranks
//   mpirun -np 2 build/bin/lesson-12 --measure 50     # time 50 steps: compute and communication per
//                                                     # step, per-rank memory, the cost model for 8-512 GPUs
//   mpirun -np 2 build/bin/lesson-12 --model cifar    # the CIFAR net (batch norm per rank)
//   build/bin/lesson-12                               # one process: a world of one rank
// (as root, mpirun wants --allow-run-as-root; with more ranks than cores, --oversubscribe.)
//
// --batch-size is the whole batch, split over the ranks: the same flags train the same model on
// any number of ranks (lesson 03's LeNet: 64 images a step, lr 0.05, momentum 0.9, 12 epochs).
// Every rank prints nothing but errors; rank 0 prints the run and writes the files.
//
// What each rank does every step (dist/data_parallel.h, dist/zero.h):
//   forward and backward on its batch_size / p images   (plain data parallel:)
//   all-reduce each bucket of gradients as backward       g = (1/p) Σ_r g_r on every rank
//     finishes it
//   the same SGD step from the same g on every rank       (ZeRO-1: reduce-scatter, update
//                                                           the own piece, all-gather)
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "core/allocator.h"       // defines: BumpAllocator, device_memory_stats, format_bytes
#include "dist/cost_model.h"      // defines: scaling_table (the α–β model of all-reduce)
#include "dist/data_parallel.h"   // defines: DataParallel, CommStats
#include "dist/zero.h"            // defines: ZeroOptimizer
#include "mpi/launch.h"           // defines: run_ranks, start_ranks
#include "mpi/mpi_comm.h"         // defines: MpiCommunicator
#ifdef KILN_CUDA
#include "mpi/nccl_comm.h"        // defines: make_nccl_communicator
#endif
#include "nn/models.h"            // defines: lenet, cifar_net
#include "optim/optimizer.h"      // defines: SGD, decay_groups
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: MnistData, CifarData, fit, report
#include "train/loop.h"           // defines: train_step
#include "train/memory_model.h"   // defines: state_slabs, optimizer_kind

using namespace kiln;

namespace {

struct Flags {
    CommonFlags common;
    std::string model = "lenet";   // lenet | cifar
    int zero = 0;                  // ZeRO stage: 0 (plain data parallel) or 1
    bool no_overlap = false;       // one all-reduce after backward instead of buckets during it
    float bucket_mb = 25;          // DDP's bucket_cap_mb
    std::string backend = "mpi";   // mpi | nccl (make CUDA=1, --device cuda)
    float timeout = 300;           // seconds a collective waits for the other ranks
    int measure = 0;               // > 0: time this many steps, print the figures, and stop
};

std::unique_ptr<Communicator> nccl_or_none(const Flags& f, MpiCommunicator& mpi) {
    if (f.backend == "mpi") return nullptr;
#ifdef KILN_CUDA
    KILN_CHECK(f.common.device == "cuda", "--backend nccl moves GPU memory: add --device cuda");
    const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");  // one GPU per rank on each machine
    return make_nccl_communicator(mpi, local_rank ? std::atoi(local_rank) : 0);
#else
    (void)mpi;
    KILN_CHECK(false, "--backend nccl needs the CUDA build (make CUDA=1) and a GPU per rank; this build runs the ",
               "CUDA kernels on the emulator, where the MPI backend moves their memory");
    return nullptr;
#endif
}

// --measure N: the time of N steps (after 3 to warm up), split into compute and the
// communication backward waited for, the per-rank memory, and the cost model's prediction.
void measure(Module& model, Optimizer& optimizer, DataLoader& train, DataParallel* ddp, Communicator& comm,
             const Flags& f, BumpAllocator& arena) {
    using clock = std::chrono::steady_clock;
    StepOptions step;
    step.arena = &arena;
    train.start_epoch(0);
    Batch b;
    double forward = 0, total = 0;
    for (int s = -3; s < f.measure; s++) {
        if (!train.next(b)) {
            train.start_epoch(s + 4);
            train.next(b);
        }
        if (s == 0 && ddp) ddp->stats().reset();
        const auto t0 = clock::now();
        {
            NoGradScope no_grad;  // the forward alone, to split compute into forward and backward
            model.call(b.x);
            arena.reset();
        }
        const auto t1 = clock::now();
        train_step(model, optimizer, b.x, b.y, step);
        const auto t2 = clock::now();
        if (s < 0) continue;
        forward += std::chrono::duration<double>(t1 - t0).count();
        total += std::chrono::duration<double>(t2 - t1).count();
    }
    const double n = f.measure, per_step = total / n, fwd = forward / n;
    const double waited = ddp ? ddp->stats().wait_seconds / n : 0;
    const int64_t grad_bytes = model.grads_view().nbytes();
    std::printf("%d steps of %lld images on each of %d ranks (%d OpenMP threads each): %.2f ms a step, %.0f img/s\n",
                f.measure, (long long)b.size(), comm.size(), omp_get_max_threads(), 1e3 * per_step,
                double(b.size()) * comm.size() / per_step);
    std::printf("  forward %.2f ms, backward + optimizer %.2f ms, of which waiting for the all-reduces %.2f ms "
                "(%s of gradients a step%s)\n",
                1e3 * fwd, 1e3 * (per_step - fwd), 1e3 * waited, format_bytes(grad_bytes).c_str(),
                f.zero ? ", reduce-scattered and all-gathered inside the optimizer step" : "");

    const MemoryStats m = device_memory_stats(train.options().device);
    std::printf("rank 0's memory: parameters %s, gradients %s, optimizer state %s (ZeRO-%d over %d ranks)\n",
                format_bytes(m.in_use[int(Category::Parameter)]).c_str(),
                format_bytes(m.in_use[int(Category::Gradient)]).c_str(),
                format_bytes(m.in_use[int(Category::OptimizerState)]).c_str(), f.zero, comm.size());
    std::printf("%s", zero_memory_table(model.num_parameters(), state_slabs(optimizer_kind(optimizer)), {1, 2, 8, 64}).c_str());

    // The cost model, from this step's compute as if each GPU took as long as this CPU does
    const Workload w{f.model == "lenet" ? "LeNet, compute measured here" : "CIFAR net, compute measured here", fwd,
                     per_step - fwd - waited, int(b.size()), double(grad_bytes), f.bucket_mb * (1 << 20)};
    std::printf("%s", scaling_table(w, dgx_h100_cluster()).c_str());
}

int run(int argc, char** argv, MpiCommunicator& mpi) {
    Flags f;
    CommonFlags& flags = f.common;
    flags.epochs = 12;
    flags.lr = 0.05f;
    Cli cli("lesson-12", "Data parallel training on MPI ranks (mpirun -np N) or NCCL GPUs, with ZeRO-1.");
    flags.add_to(cli);
    cli.add("--model", &f.model, "lenet (MNIST) or cifar (CIFAR-10, batch norm per rank)", {"lenet", "cifar"});
    cli.add("--zero", &f.zero, "ZeRO stage: 0 (every rank keeps the optimizer's whole state) or 1 (sharded)", Cli::between(0, 1));
    cli.add("--no-overlap", &f.no_overlap, "one all-reduce after backward, not buckets during it");
    cli.add("--bucket-mb", &f.bucket_mb, "gradient bucket size in MiB (DDP's default: 25)", Cli::positive());
    cli.add("--backend", &f.backend, "mpi, or nccl (make CUDA=1, --device cuda, one GPU per rank)", {"mpi", "nccl"});
    cli.add("--comm-timeout", &f.timeout, "seconds a collective waits for the other ranks before it fails", Cli::positive());
    cli.add("--measure", &f.measure, "time this many steps: compute, communication, memory, cost model; then stop", Cli::at_least(0));
    const char* one_process = "it times one process's step; with several ranks, --measure N times compute and communication";
    cli.refuse("--find-batch-size", one_process);
    cli.refuse("--time-report", one_process);
    cli.refuse("--time-svg", "it draws --time-report's table, which lesson-12 does not take (--measure N instead)");
    cli.parse(argc, argv);
    if (f.measure > 0) {
        flags.refuse_training_flags("--measure N times N steps and stops", {"--lr"});
        KILN_USAGE_CHECK(flags.save.empty(), "--save: --measure N times N steps and stops, with nothing to save");
    }

    start_ranks(mpi, cli, flags);  // the same flags everywhere, the cores shared out, rank 0 speaks
    KILN_USAGE_CHECK(!(f.zero == 1 && flags.amp == DType::F16), "--zero 1 reduces the gradients inside the optimizer "
                     "step, after a GradScaler would have checked them for inf/NaN on one rank only: use --amp bf16 (no "
                     "scaler) or --zero 0");
    KILN_USAGE_CHECK(f.zero == 0 || !cli.given("--bucket-mb") , "--bucket-mb sizes the buckets of plain data parallel "
                     "training; --zero 1 reduces the whole slab in the optimizer step");
    const Device device = flags.apply();
    const auto start = std::chrono::steady_clock::now();
    std::unique_ptr<Communicator> nccl = nccl_or_none(f, mpi);
    Communicator& comm = nccl ? *nccl : mpi;
    comm.set_timeout(f.timeout);

    std::unique_ptr<MnistData> mnist;
    std::unique_ptr<CifarData> cifar;
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net;
    if (f.model == "lenet") {
        mnist = std::make_unique<MnistData>(flags, device);
        net = lenet(rng);
    } else {
        flags.data = flags.data == "data/mnist" ? "data/cifar10" : flags.data;
        cifar = std::make_unique<CifarData>(flags, device);
        net = cifar_net(rng);
    }
    DataLoader& train = mnist ? mnist->train : cifar->train;
    DataLoader& test = mnist ? mnist->test : cifar->test;
    Sequential& model = *net;
    model.to(device);

    // The optimizer: SGD with momentum (weight decay 5e-4 on the CIFAR net's weights), its state
    // whole on every rank, or sharded (ZeRO-1).
    const float wd = f.model == "cifar" ? 5e-4f : 0.0f;
    flags.use("--lr");
    const SGD::Options sgd_options = SGD::Options{}.with_momentum(0.9f);
    auto make_sgd = [&](std::vector<ParamGroup> groups) -> std::unique_ptr<Optimizer> {
        return std::make_unique<SGD>(std::move(groups), sgd_options);
    };
    std::unique_ptr<Optimizer> optimizer;
    std::unique_ptr<DataParallel> ddp;
    if (f.zero == 1) {
        optimizer = std::make_unique<ZeroOptimizer>(model, decay_groups(model, flags.lr, wd), comm, make_sgd);
    } else {
        optimizer = make_sgd(decay_groups(model, flags.lr, wd));
        ddp = std::make_unique<DataParallel>(
            model, comm, DataParallelOptions{int64_t(f.bucket_mb * (1 << 20)), !f.no_overlap, true});
    }
    flags.apply_memory_limit(device);
    std::printf("lesson-12: %s, %lld parameters, %d rank(s) (%s) × %lld images = batch %lld, %s, device %s\n",
                f.model == "lenet" ? "LeNet" : "CIFAR net", (long long)model.num_parameters(), comm.size(),
                comm.backend().c_str(), (long long)(flags.batch_size / comm.size()), (long long)flags.batch_size,
                f.zero ? "ZeRO-1 (optimizer state sharded)"
                       : (std::to_string(ddp->buckets().size()) + " gradient bucket(s), overlap " +
                          (f.no_overlap ? "off" : "on")).c_str(),
                device_name(device));

    BumpAllocator arena("step arena", device);
    if (f.measure > 0) {
        measure(model, *optimizer, train, ddp.get(), comm, f, arena);
        flags.check_used();
        return 0;
    }
    const double test_acc = fit(model, *optimizer, train, test, flags, &arena);
    if (ddp)
        std::printf("communication: %lld all-reduces, %s, %.1f s waited for after backward\n",
                    (long long)ddp->stats().all_reduces, format_bytes(ddp->stats().bytes).c_str(),
                    ddp->stats().wait_seconds);
    report(flags, device, test_acc, start);
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_ranks("lesson-12", argc, argv, run); }
