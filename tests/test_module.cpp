// test_module.cpp — the module tree (names built like PyTorch's state_dict keys, replacing a
// child), hooks, the allocation context an observer sees, and the input_needs_grad flag a
// Sequential passes to its leading layers.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "fixtures.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "nn/norm.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "train/checkpoint.h"
#include "train/loop.h"

using namespace kiln;
using Catch::Contains;

namespace {
std::vector<std::string> names_of(const std::vector<std::pair<std::string, Parameter*>>& named) {
    std::vector<std::string> names;
    for (const auto& [name, p] : named) {
        REQUIRE(p->name == name);  // the parameter knows its full name too
        names.push_back(name);
    }
    return names;
}
}  // namespace

TEST_CASE("the tree names parameters and buffers like PyTorch's state_dict", "[module][cpu][lesson02]") {
    Rng rng(1);
    auto mlp_net = mlp(rng, 8, 4);
    REQUIRE(names_of(mlp_net->named_parameters()) ==
            std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"});
    std::vector<std::string> children;
    for (const Module::Child& c : mlp_net->children()) children.push_back(c.name);
    REQUIRE(children == std::vector<std::string>{"0", "fc1", "2", "fc2", "4", "fc3"});  // by position unless named

    auto cifar = cifar_net(rng, {4, 4, 4});
    const std::vector<std::string> params = names_of(cifar->named_parameters());
    REQUIRE(params.front() == "stem.weight");
    REQUIRE(params[2] == "block1a.conv.weight");
    REQUIRE(params[3] == "block1a.bn.weight");
    REQUIRE(params.back() == "head.weight");
    auto buffers = cifar->named_buffers();
    REQUIRE(buffers.size() == 12);  // 6 batch norms × (running_mean, running_var)
    REQUIRE(buffers[0].first == "block1a.bn.running_mean");
    REQUIRE(buffers[1].first == "block1a.bn.running_var");
    // "", stem, stem_gelu, block1a, block1a.conv, block1a.pool, block1a.bn, ...
    REQUIRE(&cifar->module_at("block1a.bn") == cifar->named_modules()[6].second);
}

TEST_CASE("named_modules walks the tree depth first; name() is the full name", "[module][cpu][lesson02]") {
    Rng rng(1);
    Sequential outer("outer");
    auto inner = std::make_unique<Sequential>("inner");
    inner->add("fc", std::make_unique<Linear>(2, 2, rng));  // named before inner has a parent
    outer.add("block", std::move(inner));
    outer.emplace<ReLU>();
    std::vector<std::string> names;
    for (auto& [name, m] : outer.named_modules()) names.push_back(name + "=" + m->name());
    REQUIRE(names == std::vector<std::string>{"=outer", "block=block", "block.fc=block.fc", "1=1"});
    REQUIRE(outer.parameters()[0]->name == "block.fc.weight");  // renamed when adopted
    REQUIRE_THROWS_WITH(outer.add("block", std::make_unique<ReLU>()), Contains("already a child named \"block\""));
    REQUIRE_THROWS_WITH(outer.module_at("block.conv"), Contains("no child \"conv\""));
    outer.eval();
    REQUIRE(!outer.module_at("block.fc").training());  // train()/eval() reach every module
}

TEST_CASE("replace_child swaps one layer in place and returns the old one", "[module][cpu][lesson02]") {
    Rng rng(1);
    auto net = mlp(rng, 8, 4);
    net->eval();
    Module* old_fc2 = &net->module_at("fc2");
    std::unique_ptr<Module> old = net->replace_child("fc2", std::make_unique<Linear>(8, 4, rng, false));
    REQUIRE(old.get() == old_fc2);
    REQUIRE(!net->module_at("fc2").training());  // takes the mode of the one it replaces
    REQUIRE(names_of(net->named_parameters()) ==
            std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc3.weight", "fc3.bias"});
    // the path form reaches inside containers
    auto cifar = cifar_net(rng, {4, 4, 4});
    cifar->replace_child("block2b.gelu", std::make_unique<ReLU>());
    REQUIRE(cifar->module_at("block2b.gelu").name() == "block2b.gelu");
    REQUIRE_THROWS_WITH(cifar->replace_child("block2b.nothing", std::make_unique<ReLU>()), Contains("block2b.nothing"));
    Tensor y = cifar->call(Tensor::ones({2, 3, 32, 32}));
    REQUIRE(y.shape() == Shape{2, 10});
}

TEST_CASE("hooks run around forward and backward, may replace results, and can be removed", "[module][cpu][lesson02]") {
    Rng rng(1);
    auto net = mlp(rng, 8, 4);
    Module& fc2 = net->module_at("fc2");
    std::vector<std::string> log;
    HookHandle pre = fc2.register_forward_pre_hook([&](Module& m, const Tensor& x) {
        log.push_back("pre " + m.name() + " " + x.shape().str());
    });
    HookHandle post = fc2.register_forward_hook([&](Module& m, const Tensor&, Tensor& y) {
        log.push_back("forward " + m.name() + " " + y.shape().str());
    });
    HookHandle back_pre = net->module_at("fc3").register_backward_pre_hook([&](Module& m, const Tensor& dy) {
        log.push_back("backward pre " + m.name() + " " + dy.shape().str());
    });
    HookHandle back = net->module_at("fc3").register_backward_hook([&](Module& m, const Tensor& dy, Tensor& dx) {
        log.push_back("backward " + m.name() + " " + dy.shape().str() + " -> " + dx.shape().str());
        dx = Tensor::zeros(dx.shape());  // what reaches fc2: nothing
    });
    Tensor x = Tensor::ones({3, 1, 28, 28});
    net->call(x);
    net->call_backward(Tensor::ones({3, 10}));
    REQUIRE(log == std::vector<std::string>{"pre fc2 [3, 8]", "forward fc2 [3, 4]", "backward pre fc3 [3, 10]",
                                            "backward fc3 [3, 10] -> [3, 4]"});
    REQUIRE(static_cast<Linear&>(fc2).weight.grad.get({0, 0}) == 0);  // the hook's zero dx reached fc2
    REQUIRE(static_cast<Linear&>(fc2).bias.grad.get({0}) == 0);
    pre.remove();
    post.remove();
    back_pre.remove();
    back.remove();
    pre.remove();  // twice: nothing
    log.clear();
    net->call(x);
    net->call_backward(Tensor::ones({3, 10}));
    REQUIRE(log.empty());
}

TEST_CASE("an allocation observer sees each allocation's module and phase", "[module][allocator][cpu][lesson02]") {
    Rng rng(1);
    auto net = mlp(rng, 8, 4);
    net->input_needs_grad = false;
    Tensor x = Tensor::ones({3, 1, 28, 28}), dy = Tensor::ones({3, 10});
    std::map<std::string, int64_t> bytes;  // "fc2 forward" -> bytes allocated
    std::map<const Module*, std::string> names;
    for (auto& [name, m] : net->named_modules()) names[m] = name;
    set_allocation_observer([&](const AllocationEvent& e) {  // on the allocating thread: its context
        const AllocationContext c = current_context();
        if (!e.freed) bytes[names[c.module] + " " + phase_name(c.phase)] += e.bytes;
    });
    Tensor y = net->call(x);
    net->call_backward(dy);
    {
        ContextScope optimizer(Phase::Optimizer);
        Tensor state = Tensor::zeros({5});
    }
    set_allocation_observer(nullptr);
    Tensor after = Tensor::zeros({7});  // no observer: not counted
    // fc2's output [3, 4] in the forward phase; its dx [3, 8] in the backward phase
    REQUIRE(bytes["fc2 forward"] == 3 * 4 * 4);
    REQUIRE(bytes["fc2 backward"] == 3 * 8 * 4);
    REQUIRE(bytes["fc1 backward"] == 0);  // the first Linear computes no dx (input_needs_grad)
    REQUIRE(bytes[" optimizer"] == 5 * 4);
    REQUIRE(bytes.count(" other") == 0);
}

TEST_CASE("Sequential passes input_needs_grad through leading layers without parameters", "[module][cpu][lesson02]") {
    Rng rng(1);
    auto net = mlp(rng, 8, 4);
    net->input_needs_grad = false;
    net->call(Tensor::ones({2, 1, 28, 28}));
    REQUIRE(!net->call_backward(Tensor::ones({2, 10})).defined());
    REQUIRE(!net->module_at("0").input_needs_grad);    // Flatten
    REQUIRE(!net->module_at("fc1").input_needs_grad);  // the first layer with parameters
    REQUIRE(net->module_at("2").input_needs_grad);     // after fc1: fc1's weights need dL/dy
    net->input_needs_grad = true;
    net->call(Tensor::ones({2, 1, 28, 28}));
    REQUIRE(net->call_backward(Tensor::ones({2, 10})).shape() == Shape{2, 1, 28, 28});
}

// ---- slabs ------------------------------------------------------------------------------------
namespace {
// Every parameter and gradient of `m` is a view of its slab.
void require_in_slabs(Module& m) {
    REQUIRE(m.packed());
    const Tensor grads = m.grads_view();
    const Tensor first = m.parameters()[0]->value;
    for (Parameter* p : m.parameters()) {
        INFO(p->name);
        REQUIRE(p->value.shares_storage(first));
        REQUIRE(p->grad.shares_storage(grads));
        REQUIRE(p->value.offset() == p->grad.offset());  // the two slabs are laid out alike
        REQUIRE(p->value.offset() % Slab::kAlign == 0);
    }
}
}  // namespace

TEST_CASE("pack puts parameters and gradients in two slabs; grads_view is the flat gradient", "[module][cpu][lesson02]") {
    Rng rng(1);
    Sequential net("net");
    net.emplace<Flatten>();
    net.add("fc1", std::make_unique<Linear>(6, 5, rng));
    net.add("fc2", std::make_unique<Linear>(5, 3, rng));
    const Tensor w_before = net.parameters()[0]->value.clone();
    REQUIRE(!net.packed());
    REQUIRE_THROWS_WITH(net.grads_view(), Contains("pack()"));
    net.pack();
    require_in_slabs(net);
    test::require_identical(net.parameters()[0]->value, w_before);  // values copied in
    // [5·6 | pad | 5 | pad | 3·5 | pad | 3]: four segments, each at a multiple of 64 floats
    REQUIRE(net.grads_view().numel() == 3 * 64 + 3);
    REQUIRE(net.grads_view().category() == Category::Gradient);
    net.call(Tensor::ones({2, 1, 2, 3}));
    net.call_backward(Tensor::ones({2, 3}));
    REQUIRE(sum(net.grads_view()) != 0.0);  // backward wrote into the slab
    net.zero_grad();                        // one fill of the slab
    REQUIRE(sum_squares(net.grads_view()) == 0.0);
    // replacing a layer leaves the slabs: pack again
    net.replace_child("fc2", std::make_unique<Linear>(5, 3, rng));
    REQUIRE(!net.packed());
    net.pack();
    require_in_slabs(net);
}

// What ZeRO-2 (dist/zero2.h) does to the model: the gradient slab goes, the value slab stays; and
// what ZeRO-3 (dist/zero3.h) does: the value slab goes too.
TEST_CASE("drop_grad_slab lets the gradients go and keeps the value slab; drop_value_slab then lets the values go", "[module][cpu][lesson15]") {
    Rng rng(1);
    Sequential net("net");
    net.add("fc1", std::make_unique<Linear>(6, 5, rng));
    net.add("fc2", std::make_unique<Linear>(5, 3, rng));
    net.pack();
    const Tensor values = net.values_view();
    net.drop_grad_slab();
    REQUIRE(!net.packed());
    for (Parameter* p : net.parameters()) REQUIRE_FALSE(p->grad.defined());
    REQUIRE(net.values_view().raw() == values.raw());  // the parameters stay where they were
    REQUIRE_THROWS_WITH(net.grads_view(), Contains("pack()"));
    REQUIRE_THROWS_WITH(net.drop_grad_slab(), Contains("not packed"));
    net.zero_grad();  // passes the undefined grads by
    net.pack();       // and pack() brings a zero slab back
    require_in_slabs(net);
    REQUIRE(sum_squares(net.grads_view()) == 0.0);

    // ZeRO-3 lets the values go too, the gradients first
    REQUIRE_THROWS_WITH(net.drop_value_slab(), Contains("drop_grad_slab"));
    net.drop_grad_slab();
    net.drop_value_slab();
    for (Parameter* p : net.parameters()) REQUIRE_FALSE(p->value.defined());
    REQUIRE_THROWS_WITH(net.values_view(), Contains("pack()"));
}

TEST_CASE("the chapter models come packed; to() and loading a checkpoint keep the slabs", "[module][cuda][lesson04]") {
    Rng rng(1);
    auto net = lenet(rng);
    require_in_slabs(*net);
    StateDict saved;
    save_model(saved, *net);
    load_model(saved, *net);
    require_in_slabs(*net);
    const Tensor w = net->parameters()[2]->value.clone();
    net->to(Device::CUDA);
    require_in_slabs(*net);
    REQUIRE(net->grads_view().device() == Device::CUDA);
    net->to(Device::CPU);
    require_in_slabs(*net);
    test::require_identical(net->parameters()[2]->value, w);
}

TEST_CASE("optimizer state is one slab laid out like the parameters", "[module][optim][cpu][lesson07]") {
    Rng rng(1);
    auto net = mlp(rng, 8, 4);
    std::map<const char*, int64_t> state;  // Category::OptimizerState bytes allocated per optimizer
    for (const char* which : {"sgd", "adam"}) {
        int64_t allocations = 0;
        set_allocation_observer([&](const AllocationEvent& e) {
            if (!e.freed && e.category == Category::OptimizerState) allocations++;
        });
        std::unique_ptr<Optimizer> opt;
        if (std::string(which) == "sgd") opt = std::make_unique<SGD>(net->parameters(), 0.1f,
                                                                     SGD::Options{}.with_momentum(0.9f));
        else opt = std::make_unique<Adam>(net->parameters(), 0.1f);
        opt->step();
        set_allocation_observer(nullptr);
        state[which] = allocations;
    }
    REQUIRE(state["sgd"] == 1);   // the momentum buffers: one slab
    REQUIRE(state["adam"] == 2);  // exp_avg and exp_avg_sq: a slab each
}

TEST_CASE("a packed model trains to the same bits as an unpacked one", "[module][optim][cpu][lesson07]") {
    auto build = [](bool pack) {
        Rng rng(3);
        auto m = std::make_unique<Sequential>("net");
        m->emplace<Flatten>();
        m->add("fc1", std::make_unique<Linear>(12, 8, rng));
        m->emplace<ReLU>();
        m->add("fc2", std::make_unique<Linear>(8, 3, rng));
        if (pack) m->pack();
        return m;
    };
    Rng data(4);
    const Tensor x = Tensor::normal({5, 3, 2, 2}, 0, 1, data);
    Tensor y = Tensor::zeros({5}, DType::I32);
    y.set({1}, 2);
    y.set({3}, 1);
    for (int which = 0; which < 2; which++) {
        auto plain = build(false), packed = build(true);
        auto make = [&](Module& m) -> std::unique_ptr<Optimizer> {
            if (which == 0) return std::make_unique<SGD>(decay_groups(m, 0.1f, 0.01f),
                                                         SGD::Options{}.with_momentum(0.9f).with_nesterov());
            return std::make_unique<AdamW>(decay_groups(m, 0.01f, 0.1f),
                                           Adam::Options{}.with_betas(0.9f, 0.99f).with_amsgrad());
        };
        auto a = make(*plain), b = make(*packed);
        for (int step = 0; step < 3; step++) {
            REQUIRE(train_step(*plain, *a, x, y, {}).loss == train_step(*packed, *b, x, y, {}).loss);
        }
        for (size_t i = 0; i < plain->parameters().size(); i++)
            test::require_identical(packed->parameters()[i]->value, plain->parameters()[i]->value);
    }
}
