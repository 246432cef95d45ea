// test_cuda_launch.cpp — KILN_SYNC_LAUNCHES=1: every launch checked by KILN_CHECK_LAUNCH waits
// for its kernel, so an asynchronous fault is blamed on the kernel that made it. The switch is
// read from the environment; the count of launches that waited shows whether it was honoured.
//
//   make test T='[cuda][launch]'
#include <catch2/catch.hpp>

#include <cstdlib>

#include "core/cuda_memory.h"
#include "core/tensor.h"
#include "ops/ops.h"

using namespace kiln;

namespace {

// Runs one elementwise kernel (add) on the device and returns how many launches waited.
int64_t syncs_of_one_add() {
    const Tensor a = Tensor::ones({1000}, DType::F32, Device::CUDA);
    const int64_t before = cuda::launch_syncs();
    const Tensor c = add(a, a);
    REQUIRE(c.to(Device::CPU).data<float>()[999] == 2.0f);
    return cuda::launch_syncs() - before;
}

// Sets KILN_SYNC_LAUNCHES for one scope (unset when value is null) and restores the switch.
struct ScopedSyncEnv {
    explicit ScopedSyncEnv(const char* value) {
        if (value) setenv("KILN_SYNC_LAUNCHES", value, 1);
        else unsetenv("KILN_SYNC_LAUNCHES");
        cuda::read_sync_launches_env();
    }
    ~ScopedSyncEnv() {
        unsetenv("KILN_SYNC_LAUNCHES");
        cuda::read_sync_launches_env();
    }
};

}  // namespace

TEST_CASE("KILN_SYNC_LAUNCHES=1 makes each launch wait for its kernel", "[cuda][lesson04][launch]") {
    {
        ScopedSyncEnv on("1");
        REQUIRE(syncs_of_one_add() >= 1);
    }
    for (const char* off : {static_cast<const char*>(nullptr), "0", "yes"}) {
        INFO("KILN_SYNC_LAUNCHES=" << (off ? off : "(unset)"));
        ScopedSyncEnv env(off);
        REQUIRE(syncs_of_one_add() == 0);
    }
}
