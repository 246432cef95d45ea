#!/usr/bin/env bash
# run.sh — `make bench`: runs every benchmark binary in BUILD/bench (each prints lines
# "bench <name>: <value> <unit>"), then the PyTorch references of the chapter models
# (bench/torch_train.py: the MLP, the CIFAR nets, MobileNetV2; bench/torch_lenet.py: LeNet;
# bench/torch_gpt.py: chapter 14's GPT, in tokens a second) in the same run at the same thread
# count, and the ratios kiln / PyTorch ("..._vs_torch"). Then
# every chapter model again, kiln's and PyTorch's, in f32:
#   _avx2   on a CPU with AVX-512, both held to AVX2 (kiln by KILN_CPU=avx2, PyTorch's oneDNN
#           and OpenBLAS by their own variables): what a learner's AVX2 CPU would compare,
#           approximated on this one;
#   _busy   while another program (`yes`) keeps one core busy.
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
models="mlp lenet cifar_net_l06 cifar_net mobilenet_v2 gpt"  # as bench_train names them
# torch MODEL: PyTorch's training line for the chapter model MODEL (batch sizes as bench_train's).
torch() {
    case $1 in
        lenet) "$py" bench/torch_lenet.py data/mnist "$threads" 0.2 ;;
        mlp) "$py" bench/torch_train.py mlp "$threads" 64 5 ;;
        cifar_net_l06) "$py" bench/torch_train.py cifar_net:32,64,128 "$threads" 128 10 ;;
        cifar_net) "$py" bench/torch_train.py cifar_net "$threads" 256 20 ;;
        mobilenet_v2) "$py" bench/torch_train.py mobilenet_v2 "$threads" 128 20 ;;
        gpt) "$py" bench/torch_gpt.py --bench 5 --threads "$threads" ;;
    esac
}
# figure NAME: the value of the line "bench NAME: <value> <unit>" in $out (empty if none).
figure() {
    awk -v n="bench $1:" 'index($0, n) == 1 { print $3 }' "$out"
}
# ratio NAME KILN_FIGURE TORCH_FIGURE: "bench NAME: kiln/torch ratio" from the figures in $out.
ratio() {
    local k t
    k=$(figure "$2")
    t=$(figure "$3")
    if [[ -n $k && -n $t ]]; then
        awk -v k="$k" -v t="$t" -v n="$1" 'BEGIN { printf "bench %s: %.2f ratio\n", n, k / t }'
    else
        echo "bench: $1 skipped: no figure \"$2\" or \"$3\" above" >&2
    fi
}
# references SUFFIX: PyTorch's figure for every chapter model (named torch_MODEL_train_cpu SUFFIX),
# then kiln's against it (MODEL_train_cpu SUFFIX _vs_torch). A PyTorch model whose parameters
# are not as many as kiln's (MODEL_params) is not the same network: its ratio is not printed.
references() {
    local m line params kiln_params rate
    for m in $models; do
        if ! line=$(torch "$m"); then
            echo "bench: PyTorch's $m did not run (its error above): no ratio" >&2
            continue
        fi
        params=$(grep -oE '[0-9]+ parameters' <<< "$line" | cut -d' ' -f1)
        kiln_params=$(figure "${m}_params")
        if [[ $params != "$kiln_params" ]]; then
            echo "bench: PyTorch's $m has ${params:-no count of} parameters, kiln's ${kiln_params:-no count of}: not the same network" >&2
            continue
        fi
        rate=$(grep -oE '[0-9.]+ train [a-z]+/s' <<< "$line")  # "1234.5 train img/s" (the GPT's: tok/s)
        echo "bench torch_${m}_train_cpu$1: ${rate%% *} ${rate##* }" | tee -a "$out"
    done
    for m in $models; do
        ratio "${m}_train_cpu$1_vs_torch" "${m}_train_cpu$1" "torch_${m}_train_cpu$1"
    done
}
if "$py" -c 'import torch' 2>/dev/null; then
    references ""
    if grep -qw avx512f /proc/cpuinfo; then
        KILN_CPU=avx2 "$build/bench/bench_train" f32 _avx2 | tee -a "$out"
        (export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2; references _avx2)
    fi
    yes > /dev/null &  # one core busy
    busy=$!
    trap 'kill "$busy" 2>/dev/null || true; rm -f "$out"' EXIT  # yes is gone by then; a failed kill must not fail the script (set -e)
    "$build/bench/bench_train" f32 _busy | tee -a "$out"
    references _busy
    kill "$busy"
else
    echo "bench: no PyTorch (python3-torch at $py): the reference figures are skipped"
fi
