#!/usr/bin/python3
"""PyTorch's twin of lesson 14's GPT: nanoGPT's model and recipe, as lessons/14-attention/train.cpp
trains them, for the accuracy and speed comparisons of chapter 14 and for `make bench`.

The same network (src/nn/gpt.h): token and position embeddings, pre-LN blocks of causal
multi-head attention and a 4x GELU MLP (biases in every Linear and LayerNorm), a last LayerNorm,
the output layer tied to the token embedding; the parameters named as nanoGPT's.
The same recipe (src/train/gpt_recipe.h): AdamW (0.9, 0.99), weight decay 0.1 on the >= 2-D
parameters only, a linear warm-up then a cosine to --min-lr, gradients clipped to norm 1.0.
The same data (src/data/text.h): the characters of the text sorted by code point are the
vocabulary, the first 90% trains, the last 10% validates in ordered windows.
The same random numbers: kiln's counter-based generator (src/core/rng.h: splitmix64) is
written again below with numpy, so that with the same --seed the twin starts from kiln's initial
weights (the same N(0, 0.02) draws, Box-Muller in f32, in named_parameters order) and trains on
kiln's batches (window b of batch k starts at rng.at(k*B + b) mod (n - T)). Its first losses are
then kiln's to float rounding; what differs is only the order of the additions.

Attention: with PyTorch >= 2.0, F.scaled_dot_product_attention(is_causal=True), as nanoGPT (on a
CPU, recent 2.x releases can pick a fused FlashAttention-style kernel there); before 2.0 (Debian's
python3-torch 1.13) it does not exist, and the twin writes attention out as nanoGPT's fallback
does: the T x T scores masked, softmax, times V (the textbook version).

Usage: /usr/bin/python3 bench/torch_gpt.py [--iters N] [--seed S] [--threads N] [--data DIR] ...
       (lesson-14's flags for the model's shape and the recipe, same names and defaults; no
       dropout, recomputation, mixed precision or sampling; --help lists them)
       /usr/bin/python3 bench/torch_gpt.py --bench SECONDS [--threads N]
           `make bench`'s line: training tokens per second of the baby GPT on random ids (the
           data pipeline is not what is measured) and its parameters, for bench/run.sh to set
           beside kiln's (bench/bench_gpt.cpp).
Needs Debian's python3-torch and python3-numpy (scripts/setup.sh --bench).
"""
import argparse, math, os, sys, time
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F

# ---- kiln's generator (src/core/rng.h) ------------------------------------------------------------
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    """splitmix64 of a uint64 array (numpy's uint64 arithmetic wraps as C's)."""
    with np.errstate(over='ignore'):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class Rng:
    """kiln's Rng: value i of the stream is splitmix64(splitmix64(seed) ^ splitmix64(i))."""
    def __init__(self, seed):
        self.seed = splitmix64(np.array([seed], dtype=np.uint64))[0]
        self.counter = 0

    def at(self, i):
        return splitmix64(self.seed ^ splitmix64(np.asarray(i, dtype=np.uint64)))

    def normal(self, shape, std):
        """Tensor::normal(shape, 0, std, rng): element i from values first + 2i and first + 2i + 1,
        z = sqrt(-2 ln u1) cos(2 pi u2) in f32, u1 = 1 - to_unit(a) in (0, 1], u2 = to_unit(b)."""
        n = int(np.prod(shape))
        bits = self.at(np.arange(self.counter, self.counter + 2 * n, dtype=np.uint64))
        self.counter += 2 * n
        unit = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
        u1, u2 = np.float32(1.0) - unit[0::2], unit[1::2]
        z = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(6.283185307179586) * u2)
        return torch.from_numpy((np.float32(std) * z).astype(np.float32).reshape(shape))


# ---- the model (nanoGPT's, with biases) ----------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.c_attn, s.c_proj, s.n_head = nn.Linear(C, 3 * C), nn.Linear(C, C), H

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(x).split(C, dim=2)  # q at columns 0..C, head h at h*D.. within each
        q, k, v = (t.view(B, T, s.n_head, C // s.n_head).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, 'scaled_dot_product_attention'):  # PyTorch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the textbook attention: S = QK^T/sqrt(D), the future masked, softmax, PV
            s_ = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = F.softmax(s_.masked_fill(~mask, float('-inf')), dim=-1) @ v
        return s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(s, C):
        super().__init__()
        s.c_fc, s.gelu, s.c_proj = nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C)

    def forward(s, x):
        return s.c_proj(s.gelu(s.c_fc(x)))


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.ln_1, s.attn, s.ln_2, s.mlp = nn.LayerNorm(C), CausalSelfAttention(C, H), nn.LayerNorm(C), MLP(C)

    def forward(s, x):
        x = x + s.attn(s.ln_1(x))
        return x + s.mlp(s.ln_2(x))


class GPT(nn.Module):
    def __init__(s, V, T, L, H, C):
        super().__init__()
        s.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
                                           h=nn.ModuleList([Block(C, H) for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        s.lm_head = nn.Linear(C, V, bias=False)
        s.transformer.wte.weight = s.lm_head.weight  # weight tying: one [V, C] matrix

    def forward(s, idx):
        t = s.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in t.h:
            x = block(x)
        return s.lm_head(t.ln_f(x))


def make_gpt(V, a, seed):
    """nn/gpt.cpp's make_gpt: every 2-D parameter ~ N(0, 0.02) (the residual projections
    c_proj.weight N(0, 0.02/sqrt(2L))) drawn from kiln's Rng(seed) in named_parameters order;
    LayerNorm weights 1, biases 0."""
    model = GPT(V, a.block_size, a.n_layer, a.n_head, a.n_embd)
    rng = Rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied weight once, as transformer.wte.weight
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * a.n_layer) if name.endswith('c_proj.weight') else 0.02
                p.copy_(rng.normal(tuple(p.shape), std))
            else:
                p.fill_(1.0 if name.endswith('.weight') else 0.0)
    return model


# ---- the recipe (train/gpt_recipe.h) --------------------------------------------------------------
def gpt_lr(a, it):
    """nanoGPT's get_lr: warm-up, then a cosine from --lr to --min-lr at the last step."""
    if it < a.warmup:
        return a.lr * (it + 1) / (a.warmup + 1)
    if it > a.iters:
        return a.min_lr
    r = (it - a.warmup) / max(1, a.iters - a.warmup)
    return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (a.lr - a.min_lr)


def gpt_optimizer(model, a):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([dict(params=decay, weight_decay=a.weight_decay), dict(params=no_decay, weight_decay=0.0)],
                             lr=a.lr, betas=(0.9, 0.99), eps=1e-8)


# ---- the data (data/text.h) -----------------------------------------------------------------------
def load_text(path, limit):
    if not os.path.exists(path):
        sys.exit(f"torch_gpt.py: text file '{path}' not found (make data fetches it)")
    text = open(path, encoding='utf-8').read()
    if limit > 0:
        text = text[:limit]
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(len(ids) * 0.9)
    return chars, ids[:n], ids[n:]


def random_windows(tokens, T, B, seed, k):
    """Batch k of TextWindows: window b at offset rng.at(k*B + b) mod (n - T); y is x shifted by one."""
    starts = Rng(seed).at(np.arange(k * B, (k + 1) * B, dtype=np.uint64)) % np.uint64(len(tokens) - T)
    starts = torch.from_numpy(starts.astype(np.int64))
    rows = starts[:, None] + torch.arange(T + 1)[None, :]
    w = tokens[rows]
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def eval_loss(model, tokens, T, max_windows=0, batch=64):
    """gpt_eval_loss: the mean loss over the windows at offsets 0, T, 2T, ... (the first max_windows)."""
    count = (len(tokens) - 1) // T
    if max_windows > 0:
        count = min(count, max_windows)
    model.eval()
    total = 0.0
    for first in range(0, count, batch):
        n = min(batch, count - first)
        rows = (torch.arange(first, first + n) * T)[:, None] + torch.arange(T + 1)[None, :]
        w = tokens[rows]
        logits = model(w[:, :-1])
        total += F.cross_entropy(logits.view(-1, logits.size(-1)), w[:, 1:].reshape(-1)).item() * n
    model.train()
    return total / count


def step(model, opt, x, y, clip):
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


def train(a):
    start = time.time()
    chars, train_ids, val_ids = load_text(os.path.join(a.data, 'moby-dick.txt'), a.limit)
    model = make_gpt(len(chars), a, a.seed)
    opt = gpt_optimizer(model, a)
    params = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    attention = 'scaled_dot_product_attention' if hasattr(F, 'scaled_dot_product_attention') else 'textbook'
    print(f"torch_gpt: PyTorch {torch.__version__}, {torch.get_num_threads()} threads: GPT of {a.n_layer} layers, "
          f"{a.n_head} heads, {a.n_embd} channels, context {a.block_size}, vocabulary {len(chars)}: {params} parameters "
          f"({attention} attention), batch {a.batch_size}, {a.iters} steps, {len(train_ids)} training characters",
          flush=True)
    last, last_it = time.time(), -1
    for it in range(a.iters):
        lr = gpt_lr(a, it)
        for g in opt.param_groups:
            g['lr'] = lr
        x, y = random_windows(train_ids, a.block_size, a.batch_size, a.seed, it)
        loss = step(model, opt, x, y, a.clip)
        if not math.isfinite(loss):
            sys.exit(f"torch_gpt.py: training diverged at step {it}: loss {loss} (try a lower --lr)")
        if it % a.log_interval == 0 or it == a.iters - 1:
            ms = 1000.0 * (time.time() - last) / (it - last_it)
            print(f"step {it}: loss {loss:.4f}, lr {lr:.2e}, {ms:.0f} ms/step", flush=True)
            last, last_it = time.time(), it
        if it > 0 and it % a.eval_interval == 0 and it + 1 < a.iters:  # not timed with the steps
            v = eval_loss(model, val_ids, a.block_size, a.eval_windows)
            print(f"step {it}: val loss {v:.4f} (first {a.eval_windows} windows)", flush=True)
            last, last_it = time.time(), it
    seconds = time.time() - start
    val = eval_loss(model, val_ids, a.block_size)
    print(f"result: val_loss={val:.4f} bits_per_char={val / math.log(2):.3f} time={seconds:.1f}s")


def bench(a):
    """Training tokens per second on random ids (vocabulary 83, Moby-Dick's), after 3 warm-up steps."""
    V = 83
    model = make_gpt(V, a, a.seed)
    opt = gpt_optimizer(model, a)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (a.batch_size, a.block_size), generator=g)
    y = torch.randint(0, V, (a.batch_size, a.block_size), generator=g)
    for _ in range(3):
        step(model, opt, x, y, a.clip)
    t, n = time.time(), 0
    while time.time() - t < a.bench:
        step(model, opt, x, y, a.clip)
        n += 1
    rate = n * a.batch_size * a.block_size / (time.time() - t)
    params = sum(p.numel() for p in model.parameters())
    print(f"pytorch {torch.__version__} threads={torch.get_num_threads()} gpt: {rate:.0f} train tok/s "
          f"(batch {a.batch_size}, context {a.block_size}, {params} parameters)")


def main():
    p = argparse.ArgumentParser(description="PyTorch's twin of lesson-14 (nanoGPT's baby GPT on Moby-Dick).")
    add = p.add_argument
    add('--iters', type=int, default=2000, help='optimizer steps (the cosine ends at the last)')
    add('--batch-size', type=int, default=12)
    add('--lr', type=float, default=1e-3)
    add('--min-lr', type=float, default=1e-4)
    add('--warmup', type=int, default=100)
    add('--weight-decay', type=float, default=0.1)
    add('--clip', type=float, default=1.0, help='clip the gradients global norm to this (0: no clipping)')
    add('--block-size', type=int, default=64)
    add('--n-layer', type=int, default=4)
    add('--n-head', type=int, default=4)
    add('--n-embd', type=int, default=128)
    add('--seed', type=int, default=1)
    add('--threads', type=int, default=2)
    add('--data', default='data/moby-dick')
    add('--limit', type=int, default=0, help='only the first N characters of the text')
    add('--eval-interval', type=int, default=500)
    add('--eval-windows', type=int, default=200)
    add('--log-interval', type=int, default=100)
    add('--bench', type=float, default=0, help="make bench's line: train this many seconds on random ids")
    a = p.parse_args()
    for name in ('iters', 'batch_size', 'block_size', 'n_layer', 'n_head', 'n_embd', 'threads', 'eval_interval',
                 'eval_windows', 'log_interval'):
        if getattr(a, name) < (0 if name == 'iters' else 1):
            sys.exit(f"torch_gpt.py: --{name.replace('_', '-')} {getattr(a, name)} is too small")
    if a.n_embd % a.n_head:
        sys.exit(f"torch_gpt.py: --n-embd {a.n_embd} is not a multiple of --n-head {a.n_head}")
    torch.set_num_threads(a.threads)
    bench(a) if a.bench > 0 else train(a)


if __name__ == '__main__':
    main()
