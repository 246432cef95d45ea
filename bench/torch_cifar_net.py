#!/usr/bin/python3
"""PyTorch CPU reference for kiln's `bench cifar_net_train_cpu`: training throughput of a
fast CIFAR-10 network (the airbench94 layout: 2x2 whitening conv, then three
conv-pool-BN-GELU blocks of widths 64/256/256, Nesterov SGD) on random 32x32 images.
kiln's chapter 06 model, cifar_net in src/nn/models.cpp, has this layout with narrower
widths; bench/bench_train.cpp builds it at these widths. `make bench` (bench/run.sh) runs
this script at the same thread count and prints the ratio.

Usage: /usr/bin/python3 bench/torch_cifar_net.py [THREADS] [BATCH] [SECONDS]
Prints training images per second. Needs Debian's python3-torch.
"""
import sys, time, torch, torch.nn as nn, torch.nn.functional as F

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
B = int(sys.argv[2]) if len(sys.argv) > 2 else 256
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 10
torch.set_num_threads(threads)
torch.manual_seed(0)

def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.MaxPool2d(2),
                         nn.BatchNorm2d(cout), nn.GELU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.GELU())

net = nn.Sequential(nn.Conv2d(3, 24, 2), nn.GELU(), block(24, 64), block(64, 256), block(256, 256),
                    nn.MaxPool2d(3), nn.Flatten(), nn.Linear(256, 10, bias=False))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
x, y = torch.randn(B, 3, 32, 32), torch.randint(0, 10, (B,))

def step():
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()

step(); step()
t, n = time.time(), 0
while time.time() - t < secs:
    step()
    n += B
print(f"pytorch {torch.__version__} threads={threads}: {n / (time.time() - t):.0f} train img/s (batch {B})")
