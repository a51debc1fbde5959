#!/usr/bin/env python3
"""Train a tiny GPT twice, from the same seed on the same batches: once with flashtune's attention
(flashtune.torch.attention), once with torch SDPA, their steps interleaved so that both are timed under the
same conditions. bf16 autocast, AdamW, no dropout.

The corpus is this repository's own source (templates, tuner, runtime, docs), read byte by byte: no
download. Writes reports/<gpu-slug>/train_tiny_gpt.csv (step, loss_flashtune, loss_sdpa,
tokens_per_s_flashtune, tokens_per_s_sdpa) and train_tiny_gpt.png, prints the final losses (mean of
the last 20 steps) and whether they agree within 2% (exit 1 if not).

usage: python3 examples/train_tiny_gpt.py [--steps 300] [--layers 4] [--heads 6] [--context 256]
       [--batch 32] [--compile] [--profile N] [--out-dir reports/<slug>]
Uses the pip-installed flashtune, else python/ with build/runtime/libflashtune_attention.so (or the
library $FLASHTUNE_LIBRARY names).
"""
import argparse
import csv
import math
import os
import re
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:  # the pip-installed package, else the source tree's with the library of build/ (or $FLASHTUNE_LIBRARY)
    import flashtune
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("FLASHTUNE_LIBRARY", os.path.join(ROOT, "build", "runtime", "libflashtune_attention.so"))
from flashtune.torch import attention as ft_attention  # noqa: E402

CORPUS_DIRS = ("templates", "tuner", "runtime", "reference", "docs", "experiments", "python", "scripts")
CORPUS_EXT = (".cuh", ".h", ".hpp", ".cpp", ".md", ".py", ".sh")


def gpu_slug(name):
    """As `flashtune devices --slug`: lowercase, runs of non-alphanumerics to one '-'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def load_corpus():
    chunks = []
    for d in CORPUS_DIRS:
        for dirpath, _, files in sorted(os.walk(os.path.join(ROOT, d))):
            for f in sorted(files):
                if f.endswith(CORPUS_EXT):
                    with open(os.path.join(dirpath, f), "rb") as fh:
                        chunks.append(fh.read())
    data = torch.frombuffer(bytearray(b"\n".join(chunks)), dtype=torch.uint8).long()
    return data  # byte-level: vocabulary 256


class Block(nn.Module):
    def __init__(self, dim, heads, impl):
        super().__init__()
        self.heads, self.impl = heads, impl
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        if self.impl == "flashtune":
            y = ft_attention(q, k, v, causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, S, C))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers, heads, head_dim, context, impl, vocab=256):
        super().__init__()
        dim = heads * head_dim
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, impl) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(m):
        # GPT-2's initialisation: N(0, 0.02) weights, zero biases (N(0, 1) embeddings tied to the head
        # start the loss near 230 instead of ln 256 = 5.5).
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def batches(data, steps, batch, context, seed):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - context - 1, (steps, batch), generator=g)
    for s in starts:
        idx = s[:, None] + torch.arange(context + 1)[None, :]
        chunk = data[idx]
        yield chunk[:, :-1], chunk[:, 1:]


def warm_up(a, impl):
    """The first call JIT-compiles flashtune's kernels (or picks SDPA's); keep it out of the timings."""
    H, d = a.heads, 64
    q, k, v = (torch.randn(a.batch, H, a.context, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    for _ in range(2):
        o = ft_attention(q, k, v, causal=True) if impl == "flashtune" else \
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.sum().backward()
    torch.cuda.synchronize()


def profile_steps(step, n):
    """n more steps under torch.profiler: {kernel name: (us per step, launches per step)} with the wall time
    per step under "(wall)" and the sum of every kernel under "(kernels)" (a step whose kernels sum to much
    less than its wall time waited on the host)."""
    act = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=act) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    per = {}
    for e in prof.events():  # kernels, memsets and copies; not the GPU ranges of annotations (Optimizer.step#...)
        annotation = getattr(e, "is_user_annotation", False) or e.name.startswith("Optimizer.")
        if e.device_type == torch.autograd.DeviceType.CUDA and not annotation:
            us, calls = per.get(e.name, (0.0, 0))
            per[e.name] = (us + e.time_range.elapsed_us(), calls + 1)
    out = {k: (us / n, c / n) for k, (us, c) in per.items()}
    out["(kernels)"] = (sum(us for us, _ in per.values()) / n, sum(c for _, c in per.values()) / n)
    out["(wall)"] = (wall_us / n, 0)
    return out


class Run:
    """One model and its optimizer, trained step by step (flashtune's attention or SDPA's); the two runs start
    from the same weights (the same seed) and see the same batches."""

    def __init__(self, impl, a):
        self.impl, self.a = impl, a
        torch.manual_seed(a.seed)  # the same initial weights for both runs
        self.model = TinyGPT(a.layers, a.heads, 64, a.context, impl).cuda()
        self.step_fn = torch.compile(self.model) if a.compile else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.losses, self.rates = [], []

    def one_step(self, x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.step_fn(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss

    def timed_step(self, step, x, y):
        a = self.a
        lr = a.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for group in self.opt.param_groups:
            group["lr"] = lr
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = self.one_step(x, y)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        self.losses.append(loss.item())
        self.rates.append(a.batch * a.context / dt)
        if step % 50 == 0 or step == a.steps - 1:
            print(f"{self.impl:<9} step {step:4d}  loss {self.losses[-1]:.4f}  {self.rates[-1] / 1e3:8.1f} k tokens/s",
                  flush=True)


def train(data, a):
    """Both runs, their steps interleaved (flashtune first on even steps, SDPA first on odd ones), so that each
    step of one is timed beside the same step of the other: a machine whose host speed drifts during the run
    (SDPA's tokens/s moved by 30% between runs of the sequential form while its kernels did not) moves both
    alike. Returns the two Runs and, with --profile, each one's profile of the last batch again."""
    runs = [Run("flashtune", a), Run("sdpa", a)]
    for r in runs:
        warm_up(a, r.impl)
    for step, (x, y) in enumerate(batches(data, a.steps, a.batch, a.context, a.seed)):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        for r in (runs if step % 2 == 0 else runs[::-1]):
            r.timed_step(step, x, y)
    profs = [None, None]
    if a.profile:  # the last batch again, a.profile times each, under the profiler (not in the rates above)
        for i, r in enumerate(runs):
            profs[i] = profile_steps(lambda: r.one_step(x, y), a.profile)
            print(f"{r.impl:<9} profiled {a.profile} steps: wall {profs[i]['(wall)'][0]:.0f} us/step, kernels "
                  f"{profs[i]['(kernels)'][0]:.0f} us/step", flush=True)
    return runs, profs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6, help="4 to 8; head dim is 64")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model in both runs")
    ap.add_argument("--out-dir", help="default: reports/<gpu-slug>")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after training, N more steps of each under torch.profiler: <stem>_profile.csv (impl, "
                         "kernel, us_per_step, launches_per_step; '(wall)' and '(kernels)' rows)")
    ap.add_argument("--tag", default="", help="suffix of the output files: train_tiny_gpt_<tag>.csv/.png")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_tiny_gpt: needs a CUDA GPU")
    device = torch.cuda.get_device_name()
    out_dir = a.out_dir or os.path.join(ROOT, "reports", gpu_slug(device))
    os.makedirs(out_dir, exist_ok=True)
    data = load_corpus()
    print(f"{device}: corpus {len(data) / 1e6:.2f} MB of this repository's source, {a.layers} layers, {a.heads} heads "
          f"x 64, context {a.context}, batch {a.batch}, {a.steps} steps, bf16 autocast", flush=True)

    if not 0 <= a.profile <= 100:
        sys.exit("train_tiny_gpt: --profile takes 0 to 100 steps")
    (ft, sd), (ft_prof, sd_prof) = train(data, a)
    ft_loss, ft_rate, sd_loss, sd_rate = ft.losses, ft.rates, sd.losses, sd.rates

    stem = "train_tiny_gpt" + (f"_{a.tag}" if a.tag else "")
    if not all(ch.isalnum() or ch in "_-" for ch in stem):
        sys.exit("train_tiny_gpt: --tag takes letters, digits, '_' and '-' only")
    csv_path = os.path.join(out_dir, stem + ".csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss_flashtune", "loss_sdpa", "tokens_per_s_flashtune", "tokens_per_s_sdpa"])
        for i in range(a.steps):
            w.writerow([i, f"{ft_loss[i]:.6f}", f"{sd_loss[i]:.6f}", f"{ft_rate[i]:.1f}", f"{sd_rate[i]:.1f}"])

    if a.profile:
        with open(os.path.join(out_dir, stem + "_profile.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["impl", "kernel", "us_per_step", "launches_per_step"])
            for impl, prof in (("flashtune", ft_prof), ("sdpa", sd_prof)):
                for name, (us, calls) in sorted(prof.items(), key=lambda kv: -kv[1][0]):
                    w.writerow([impl, name[:160], f"{us:.1f}", f"{calls:g}"])

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ft_loss, label="flashtune", lw=1.2)
    ax.plot(sd_loss, label="torch SDPA", lw=1.2, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats / byte)")
    ax.set_title(f"tiny GPT ({a.layers}x{a.heads}x64, context {a.context}), bf16, {device}", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png_path = os.path.join(out_dir, stem + ".png")
    fig.savefig(png_path, dpi=120)

    tail = min(20, a.steps)
    f_final, s_final = sum(ft_loss[-tail:]) / tail, sum(sd_loss[-tail:]) / tail
    rel = abs(f_final - s_final) / s_final
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"final loss (mean of the last {tail} steps): flashtune {f_final:.4f}, sdpa {s_final:.4f}, "
          f"difference {100 * rel:.2f}% -> {'within' if rel <= 0.02 else 'NOT within'} 2%")
    print(f"median tokens/s: flashtune {med(ft_rate):.0f}, sdpa {med(sd_rate):.0f} "
          f"({med(ft_rate) / med(sd_rate):.3f}x; median of the steps' own ratios "
          f"{med([f / s for f, s in zip(ft_rate, sd_rate)]):.3f}x)")
    print(f"wrote {csv_path} and {png_path}")
    return 0 if rel <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
