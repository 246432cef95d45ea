// qsteps.h — the int8 network's steps (the list in qmodel.h): what each one computes, saves and
// prints. convert.cpp makes them from an f32 model, qfile.cpp reads them back from the int8 file,
// qmodel.cpp runs them.
#pragma once
#include <cmath>
#include <sstream>
#include <string>

#include "ops/ops.h"    // kNoCap
#include "ops/quant.h"
#include "quant/qmodel.h"

namespace kiln {

// A step's output range in the file: its scale and zero point ("<key>.scale", "<key>.zero_point").
// The integer range is the network's (quant.qmin, quant.qmax), and a step's input range is the
// output range of the step before it, so neither is stored twice.
void put_range(StateDict& s, const std::string& key, const QParams& qp);
QParams get_range(const StateDict& s, const std::string& key, int32_t qmin, int32_t qmax);
std::string qparams_text(const QParams& qp);  // "scale 0.1 zero point 3 [0, 255]"

// The steps in order, each reading what the one before wrote.
Tensor run_steps(const QSteps& steps, Tensor h);

// f32 images → u8.
class InputStep : public QStep {
public:
    explicit InputStep(QParams qp) : QStep("input", "input"), qp(qp) {}
    Tensor forward(const Tensor& x) const override { return quantize(x, qp, DType::U8); }
    void save(StateDict& s) const override { put_range(s, name, qp); }
    void to(Device) override {}
    std::string describe() const override { return "input    f32 → u8, " + qparams_text(qp); }
    QParams qp;
};

// u8 logits → f32.
class OutputStep : public QStep {
public:
    explicit OutputStep(QParams qp) : QStep("output", "output"), qp(qp) {}
    Tensor forward(const Tensor& x) const override { return dequantize(x, qp); }
    void save(StateDict&) const override {}  // its range is the last step's
    void to(Device) override {}
    std::string describe() const override { return "output   u8 → f32, " + qparams_text(qp); }
    QParams qp;
};

// A convolution or a Linear: i8 weight [O, ...] with one scale per output channel, the bias as
// int32 in units of s_x·s_w[o], and what requantizes the sums (ops/quant.h's QOutput). A fused
// ReLU clamps at the output's zero point, and at its cap (ReLU6: 6) when it has one.
class WeightedStep : public QStep {
public:
    WeightedStep(std::string name, std::string kind, Tensor weight, Tensor weight_scale, Tensor bias, QParams in,
                 QParams out, bool relu, float relu_cap = kNoCap)
        : QStep(std::move(name), std::move(kind)), weight(std::move(weight)), weight_scale(std::move(weight_scale)),
          bias(std::move(bias)), in(in), out(out), relu(relu), relu_cap(relu_cap) {
        const char* op = "WeightedStep";
        check_dtype(this->weight, DType::I8, op, "weight");
        const int64_t O = this->weight.ndim() > 0 ? this->weight.size(0) : 0;
        check_shape(this->weight_scale, Shape{O}, op, "weight_scale");
        check_shape(this->bias, Shape{O}, op, "bias");
        check_dtype(this->weight_scale, DType::F32, op, "weight_scale");
        check_dtype(this->bias, DType::I32, op, "bias");
        make_output();
    }

    Tensor forward(const Tensor& x) const override {
        if (kind == "linear") return qlinear(x, weight, output, in.qmax);
        return qconv2d(x, weight, output, stride, padding, dilation, groups, in.zero_point, in.qmax);
    }

    void save(StateDict& s) const override {
        s.put(name + ".weight", weight);
        s.put(name + ".weight_scale", weight_scale);
        s.put(name + ".bias", bias);
        put_range(s, name, out);
        s.set(name + ".relu", int64_t(relu));
        if (relu && std::isfinite(relu_cap)) s.set(name + ".relu_cap", double(relu_cap));
        if (kind != "conv") return;
        s.set(name + ".stride", stride);
        s.set(name + ".padding", padding);
        s.set(name + ".dilation", dilation);
        s.set(name + ".groups", groups);
    }

    void to(Device device) override {
        weight = weight.to(device), weight_scale = weight_scale.to(device), bias = bias.to(device);
        output.bias = output.bias.to(device), output.requant = output.requant.to(device);
    }

    int64_t bytes() const override { return int64_t(weight.nbytes() + weight_scale.nbytes() + bias.nbytes()); }

    std::string describe() const override {
        std::ostringstream o;
        o << kind << (kind == "conv" ? "     " : "   ") << weight.shape().str() << " i8";
        if (groups > 1) o << " depthwise";
        if (relu) o << " + ReLU";
        if (relu && std::isfinite(relu_cap)) o << " ≤ " << relu_cap;
        o << ", out " << qparams_text(out);
        return o.str();
    }

    Tensor weight, weight_scale, bias;  // i8 [O, ...], f32 [O], i32 [O]
    QParams in, out;
    bool relu;
    float relu_cap;
    int64_t stride = 1, padding = 0, dilation = 1, groups = 1;

private:
    // The kernel's per-channel numbers, from the stored ones (ops/qparams.h):
    //   bias'[o] = bias[o] − z_x · Σ_k w[o, k]        M_o = s_x · s_w[o] / s_y  (as m0 · 2^(−31−shift))
    // and a fused ReLU's clamp: max(0, y) is max(z_y, q), min(y, cap) is min(q, q(cap)).
    void make_output() {
        const Tensor w = weight.to(Device::CPU), ws = weight_scale.to(Device::CPU), b = bias.to(Device::CPU);
        const int64_t O = w.size(0), K = w.numel() / O;
        Tensor b2 = Tensor::empty({O}, DType::I32), rq = Tensor::empty({O, 2}, DType::I32);
        for (int64_t o = 0; o < O; o++) {
            int64_t wsum = 0;
            for (int64_t k = 0; k < K; k++) wsum += w.data<int8_t>()[o * K + k];
            const int64_t folded = int64_t(b.data<int32_t>()[o]) - int64_t(in.zero_point) * wsum;
            KILN_CHECK(std::abs(folded) < (int64_t(1) << 31), name, ": the bias in units of s_x·s_w (", folded,
                       ") does not fit int32; the layer's input or weight scale is far too small");
            b2.data<int32_t>()[o] = int32_t(folded);
            const Requant r = make_requant(double(in.scale) * double(ws.data<float>()[o]) / double(out.scale));
            rq.data<int32_t>()[2 * o] = r.m0;
            rq.data<int32_t>()[2 * o + 1] = r.shift;
        }
        const int32_t hi = relu && std::isfinite(relu_cap)
                               ? quantize_value(relu_cap, 1.0f / out.scale, out.zero_point, out.qmin, out.qmax)
                               : out.qmax;
        const Device d = weight.device();
        output = QLayerOutput{b2.to(d), rq.to(d), out.zero_point, relu ? out.zero_point : out.qmin, hi};
    }

    QLayerOutput output;
};

class MaxPoolStep : public QStep {
public:
    MaxPoolStep(std::string name, int64_t kernel, int64_t stride, int64_t padding)
        : QStep(std::move(name), "maxpool"), kernel(kernel), stride(stride), padding(padding) {}
    Tensor forward(const Tensor& x) const override { return qmaxpool2d(x, kernel, stride, padding); }
    void save(StateDict& s) const override {
        s.set(name + ".kernel", kernel);
        s.set(name + ".stride", stride);
        s.set(name + ".padding", padding);
    }
    void to(Device) override {}
    std::string describe() const override {
        return "maxpool  " + std::to_string(kernel) + "×" + std::to_string(kernel) + " on u8 (scale unchanged)";
    }
    int64_t kernel, stride, padding;
};

class GlobalAvgPoolStep : public QStep {
public:
    explicit GlobalAvgPoolStep(std::string name) : QStep(std::move(name), "avgpool") {}
    Tensor forward(const Tensor& x) const override { return qglobal_avgpool(x); }
    void save(StateDict&) const override {}
    void to(Device) override {}
    std::string describe() const override { return "avgpool  global, [N, C, H, W] → [N, C] on u8 (scale unchanged)"; }
};

// Any function of one value: 256 entries per channel (or one table for all).
class TableStep : public QStep {
public:
    TableStep(std::string name, std::string what, Tensor table, QParams out)
        : QStep(std::move(name), "table"), what(std::move(what)), table(std::move(table)), out(out) {}
    Tensor forward(const Tensor& x) const override { return lookup_u8(x, table); }
    void save(StateDict& s) const override {
        s.put(name + ".table", table);
        s.set(name + ".what", what);
        put_range(s, name, out);
    }
    void to(Device device) override { table = table.to(device); }
    int64_t bytes() const override { return int64_t(table.nbytes()); }
    std::string describe() const override {
        return "table    " + what + ", " + std::to_string(table.size(0)) + "×256 u8, out " + qparams_text(out);
    }
    std::string what;  // "gelu", "relu", "bn", "bn+gelu", ...
    Tensor table;      // u8 [C or 1, 256]
    QParams out;
};

class FlattenStep : public QStep {
public:
    explicit FlattenStep(std::string name) : QStep(std::move(name), "flatten") {}
    Tensor forward(const Tensor& x) const override { return x.reshape({x.size(0), -1}); }
    void save(StateDict&) const override {}
    void to(Device) override {}
    std::string describe() const override { return "flatten  [N, C, H, W] → [N, C·H·W]"; }
};

// A Residual, y = body(x) + x or body(x) + shortcut(x). Both branches read the same u8 x and end
// in ranges of their own (the body's last step's; the shortcut's, or x's); qadd sums them into
// the range observed on the Residual's output:
//   y = z_y + round((s_f·(f − z_f) + s_s·(s − z_s)) / s_y)
class ResidualStep : public QStep {
public:
    ResidualStep(std::string name, QSteps body, QSteps shortcut, QParams body_out, QParams shortcut_out, QParams out)
        : QStep(std::move(name), "residual"), body(std::move(body)), shortcut(std::move(shortcut)),
          body_out(body_out), shortcut_out(shortcut_out), out(out) {}

    Tensor forward(const Tensor& x) const override {
        const Tensor f = run_steps(body, x);
        return qadd(f, body_out, shortcut.empty() ? x : run_steps(shortcut, x), shortcut_out, out);
    }
    void save(StateDict& s) const override {
        for_each_step([&](QStep& step) { step.save(s); });
        put_range(s, name, out);
    }
    void to(Device device) override {
        for_each_step([&](QStep& step) { step.to(device); });
    }
    int64_t bytes() const override {
        int64_t total = 0;
        for_each_step([&](QStep& step) { total += step.bytes(); });
        return total;
    }
    std::string describe() const override {
        return "residual the body's " + std::to_string(body.size()) + " steps + " +
               (shortcut.empty() ? std::string("the input") : "the shortcut's " + std::to_string(shortcut.size()) + " steps") +
               ", sum " + qparams_text(out);
    }

    QSteps body, shortcut;
    QParams body_out, shortcut_out, out;

private:
    // f(step) for every step of both branches, the body's first.
    template <typename F>
    void for_each_step(F f) const {
        for (const QSteps* branch : {&body, &shortcut})
            for (const auto& step : *branch) f(*step);
    }
};

}  // namespace kiln
