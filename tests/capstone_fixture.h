// capstone_fixture.h — lesson 13's setup for the tests that train its net a few steps
// (test_trainers.cpp on the CPU, test_capstone_models.cpp on CUDA): a fixed random batch, the
// whitening's sample, airbench's net and lesson 13's optimizer.
#pragma once
#include <cstdint>
#include <memory>

#include "core/rng.h"
#include "optim/optimizer.h"
#include "train/airbench.h"

namespace kiln::test {

// `images` random images x [images, 3, 32, 32] with labels y, and `whitening` more images for
// the stem's whitening, all drawn from seed 7.
struct CapstoneBatch {
    CapstoneBatch(int64_t images, int64_t whitening) {
        Rng data(7);
        x = Tensor::normal({images, 3, 32, 32}, 0, 1, data);
        sample = Tensor::normal({whitening, 3, 32, 32}, 0, 1, data);
        y = Tensor::empty({images}, DType::I32);
        for (int64_t i = 0; i < images; i++) y.data<int32_t>()[i] = int32_t(data.next_below(10));
    }
    Tensor x, y, sample;
};

// airbench's net from seed 1, whitened from `sample`, its 3×3 convs identity-started.
inline std::unique_ptr<Sequential> capstone_net(const Tensor& sample) {
    Rng rng(1);
    return airbench_net(rng, &sample, true);
}

// Lesson 13's optimizer at its defaults: three parameter groups, Nesterov SGD, momentum 0.85.
inline SGD capstone_sgd(Sequential& model) {
    return SGD(airbench_groups(model, 1.5f, 0.0019957f, 64.0f, true), SGD::Options{}.with_momentum(0.85f).with_nesterov());
}

}  // namespace kiln::test
