// lookahead.h — weight averaging for chapter 13's fast CIFAR-10 trainer: airbench's
// "LookaheadState", a slow copy of the weights that the fast ones are pulled back to.
//
//   Lookahead slow(model);                  // slow = the model's weights and statistics, now
//   ... every k steps: slow.update(model, decay);
//   slow.update(model, 1.0f);              // at the end: the model takes the slow weights
//
// update(model, decay), for every parameter and every f32 buffer (batch norm's running mean
// and variance) of the model, in order:
//   slow ← decay · slow + (1 − decay) · fast        (PyTorch: slow.lerp_(fast, 1 − decay))
//   fast ← slow
// decay 0 keeps the fast weights; decay near 1 keeps the old average. Averaging the weights of
// the last steps smooths the noise of SGD's last moves (airbench schedules decay from 0 up to
// 0.95⁵ · (step/steps)³, updating every 5 steps). Costs one copy of the model.
#pragma once
#include <string>
#include <vector>

#include "core/state.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace kiln {

class Lookahead {
public:
    explicit Lookahead(Module& model);
    void update(Module& model, float decay);
    // "<prefix>.<name>" for each slow tensor, for a resumed run (train/checkpoint.h).
    void save_state(StateDict& state, const std::string& prefix) const;
    void load_state(const StateDict& state, const std::string& prefix);

private:
    std::vector<std::pair<std::string, Tensor*>> tensors_of(Module& model) const;  // what is averaged
    std::vector<std::string> names_;
    std::vector<Tensor> slow_;
};

}  // namespace kiln
