#!/usr/bin/python3
"""PyTorch CPU references for kiln's `bench_train` figures: a chapter model trained on random
inputs of the real shape (the data pipeline is not what is measured), its images per second.
`make bench` (bench/run.sh) runs it beside kiln's figure at the same thread count and prints
the ratio. The models, each the layout of its kiln twin in src/nn/models.cpp:

  mlp            chapter 02's MLP 784-512-256-10 (kiln: mlp), SGD momentum 0.9; mlp(300, 100) is
                 chapter 10's LeNet-300-100
  cifar_net      a fast CIFAR-10 network (the airbench94 layout: 2x2 conv 3->24 with GELU, then
                 three conv-pool-BN-GELU blocks), widths 64/256/256 (kiln: cifar_net, chapters
                 06 and 13); cifar_net:32,64,128 gives lesson 06's widths. SGD Nesterov 0.9
  mobilenet_v2   chapter 13's MobileNetV2 for 32x32 images (kiln: mobilenet_v2, width 1.0:
                 torchvision's table with stage 2's stride 1), SGD Nesterov 0.9

Usage: /usr/bin/python3 bench/torch_train.py MODEL [THREADS] [BATCH] [SECONDS]
Prints one line: training images per second and the model's parameters (run.sh checks them
against kiln's, so that the two are the same network). Needs Debian's python3-torch (no torchvision).
bench/torch_train_gpu.py trains the same models on a GPU.
"""
import sys, time, torch, torch.nn as nn, torch.nn.functional as F


def mlp(h1=512, h2=256):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, h1), nn.ReLU(inplace=True),
                         nn.Linear(h1, h2), nn.ReLU(inplace=True), nn.Linear(h2, 10))


def tf32_off():
    """f32 matrix products and convolutions in f32, not TF32 (kiln's kernels compute in f32). PyTorch
    >= 2.9 has one setting per backend and refuses a mix with the older flags; before it, cuDNN's
    allow_tf32 (on by default) and cuBLAS's."""
    if hasattr(torch.backends.cudnn, 'conv') and hasattr(torch.backends.cudnn.conv, 'fp32_precision'):
        torch.backends.cudnn.conv.fp32_precision = 'ieee'
        torch.backends.cuda.matmul.fp32_precision = 'ieee'
    else:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False


def cifar_net(w1=64, w2=256, w3=256, stem=24):
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.MaxPool2d(2),
                             nn.BatchNorm2d(cout), nn.GELU(),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.GELU())
    return nn.Sequential(nn.Conv2d(3, stem, 2), nn.GELU(), block(stem, w1), block(w1, w2), block(w2, w3),
                         nn.MaxPool2d(3), nn.Flatten(), nn.Linear(w3, 10, bias=False))


def divisible(v, d=8):
    """torchvision's _make_divisible: v to the nearest multiple of d, one more if that lost > 10%."""
    r = max(d, int(v + d / 2) // d * d)
    return r + d if r < 0.9 * v else r


def conv_bn_relu6(cin, cout, k, stride=1, groups=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6(inplace=True)) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """expand 1x1 (unless t = 1) -> depthwise 3x3 -> project 1x1, plus x when the shape stays."""
    def __init__(s, cin, cout, stride, t):
        super().__init__()
        h = cin * t
        expand = [conv_bn_relu6(cin, h, 1)] if t != 1 else []
        s.body = nn.Sequential(*expand, conv_bn_relu6(h, h, 3, stride, h), conv_bn_relu6(h, cout, 1, act=False))
        s.residual = stride == 1 and cin == cout
    def forward(s, x):
        return x + s.body(x) if s.residual else s.body(x)


def mobilenet_v2(classes=10):
    stages = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    cin = divisible(32)
    layers = [conv_bn_relu6(3, cin, 3)]
    for t, c, n, s in stages:
        for i in range(n):
            layers.append(InvertedResidual(cin, divisible(c), s if i == 0 else 1, t))
            cin = divisible(c)
    return nn.Sequential(*layers, conv_bn_relu6(cin, 1280, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(1280, classes))


def main():
    model = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    B = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    secs = float(sys.argv[4]) if len(sys.argv) > 4 else 10
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    name, _, widths = model.partition(':')
    if name == 'mlp':
        net, shape, sgd = mlp(), (B, 1, 28, 28), dict(momentum=0.9)
    elif name == 'cifar_net':
        net = cifar_net(*[int(w) for w in widths.split(',')] if widths else [])
        shape, sgd = (B, 3, 32, 32), dict(momentum=0.9, nesterov=True, weight_decay=5e-4)
    elif name == 'mobilenet_v2':
        net, shape, sgd = mobilenet_v2(), (B, 3, 32, 32), dict(momentum=0.9, nesterov=True, weight_decay=5e-4)
    else:
        sys.exit(f"torch_train.py: unknown model {model!r}; use mlp, cifar_net[:W1,W2,W3] or mobilenet_v2")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, **sgd)
    x, y = torch.randn(*shape), torch.randint(0, 10, (B,))

    def step():
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    step(); step()
    t, n = time.time(), 0
    while time.time() - t < secs:
        step()
        n += B
    rate, params = n / (time.time() - t), sum(p.numel() for p in net.parameters())
    print(f"pytorch {torch.__version__} threads={threads} {model}: {rate:.1f} train img/s (batch {B}, {params} parameters)")


if __name__ == '__main__':
    main()
