#!/usr/bin/python3
"""PyTorch's causal attention at the shapes of kiln's `bench_train attention-cuda` (chapter 14,
bench/bench_train.cpp): batch 8, 12 heads of 64 channels, contexts 256, 512 and 1024, f32 (TF32
off) and bf16, on the same GPU. The input is a c_attn output qkv [B, T, 3C] and the output y
[B, T, C], with nanoGPT's reshapes around F.scaled_dot_product_attention(is_causal=True), as
kiln's op takes and gives them. Timed as kiln times its kernels: the median of 3 rounds of 3
calls after one, the device synchronized at each round's end; a forward, and a forward + backward.

  default     scaled_dot_product_attention as PyTorch picks its kernel
  flash, efficient, cudnn, math
              each backend forced (torch.nn.attention.sdpa_kernel, PyTorch >= 2.3); one that
              does not take the shape or the type is left out. math is the textbook version
              (the T x T probabilities stored), as kiln's textbook kernel.
  manual      PyTorch 1.13 has no scaled_dot_product_attention: nanoGPT's own fallback (scores,
              mask, softmax, times v), the textbook version (the check's dry run, on a CPU)

Usage: python3 bench/torch_attention_gpu.py [--device cuda|cpu] [--quick] [--kiln LOG]
--device cpu runs on the CPU (the dry run); --quick: batch 1, 2 heads, context 64, one call.
Prints "bench torch_attention_BACKEND_DTYPE_T256_fwd: X ms" and "..._fwdbwd"; with --kiln LOG
(what `bench_train attention-cuda` printed) then a table, one "attention" line per type and
context: forward + backward ms of kiln's two kernels and PyTorch's, and kiln's share of
PyTorch's speed (PyTorch's time / kiln's: 1.00 = as fast). Works with PyTorch 1.13 and 2.x.
"""
import math, re, sys, time, warnings, torch, torch.nn.functional as F

from torch_train import tf32_off  # bench/torch_train.py

try:  # PyTorch >= 2.3: a backend can be forced
    from torch.nn.attention import sdpa_kernel, SDPBackend
    FORCED = {name: getattr(SDPBackend, member) for name, member in [
        ('flash', 'FLASH_ATTENTION'), ('efficient', 'EFFICIENT_ATTENTION'), ('cudnn', 'CUDNN_ATTENTION'),
        ('math', 'MATH')] if hasattr(SDPBackend, member)}
except ImportError:
    FORCED = {}


def attention(qkv, heads, backend):
    """nanoGPT's CausalSelfAttention between c_attn and c_proj: qkv [B, T, 3C] -> y [B, T, C]."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in qkv.split(C, dim=2))
    if backend == 'manual':
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool, device=qkv.device).tril()
        y = F.softmax(att.masked_fill(~mask, float('-inf')), dim=-1) @ v
    elif backend == 'default':
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        with sdpa_kernel(FORCED[backend]):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).contiguous().view(B, T, C)


def median_ms(call, dev, calls, rounds, warmup):
    """Median ms a call of `rounds` rounds of `calls` calls after `warmup`, as kiln's median_rate."""
    def sync():
        if dev.type == 'cuda':
            torch.cuda.synchronize()
    for _ in range(warmup):
        call()
    sync()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        times.append((time.perf_counter() - t) / calls * 1e3)
    return sorted(times)[len(times) // 2]


def kiln_figures(path):
    """{name: ms} from kiln's `bench attention_...: X ms` lines."""
    figures = {}
    for line in open(path, errors='replace'):
        m = re.match(r'bench (attention_\S+): ([0-9.]+) ms', line)
        if m:
            figures[m.group(1)] = float(m.group(2))
    return figures


def table(kiln, torch_ms, dtypes, contexts, backends):
    """One line per type and context: forward + backward ms, and kiln's share of PyTorch's speed."""
    fused = next((b for b in backends if b not in ('math', 'manual')), None)
    textbook = 'math' if 'math' in backends else 'manual' if 'manual' in backends else None
    print(f"attention, forward + backward, ms (median); share = PyTorch's time / kiln's "
          f"(kiln flash against PyTorch's {fused or '-'}, kiln textbook against its {textbook or '-'})")
    print(f"attention {'type':5} {'T':>5} {'kiln flash':>11} {'kiln textbook':>14} "
          + ''.join(f"{'torch ' + b:>17}" for b in backends) + f" {'share flash':>12} {'share textbook':>15}")

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else '-'
    for dtype in dtypes:
        for T in contexts:
            kf = kiln.get(f'attention_flash_{dtype}_T{T}_fwdbwd')
            kt = kiln.get(f'attention_textbook_{dtype}_T{T}_fwdbwd')
            ts = {b: torch_ms.get((b, dtype, T)) for b in backends}
            cell = lambda v: f"{v:.3f}" if v else '-'
            print(f"attention {dtype:5} {T:>5} {cell(kf):>11} {cell(kt):>14} "
                  + ''.join(f"{cell(ts[b]):>17}" for b in backends)
                  + f" {ratio(ts.get(fused), kf):>12} {ratio(ts.get(textbook), kt):>15}")


def main():
    args, dev, quick, kiln_log = sys.argv[1:], 'cuda', False, None
    while args:
        flag = args.pop(0)
        if flag == '--device' and args:
            dev = args.pop(0)
        elif flag == '--quick':
            quick = True
        elif flag == '--kiln' and args:
            kiln_log = args.pop(0)
        else:
            sys.exit(f"torch_attention_gpu.py: unknown flag {flag}; see the usage at the top of this file")
    if dev == 'cuda' and not torch.cuda.is_available():
        sys.exit(f"torch_attention_gpu.py: this PyTorch ({torch.__version__}) sees no CUDA GPU; --device cpu runs on the CPU")
    dev = torch.device(dev)
    tf32_off()
    B, H, D = (1, 2, 64) if quick else (8, 12, 64)
    contexts = [64] if quick else [256, 512, 1024]
    calls, rounds, warmup = (1, 1, 0) if quick else (3, 3, 1)
    # PyTorch 1.13: no scaled_dot_product_attention; 2.0-2.2: no sdpa_kernel to force a backend
    backends = ['default'] + list(FORCED) if hasattr(F, 'scaled_dot_product_attention') else ['manual']
    warnings.filterwarnings('ignore', message='.*')  # a forced backend's refusal warns before it raises
    where = torch.cuda.get_device_name() if dev.type == 'cuda' else 'the CPU'
    print(f"pytorch {torch.__version__} on {where}: batch {B}, {H} heads of {D} channels, causal; f32 with TF32 off")
    torch_ms = {}
    for dtype in ['f32', 'bf16']:
        for T in contexts:
            g = torch.Generator().manual_seed(T)
            qkv = torch.randn(B, T, 3 * H * D, generator=g).to(dev, getattr(torch, {'f32': 'float32', 'bf16': 'bfloat16'}[dtype]))
            dy = torch.randn(B, T, H * D, generator=g).to(dev, qkv.dtype)
            qkv.requires_grad_(True)
            for backend in backends:
                def fwd():
                    with torch.no_grad():
                        attention(qkv, H, backend)

                def fwdbwd():
                    qkv.grad = None
                    attention(qkv, H, backend).backward(dy)
                try:
                    f = median_ms(fwd, dev, calls, rounds, warmup)
                    fb = median_ms(fwdbwd, dev, calls, rounds, warmup)
                except RuntimeError as e:  # a backend that does not take this shape or type
                    print(f"torch_attention_{backend}_{dtype}_T{T}: not run ({str(e).splitlines()[0][:100]})")
                    continue
                torch_ms[(backend, dtype, T)] = fb
                print(f"bench torch_attention_{backend}_{dtype}_T{T}_fwd: {f:.3f} ms")
                print(f"bench torch_attention_{backend}_{dtype}_T{T}_fwdbwd: {fb:.3f} ms")
                sys.stdout.flush()
    if kiln_log:
        table(kiln_figures(kiln_log), torch_ms, ['f32', 'bf16'], contexts, backends)


if __name__ == '__main__':
    main()
