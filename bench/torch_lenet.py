#!/usr/bin/python3
"""PyTorch CPU reference for kiln's chapter 03 model: the LeNet of PyTorch's classic MNIST
example, trained on MNIST. `make bench` (bench/run.sh) runs it beside kiln's
`bench lenet_train_cpu` at the same thread count and prints the ratio.

Usage: /usr/bin/python3 bench/torch_lenet.py MNIST_DIR [THREADS] [EPOCHS]
MNIST_DIR holds the four IDX files (plain or .gz). Needs Debian's python3-torch.
Prints one line: training images per second (batch 64, SGD lr 0.01 momentum 0.5), test
accuracy and the model's parameters (run.sh checks them against kiln's). The GPU twin,
bench/torch_lenet_gpu.py, imports idx and LeNet from here.
"""
import gzip, os, struct, sys, time
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F


def idx(d, name):
    """The IDX file `name` of folder d (plain or .gz): images as uint8 [n, 1, rows, cols], or labels."""
    p = os.path.join(d, name)
    b = gzip.open(p + '.gz').read() if os.path.exists(p + '.gz') else open(p, 'rb').read()
    magic, n = struct.unpack('>II', b[:8])
    if magic == 2051:
        r, c = struct.unpack('>II', b[8:16])
        return np.frombuffer(b[16:], np.uint8).reshape(n, 1, r, c)
    return np.frombuffer(b[8:], np.uint8)


class LeNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1, s.c2 = nn.Conv2d(1, 10, 5), nn.Conv2d(10, 20, 5)
        s.f1, s.f2 = nn.Linear(320, 50), nn.Linear(50, 10)
    def forward(s, x):
        x = F.relu(F.max_pool2d(s.c1(x), 2))
        x = F.relu(F.max_pool2d(s.c2(x), 2))
        return s.f2(F.relu(s.f1(x.view(-1, 320))))


def main():
    d = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    epochs = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    norm = lambda a: torch.tensor((a / 255.0 - 0.1307) / 0.3081, dtype=torch.float32)
    X, Y = norm(idx(d, 'train-images-idx3-ubyte')), torch.tensor(idx(d, 'train-labels-idx1-ubyte').astype(np.int64))
    Xt, Yt = norm(idx(d, 't10k-images-idx3-ubyte')), torch.tensor(idx(d, 't10k-labels-idx1-ubyte').astype(np.int64))

    m = LeNet()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.5)
    B, n, seen = 64, int(len(X) * epochs), 0
    t0 = time.time()
    while seen < n:
        perm = torch.randperm(len(X))
        for i in range(0, len(X), B):
            if seen >= n:
                break
            j = perm[i:i + B]
            opt.zero_grad()
            F.cross_entropy(m(X[j]), Y[j]).backward()
            opt.step()
            seen += len(j)
    t = time.time() - t0
    with torch.no_grad():
        acc = (m(Xt).argmax(1) == Yt).float().mean().item()
    params = sum(p.numel() for p in m.parameters())
    print(f"pytorch {torch.__version__} threads={threads}: {seen / t:.0f} train img/s, test accuracy {acc * 100:.2f}%, "
          f"{params} parameters")


if __name__ == '__main__':
    main()
