// step_graph.cpp — StepGraph (step_graph.h).
#include "train/step_graph.h"

#include "core/error.h"
#include "optim/optimizer.h"

namespace kiln {

StepGraph::StepGraph() : pool_("cuda graph pool", Device::CUDA), arena_("cuda graph arena", Device::CUDA) {}

std::string StepGraph::refusal(const StepOptions& opt, const Optimizer& optimizer) {
    if (opt.scaler) return "a GradScaler (--amp f16) reads its inf/NaN check back every step";
    if (opt.clip_norm > 0.0f) return "clipping reads the gradients' norm back every step";
    if (opt.amp != DType::F32) return "mixed precision (--amp) is not captured: only f32 steps are";
    if (!opt.loss_log) return "the loss must stay on the device (a LossLog: TrainOptions::loss_read_every > 1)";
    if (!optimizer.can_capture())
        return "only SGD's, Adam's and AdamW's steps are captured: they read their learning rate and bias "
               "corrections from device memory, which this optimizer does not";
    return "";
}

// Records one step on the graph's inputs, in the graph's arena and pool, its losses into the
// graph's log. Nothing runs: the inputs hold a batch only when the graph is launched. The
// optimizer's host code ran once, and counted the step that the next launch takes; its kernels
// read their scalars from the optimizer's device array, written before each launch.
void StepGraph::capture(Module& model, Optimizer& optimizer, const StepOptions& opt) {
    graph_.reset();
    log_.emplace(Device::CUDA, opt.accumulate);
    StepOptions o = opt;
    o.arena = &arena_;
    o.loss_log = &*log_;
    {
        PoolScope private_pool(pool_);
        graph_.capture([&] { train_step(model, optimizer, x_, y_, o); });
    }
    captures_++;
}

StepResult StepGraph::step(Module& model, Optimizer& optimizer, const Tensor& x, const Tensor& y,
                           const StepOptions& opt) {
    const std::string why = refusal(opt, optimizer);
    KILN_CHECK(why.empty(), "--cuda-graph: this step cannot be captured: ", why, ". Run without --cuda-graph");
    KILN_CHECK(x.device() == Device::CUDA, "--cuda-graph: the batch is on ", device_name(x.device()),
               "; CUDA Graphs need --device cuda");
    if (steps_ == 0) {  // as without a graph: the gradients and the optimizer's state are made here
        optimizer.make_capturable();  // from here on its kernels read lr (and t's scalars) from memory
        x_shape_ = x.shape(), y_shape_ = y.shape();
        steps_++;
        return train_step(model, optimizer, x, y, opt);
    }
    if (!(x.shape() == x_shape_ && y.shape() == y_shape_)) return train_step(model, optimizer, x, y, opt);
    if (steps_ == 1) {  // warms the graph's arena and pool up with this step's blocks
        steps_++;
        x_ = Tensor::empty(x_shape_, x.dtype(), Device::CUDA, Category::Data);
        y_ = Tensor::empty(y_shape_, y.dtype(), Device::CUDA, Category::Data);
        StepOptions o = opt;
        o.arena = &arena_;
        PoolScope private_pool(pool_);
        return train_step(model, optimizer, x, y, o);
    }
    if (graph_.empty()) capture(model, optimizer, opt);  // counts the step the launch below takes
    else optimizer.count_replayed_step();
    optimizer.write_scalars(optimizer.steps());  // this step's lr, as the schedule has set it
    x_.copy_from(x);
    y_.copy_from(y);
    graph_.launch();
    opt.loss_log->copy_slots_from(*log_);
    steps_++;
    launches_++;
    StepResult r;
    r.loss_logged = true;
    r.stepped = true;
    return r;
}

}  // namespace kiln
