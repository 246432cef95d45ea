#!/usr/bin/python3
"""PyTorch twins of the chapter models kiln trains on a GPU (`bench_train cuda`, bench/bench_train.cpp:
its gpu_models), each on random inputs of the real shape with the same batch and SGD settings, on
the same GPU: in f32 with TF32 off, and under bf16 autocast (torch.autocast, as kiln's --amp bf16).
scripts/gpu-check.sh runs it after kiln's and prints the two side by side with their ratios.

  mlp             chapter 04's MLP 784-512-256-10, batch 64, momentum 0.9
  lenet           chapter 05's LeNet (bench/torch_lenet.py), batch 64, momentum 0.9
  mlp_300_100     chapter 10's LeNet-300-100, batch 64, momentum 0.9
  cifar_net_l06   chapter 06's CIFAR net, widths 32/64/128, batch 128, Nesterov 0.9, weight decay 5e-4
  cifar_net_l07   chapter 07's, 48/96/192, batch 128, the same SGD
  cifar_net       64/256/256 (the capstone's widths), batch 256, the same SGD
  mobilenet_v2    chapter 13's MobileNetV2 (bench/torch_train.py), width 1.0, batch 128, the same SGD

Usage: python3 bench/torch_train_gpu.py [--device cuda|cpu] [--seconds S] [MODEL ...]
--device cpu runs the same code on the CPU (the GPU check's dry run, where no GPU is). Each model
and precision trains for about S seconds (default 1) after 5 warm-up steps. Prints per model
    bench torch_NAME_params: N parameters
    bench torch_NAME_train_cuda: X img/s          (f32, TF32 off; _cpu with --device cpu)
    bench torch_NAME_train_cuda_bf16: X img/s
Works with PyTorch 1.13 (Debian's python3-torch) and 2.x.
"""
import sys, time, torch, torch.nn.functional as F

from torch_lenet import LeNet                     # bench/torch_lenet.py
from torch_train import mlp, cifar_net, mobilenet_v2, tf32_off  # bench/torch_train.py

MOMENTUM, NESTEROV = dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=5e-4)
MODELS = {  # name: (network, batch, input shape, SGD settings), as bench_train.cpp's gpu_models
    'mlp': (lambda: mlp(), 64, (1, 28, 28), MOMENTUM),
    'lenet': (lambda: LeNet(), 64, (1, 28, 28), MOMENTUM),
    'mlp_300_100': (lambda: mlp(300, 100), 64, (1, 28, 28), MOMENTUM),
    'cifar_net_l06': (lambda: cifar_net(32, 64, 128), 128, (3, 32, 32), NESTEROV),
    'cifar_net_l07': (lambda: cifar_net(48, 96, 192), 128, (3, 32, 32), NESTEROV),
    'cifar_net': (lambda: cifar_net(), 256, (3, 32, 32), NESTEROV),
    'mobilenet_v2': (lambda: mobilenet_v2(), 128, (3, 32, 32), NESTEROV),
}


def rate(name, dev, amp, seconds):
    """Training images per second of model `name` on dev, in f32 (amp None) or under bf16 autocast."""
    build, B, shape, sgd = MODELS[name]
    torch.manual_seed(0)
    net = build().to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, **sgd)
    x, y = torch.randn(B, *shape, device=dev), torch.randint(0, 10, (B,), device=dev)

    def step():
        opt.zero_grad()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp is not None):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    def timed(n):
        if dev.type == 'cuda':
            torch.cuda.synchronize()
        t = time.time()
        for _ in range(n):
            step()
        if dev.type == 'cuda':
            torch.cuda.synchronize()
        return time.time() - t

    timed(5)                                         # warm-up: kernels loaded, allocator grown
    n = max(1, int(seconds / max(timed(3) / 3, 1e-6)))  # steps for about `seconds`
    return n * B / timed(n), sum(p.numel() for p in net.parameters())


def main():
    args, dev, seconds = sys.argv[1:], 'cuda', 1.0
    while args and args[0].startswith('--'):
        flag, value = args[0], args[1] if len(args) > 1 else ''
        if flag == '--device':
            dev = value
        elif flag == '--seconds':
            seconds = float(value)
        else:
            sys.exit(f"torch_train_gpu.py: unknown flag {flag}; see the usage at the top of this file")
        args = args[2:]
    names = args or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        sys.exit(f"torch_train_gpu.py: unknown model {unknown[0]!r}; the models: {' '.join(MODELS)}")
    if dev == 'cuda' and not torch.cuda.is_available():
        sys.exit(f"torch_train_gpu.py: this PyTorch ({torch.__version__}) sees no CUDA GPU; --device cpu runs on the CPU")
    dev = torch.device(dev)
    tf32_off()
    where = torch.cuda.get_device_name() if dev.type == 'cuda' else 'the CPU'
    print(f"pytorch {torch.__version__} on {where}: f32 with TF32 off, and bf16 autocast")
    for name in names:
        f32, params = rate(name, dev, None, seconds)
        bf16, _ = rate(name, dev, torch.bfloat16, seconds)
        print(f"bench torch_{name}_params: {params} parameters")
        print(f"bench torch_{name}_train_{dev.type}: {f32:.1f} img/s")
        print(f"bench torch_{name}_train_{dev.type}_bf16: {bf16:.1f} img/s")
        sys.stdout.flush()


if __name__ == '__main__':
    main()
