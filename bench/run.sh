#!/usr/bin/env bash
# run.sh — `make bench`: runs every benchmark binary in BUILD/bench (each prints lines
# "bench <name>: <value> <unit>"), then the PyTorch references bench/torch_lenet.py and
# bench/torch_cifar_net.py in the same run at the same thread count, and the ratios kiln / PyTorch;
# then LeNet and the CIFAR net again, kiln's and PyTorch's, while another program (`yes`) keeps
# one core busy: "_busy" figures and their ratio.
# Threads: KILN_THREADS (default 2, the course's reference machine).
set -eu
build=$1
threads=${KILN_THREADS:-2}
export OMP_NUM_THREADS=$threads
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for b in "$build"/bench/*; do
    [[ -x $b && ! -d $b && $b != *.o && $b != *.d ]] || continue
    "$b" | tee -a "$out"
done

# PyTorch on the same machine, same threads (Debian's python3-torch).
py=/usr/bin/python3   # Debian's python, where python3-torch is installed
if "$py" -c 'import torch' 2>/dev/null; then
    lenet=$("$py" bench/torch_lenet.py data/mnist "$threads" 0.2 | grep -oE '[0-9]+ train img/s' | cut -d' ' -f1)
    echo "bench torch_lenet_train_cpu: $lenet img/s" | tee -a "$out"
    cifar=$("$py" bench/torch_cifar_net.py "$threads" 256 20 | grep -oE '[0-9]+ train img/s' | cut -d' ' -f1)
    echo "bench torch_cifar_net_train_cpu: $cifar img/s" | tee -a "$out"
    ratio() {  # ratio NAME KILN_FIGURE TORCH_FIGURE
        local k t
        k=$(awk -v n="bench $2:" 'index($0, n) == 1 { print $3 }' "$out")
        t=$(awk -v n="bench $3:" 'index($0, n) == 1 { print $3 }' "$out")
        [[ -n $k && -n $t ]] && awk -v k="$k" -v t="$t" -v n="$1" 'BEGIN { printf "bench %s: %.2f ratio\n", n, k / t }'
    }
    ratio lenet_train_cpu_vs_torch lenet_train_cpu torch_lenet_train_cpu
    ratio cifar_net_train_cpu_vs_torch cifar_net_train_cpu torch_cifar_net_train_cpu

    yes > /dev/null &  # one core busy
    busy=$!
    trap 'kill "$busy" 2>/dev/null || true; rm -f "$out"' EXIT  # yes is gone by then; a failed kill must not fail the script (set -e)
    "$build/bench/bench_train" busy | tee -a "$out"
    lenet=$("$py" bench/torch_lenet.py data/mnist "$threads" 0.2 | grep -oE '[0-9]+ train img/s' | cut -d' ' -f1)
    echo "bench torch_lenet_train_cpu_busy: $lenet img/s" | tee -a "$out"
    cifar=$("$py" bench/torch_cifar_net.py "$threads" 256 20 | grep -oE '[0-9]+ train img/s' | cut -d' ' -f1)
    echo "bench torch_cifar_net_train_cpu_busy: $cifar img/s" | tee -a "$out"
    kill "$busy"
    ratio lenet_train_cpu_busy_vs_torch lenet_train_cpu_busy torch_lenet_train_cpu_busy
    ratio cifar_net_train_cpu_busy_vs_torch cifar_net_train_cpu_busy torch_cifar_net_train_cpu_busy
else
    echo "bench: no PyTorch (python3-torch at $py): the reference figures are skipped"
fi
