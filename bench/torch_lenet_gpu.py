#!/usr/bin/python3
"""PyTorch GPU reference for lesson 05: one training epoch of the LeNet of lessons 03 and 05
on MNIST, on the GPU, to set beside `build-cuda/bin/lesson-05 --epochs 1 --device cuda`
(scripts/gpu-check.sh runs both). The CPU twin is bench/torch_lenet.py.

Usage: /usr/bin/python3 bench/torch_lenet_gpu.py [MNIST_DIR] [EPOCHS]
MNIST_DIR holds the four IDX files (plain or .gz); without them (or without a MNIST_DIR) the
epoch runs on 60,000 random 28x28 images, which costs the same. Batch 64, SGD lr 0.01
momentum 0.5, as the lesson; TF32 off (kiln's kernels compute in f32, so PyTorch's
convolutions and matrix products must too). The whole set sits on the GPU, so the loop
measures the training steps, not a data loader. Prints the epoch's seconds and images per second, the
test accuracy when the data is real, and the line
    bench torch_lenet_train_gpu: <images per second> img/s
Needs a PyTorch built with CUDA; exits with status 1 and says so otherwise.
"""
import os, sys, time
import numpy as np, torch, torch.nn.functional as F

from torch_lenet import idx, LeNet  # bench/torch_lenet.py: the IDX reader and the model
from torch_train import tf32_off     # bench/torch_train.py: f32 without TF32

d = sys.argv[1] if len(sys.argv) > 1 else ''
epochs = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
if not torch.cuda.is_available():
    sys.exit(f"torch_lenet_gpu: this PyTorch ({torch.__version__}) sees no CUDA GPU")
dev = torch.device('cuda')
torch.manual_seed(0)

tf32_off()

norm = lambda a: torch.tensor((a / 255.0 - 0.1307) / 0.3081, dtype=torch.float32, device=dev)
real = bool(d) and any(os.path.exists(os.path.join(d, 'train-images-idx3-ubyte' + z)) for z in ('', '.gz'))
if real:
    X, Y = norm(idx(d, 'train-images-idx3-ubyte')), torch.tensor(idx(d, 'train-labels-idx1-ubyte').astype(np.int64), device=dev)
    Xt, Yt = norm(idx(d, 't10k-images-idx3-ubyte')), torch.tensor(idx(d, 't10k-labels-idx1-ubyte').astype(np.int64), device=dev)
else:
    X, Y = torch.randn(60000, 1, 28, 28, device=dev), torch.randint(0, 10, (60000,), device=dev)

m = LeNet().to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.5)

def step(j):
    opt.zero_grad()
    F.cross_entropy(m(X[j]), Y[j]).backward()
    opt.step()

# Warm-up outside the timing: CUDA context, cuDNN handles, the first kernels' loading.
for _ in range(5):
    step(torch.randint(0, len(X), (64,), device=dev))
torch.cuda.synchronize()

B, n, seen = 64, int(len(X) * epochs), 0
t0 = time.time()
while seen < n:
    perm = torch.randperm(len(X), device=dev)
    for i in range(0, len(X), B):
        if seen >= n:
            break
        j = perm[i:i + B]
        step(j)
        seen += len(j)
torch.cuda.synchronize()
t = time.time() - t0
acc = ''
if real:
    with torch.no_grad():
        acc = f", test accuracy {(m(Xt).argmax(1) == Yt).float().mean().item() * 100:.2f}%"
print(f"pytorch {torch.__version__} on {torch.cuda.get_device_name()}: {seen} {'MNIST' if real else 'random'} "
      f"images in {t:.2f} s, {seen / t:.0f} train img/s (batch {B}, TF32 off){acc}")
print(f"bench torch_lenet_train_gpu: {seen / t:.0f} img/s")
