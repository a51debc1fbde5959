#!/usr/bin/env python3
"""Every Python baseline behind one CLI, writing the experiment runner's row format (JSON lines).

usage: baselines.py --impl IMPL --problems problems.json --out rows.jsonl [--reps 30] [--seed 20261121]
                    [--rows 512] [--cpu-max-gflop 50] [--time-limit-s 0]

IMPL: torch_math | torch_efficient | torch_flash | torch_cudnn  (F.scaled_dot_product_attention with that
      backend forced through torch.nn.attention.sdpa_kernel), torch_cpu (the same call on CPU tensors,
      timed with time.perf_counter), triton (experiments/triton_fa.py, ours).
problems.json: a JSON list of {batch, heads, seq_q, seq_k, head_dim, dtype, causal, direction, inputs} (what
      tuner/experiments/experiment.cpp writes), or a flashtune problem-set file ({"problems": [...], "grid": {...}}).

Conventions, the same as the flashtune worker (worker/gpu_runner.cpp, worker/validate.hpp, core/problem.cpp):
  * inputs: fresh seeded normal numbers (torch.randn with a seeded generator) drawn directly in the
    problem's dtype, so the float64 reference sees exactly what the kernel sees; a problem's "inputs"
    ({"distribution": "normal" | "heavy", "scale": X}) scales them, or draws Student-t(3) (clamped to
    +-32) times X, as the worker does (dO: the same kind, unscaled). The fixed tolerances below are
    calibrated for unit inputs only (the worker's scale with the data: worker/validate.hpp);
  * causal is bottom-right aligned (query i sees key j iff j <= i + Sk - Sq; torch's is_causal=True
    when Sq == Sk, torch.nn.attention.bias.causal_lower_right otherwise); fully masked rows give O = 0;
  * timing: a validated first call, 3 warm-up calls, then per repeat an L2 flush (a 256 MiB buffer is
    written) and CUDA events around the call alone; median and p20/p80. Forward: the attention call.
    Backward: the backward alone (one forward with requires_grad builds the graph, then each call is
    torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)), as experiments/sdpa_baseline.py does;
  * flops 4*B*H*Sq*Sk*d, halved when causal, x2.5 for the backward; bytes as Problem::bytes();
  * validation: forward against float64 on up to --rows sampled query rows, element by element
    |o - ref| <= atol + rtol*|ref|; backward: float64 gradients of the first two (batch, head) slices,
    relative L2 per gradient under the dtype's bound. An invalid result is not timed;
  * torch_cpu: fp32 (or what the problem asks), median of the repeats (fewer than --reps when a call is
    slow: at least 3 plus a warm-up); problems over --cpu-max-gflop forward GFLOP are skipped;
  * --time-limit-s: as the experiment runner's pace rule, a point is skipped when this impl's last ok
    point of the same kind (dtype, direction, d, causal), scaled by FLOPs, predicts more per call.
The script never dies on one problem: every problem gets exactly one row (status ok, invalid, oom,
unsupported, skipped or error), written and flushed as soon as it is known.
"""
import argparse
import contextlib
import gc
import json
import math
import os
import platform
import random
import sys
import time
import warnings

ROW_KEYS = ("impl", "family", "config", "direction", "dtype", "batch", "heads", "seq_q", "seq_k", "head_dim",
            "causal", "status", "error", "ms_median", "ms_p20", "ms_p80", "reps", "tflops", "gbps", "max_abs",
            "mean_abs", "mse", "max_rel", "peak_bytes", "device")
IMPLS = ("torch_math", "torch_efficient", "torch_flash", "torch_cudnn", "torch_cpu", "triton")
STATUSES = ("ok", "invalid", "oom", "unsupported", "skipped", "error")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Keep in step with worker/validate.hpp: forward (atol, rtol), backward relative L2 per gradient.
FWD_TOL = {"fp32": (1e-5, 1e-4), "fp16": (2e-3, 1e-2), "bf16": (1e-2, 2e-2)}
BWD_REL_L2 = {"fp32": 1e-5, "fp16": 3e-3, "bf16": 2e-2}
TILE_ROWS = 128                 # reference/attention_ref.cpp kTileRows: the "last tile" rows always sampled
L2_FLUSH_BYTES = 256 << 20
WARMUP = 3
CPU_TIME_BUDGET_S = 20.0        # timed repeats of one torch_cpu problem stop being added past this
BWD_REF_SLICES = 2
BIG = sys.float_info.max        # stands for +inf in a row (JSON has no inf; the C++ reader wants numbers)
PROBLEM_FIELDS = ("batch", "heads", "heads_k", "seq_q", "seq_k", "seq", "head_dim", "dtype", "causal", "direction",
                  "inputs")
DEFAULT_INPUTS = {"distribution": "normal", "scale": 1.0}
HEAVY_CLAMP = 32.0              # worker/gpu_runner.cpp kHeavyClamp: |t_3| clamped before scaling


# ------------------------------------------------------------------------- problems, counts, rows

def _positive_int(j, key, limit):
    if key not in j:
        raise ValueError(f"problem is missing '{key}'")
    v = j[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > limit:
        raise ValueError(f"problem field '{key}' must be an integer in 1..{limit}, got {json.dumps(v)}")
    return v


def parse_inputs(j):
    """A problem's "inputs" object ({"distribution": "normal" | "heavy", "scale": X}, both optional) -> the
    normalised dict; the same rules as flashtune's input_dist_from_json / make_input_dist."""
    if not isinstance(j, dict):
        raise ValueError(f"problem field 'inputs' must be an object, got {json.dumps(j)}")
    for key in j:
        if key not in ("distribution", "scale"):
            raise ValueError(f"unknown inputs field '{key}'")
    kind = j.get("distribution", "normal")
    if kind not in ("normal", "heavy"):
        raise ValueError(f"unknown input distribution {json.dumps(kind)} (expected normal or heavy)")
    scale = j.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
            or not 1e-3 <= scale <= 1e3:
        raise ValueError(f"input scale must be a number in [0.001, 1000], got {json.dumps(scale)}")
    return {"distribution": kind, "scale": float(scale)}


def input_dist(p):
    """What the problem's q, k, v are drawn from (dO: the same kind, scale 1, as the worker does)."""
    return p.get("inputs", DEFAULT_INPUTS)


def parse_problem(j):
    """One problem object -> the normalised dict; the same rules as flashtune's problem_from_json."""
    if not isinstance(j, dict):
        raise ValueError(f"a problem must be a JSON object, got {json.dumps(j)}")
    if "varlen" in j:  # the dense baselines' shapes are (B, H, S, d); packed batches have their own script
        raise ValueError("a packed variable-length problem ('varlen'): experiments/varlen_vs_peers.py measures those")
    if "paged" in j:  # likewise a paged K/V cache (torch SDPA reads contiguous K/V)
        raise ValueError("a paged K/V cache problem ('paged'): experiments/decode_vs_peers.py --paged measures those")
    if "window" in j or "softcap" in j or "alibi" in j or "mask_mod" in j:  # the baselines time plain attention
        raise ValueError("a sliding-window, softcapped, ALiBi or mask_mod problem ('window', 'softcap', 'alibi', "
                         "'mask_mod'): the dense baselines run plain attention only")
    for key in j:
        if key not in PROBLEM_FIELDS:
            raise ValueError(f"unknown problem field '{key}'")
    p = {"batch": _positive_int(j, "batch", 1 << 20), "heads": _positive_int(j, "heads", 1 << 16)}
    if "heads_k" in j:  # grouped-query attention; heads_k == heads is multi-head and stays implicit
        hk = _positive_int(j, "heads_k", 1 << 16)
        if p["heads"] % hk:
            raise ValueError(f"problem field 'heads_k' ({hk}) must divide 'heads' ({p['heads']})")
        if hk != p["heads"]:
            p["heads_k"] = hk
    if "seq" in j:
        p["seq_q"] = p["seq_k"] = _positive_int(j, "seq", 1 << 20)
    else:
        p["seq_q"] = _positive_int(j, "seq_q", 1 << 20)
        p["seq_k"] = _positive_int(j, "seq_k", 1 << 20)
    p["head_dim"] = _positive_int(j, "head_dim", 1024)
    p["dtype"] = j.get("dtype", "fp32")
    if p["dtype"] not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {json.dumps(p['dtype'])} (expected fp32, fp16 or bf16)")
    causal = j.get("causal", False)
    if isinstance(causal, int) and not isinstance(causal, bool) and causal in (0, 1):
        causal = bool(causal)  # rows write causal as 0/1; accept them back
    if not isinstance(causal, bool):
        raise ValueError("problem field 'causal' must be true or false")
    p["causal"] = causal
    p["direction"] = j.get("direction", "fwd")
    if p["direction"] not in ("fwd", "bwd"):
        raise ValueError(f"problem field 'direction' must be \"fwd\" or \"bwd\", got {json.dumps(p['direction'])}")
    if "inputs" in j:
        inputs = parse_inputs(j["inputs"])
        if inputs != DEFAULT_INPUTS:  # the default stays implicit, so plain problems compare as before
            p["inputs"] = inputs
    return p


def load_problems(obj):
    """A JSON list of problems, or a problem-set object ("problems" list, then "grid" expansion)."""
    if isinstance(obj, list):
        return [parse_problem(j) for j in obj]
    if not isinstance(obj, dict):
        raise ValueError("problems file must hold a list of problems or a problem-set object")
    out = [parse_problem(j) for j in obj.get("problems", [])]
    g = obj.get("grid")
    if g:
        for dt in g.get("dtype", ["fp32"]):
            for d in g["head_dim"]:
                for c in g.get("causal", [False]):
                    for s in g["seq"]:
                        pj = dict(batch=g["tokens"] // s, heads=g["hidden"] // d, seq_q=s, seq_k=s, head_dim=d,
                                  dtype=dt, causal=c, direction=g.get("direction", "fwd"))
                        if "inputs" in g:
                            pj["inputs"] = g["inputs"]
                        out.append(parse_problem(pj))
    return out


def fwd_flops(p):
    f = 4.0 * p["batch"] * p["heads"] * p["seq_q"] * p["seq_k"] * p["head_dim"]
    return f / 2 if p["causal"] else f


def flops(p):
    """FlashAttention's count (core/problem.cpp Problem::flops): 4*B*H*Sq*Sk*d, /2 causal, x2.5 backward."""
    f = fwd_flops(p)
    return 2.5 * f if p["direction"] == "bwd" else f


def bytes_moved(p):
    """Compulsory traffic (Problem::bytes): fwd reads Q, K, V, writes O, LSE; bwd reads Q, K, V, O, dO,
    LSE and writes dQ, dK, dV."""
    e = float(DTYPE_BYTES[p["dtype"]])
    bh = float(p["batch"]) * p["heads"]
    bhk = float(p["batch"]) * p.get("heads_k", p["heads"])  # K, V (dK, dV) per kv head
    d, sq, sk = p["head_dim"], float(p["seq_q"]), float(p["seq_k"])
    if p["direction"] == "bwd":
        return bh * (e * d * 5.0 * sq + 4.0 * sq) + bhk * e * d * 4.0 * sk
    return bh * (e * d * 2.0 * sq + 4.0 * sq) + bhk * e * d * 2.0 * sk


def sample_rows(n_heads, seq_q, max_rows, seed):
    """Flat query-row indices (bh * seq_q + i) to check, as reference::sample_rows chooses them: every
    row when there are at most max_rows, else first/last/last-tile rows of four heads (last, first,
    middle, random) and then uniformly random rows. Deterministic for a seed; no duplicates."""
    n_rows = n_heads * seq_q
    if max_rows <= 0:
        return []
    if n_rows <= max_rows:
        return list(range(n_rows))
    rng = random.Random(seed)
    last_tile_start = (seq_q - 1) // TILE_ROWS * TILE_ROWS
    last_tile_rows = seq_q - last_tile_start
    must = []
    for bh in (n_heads - 1, 0, n_heads // 2, rng.randrange(n_heads)):
        base = bh * seq_q
        must += [base + seq_q - 1, base, base + last_tile_start, base + last_tile_start + last_tile_rows // 2,
                 base + last_tile_start + rng.randrange(last_tile_rows)]
    out, chosen = [], set()
    for r in must:
        if len(out) == max_rows:
            break
        if r not in chosen:
            chosen.add(r)
            out.append(r)
    while len(out) < max_rows:  # terminates: n_rows > max_rows
        r = rng.randrange(n_rows)
        if r not in chosen:
            chosen.add(r)
            out.append(r)
    return out


def percentile(values, q):
    """Linear-interpolation quantile (numpy's and torch.quantile's default), q in [0, 1]."""
    v = sorted(values)
    if not v:
        return 0.0
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def finite(x):
    """A number for a row: +-inf and NaN become BIG (the C++ reader needs a number)."""
    x = float(x)
    return x if math.isfinite(x) else BIG


def one_line(msg, limit=300):
    s = " ".join(str(msg).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def new_row(impl, p, device="", config=""):
    return {"impl": impl, "family": "", "config": config, "direction": p["direction"], "dtype": p["dtype"],
            "batch": p["batch"], "heads": p["heads"], "seq_q": p["seq_q"], "seq_k": p["seq_k"],
            "head_dim": p["head_dim"], "causal": int(bool(p["causal"])), "status": "error", "error": "",
            "ms_median": 0.0, "ms_p20": 0.0, "ms_p80": 0.0, "reps": 0, "tflops": 0.0, "gbps": 0.0,
            "max_abs": 0.0, "mean_abs": 0.0, "mse": 0.0, "max_rel": 0.0, "peak_bytes": 0, "device": device}


def set_timing(row, p, times_ms):
    med = percentile(times_ms, 0.5)
    row.update(ms_median=med, ms_p20=percentile(times_ms, 0.2), ms_p80=percentile(times_ms, 0.8),
               reps=len(times_ms))
    if med > 0:
        row["tflops"] = flops(p) / (med * 1e-3) / 1e12
        row["gbps"] = bytes_moved(p) / (med * 1e-3) / 1e9


def clear_measurements(row):
    for key in ("ms_median", "ms_p20", "ms_p80", "tflops", "gbps", "max_abs", "mean_abs", "mse", "max_rel"):
        row[key] = 0.0
    row["reps"] = 0
    row["peak_bytes"] = 0
    row.pop("detail", None)


def progress_line(row):
    prob = (f"B{row['batch']} H{row['heads']} Sq{row['seq_q']} Sk{row['seq_k']} d{row['head_dim']} {row['dtype']}"
            f"{' causal' if row['causal'] else ''} {row['direction']}")
    s = (f"{row['impl']:<15} {prob:<44} {row['status']:<11} {row['ms_median']:10.4f} ms {row['tflops']:8.2f} TFLOP/s"
         f"  max_abs {row['max_abs']:.2g}")
    if "detail" in row:
        s += "  rel_l2 " + "/".join(f"{row['detail'][k]:.1e}" for k in ("dq_rel_l2", "dk_rel_l2", "dv_rel_l2"))
    if row["error"]:
        s += f"  ({row['error'][:120]})"
    return s


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


class Pace:
    """The experiment runner's skip rule (tuner/experiments/experiment.cpp Pace)."""

    def __init__(self, limit_s):
        self.limit_s = limit_s
        self.last = {}

    @staticmethod
    def kind(impl, p):
        return (impl, p["dtype"], p["direction"], p["head_dim"], bool(p["causal"]))

    def predicted_s(self, impl, p):
        if self.kind(impl, p) not in self.last:
            return 0.0
        ms, fl = self.last[self.kind(impl, p)]
        return ms * 1e-3 * flops(p) / fl

    def over(self, impl, p):
        return bool(self.limit_s) and self.limit_s > 0 and self.predicted_s(impl, p) > self.limit_s

    def record(self, row, p):
        if row["status"] == "ok" and row["ms_median"] > 0:
            self.last[self.kind(row["impl"], p)] = (row["ms_median"], flops(p))


# ------------------------------------------------------------------------------------ the measuring

class Runner:
    """Runs one impl over problems; torch (and triton) are imported here, not at module import."""

    def __init__(self, impl, reps=30, seed=20261121, rows=512, cpu_max_gflop=50.0, time_limit_s=0.0):
        self.impl, self.reps, self.seed, self.rows = impl, reps, seed, rows
        self.cpu_max_gflop = cpu_max_gflop
        self.pace = Pace(time_limit_s)
        self.cpu = impl == "torch_cpu"
        self.torch = None
        self.device_name = "cpu: " + cpu_name() if self.cpu else ""
        self.init_error = ""
        try:
            self._init_torch()
        except Exception as e:  # rows still get written, each with this error
            self.init_error = one_line(f"{type(e).__name__}: {e}")

    def _init_torch(self):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        self.dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        if self.cpu:
            self.device = "cpu"
        else:
            if not torch.cuda.is_available():
                raise RuntimeError("CUDA is not available")
            self.device = "cuda"
            self.device_name = torch.cuda.get_device_name()
            # fp32 must be true fp32 (torch_math's matmuls, the float64 reference is unaffected)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
        if self.impl.startswith("torch_") and not self.cpu:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            backend = {"torch_math": SDPBackend.MATH, "torch_efficient": SDPBackend.EFFICIENT_ATTENTION,
                       "torch_flash": SDPBackend.FLASH_ATTENTION, "torch_cudnn": SDPBackend.CUDNN_ATTENTION}
            self.sdpa_context = lambda: sdpa_kernel([backend[self.impl]])
        else:
            self.sdpa_context = contextlib.nullcontext
        if self.impl == "triton":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import triton_fa
            self.triton_fa = triton_fa

    # -- one problem -> one row
    def run(self, p):
        row = new_row(self.impl, p, self.device_name)
        if self.cpu and fwd_flops(p) / 1e9 > self.cpu_max_gflop:
            row.update(status="skipped", error="over the CPU size limit")
            return row
        if self.init_error:
            row["error"] = self.init_error
            return row
        if self.pace.over(self.impl, p):
            row.update(status="skipped", error="predicted over the experiment's time limit")
            return row
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if self.impl == "triton":
                    row["config"] = self.triton_fa.config_string(p["head_dim"], self.dtypes[p["dtype"]],
                                                                 p["direction"])
                self._measure(p, row)
        except Exception as e:
            clear_measurements(row)
            row["status"], row["error"] = self.classify(e, caught)
        finally:
            gc.collect()
            if not self.cpu and self.torch is not None:
                try:
                    self.torch.cuda.empty_cache()
                except Exception:
                    pass
        self.pace.record(row, p)
        return row

    def classify(self, e, caught=()):
        msg = str(e).strip()
        first = msg.splitlines()[0] if msg else type(e).__name__
        low = msg.lower()
        torch = self.torch
        if (torch is not None and isinstance(e, torch.cuda.OutOfMemoryError)) or "out of memory" in low \
                or "can't allocate memory" in low:
            return "oom", one_line(first)
        unsupported = ("no available kernel", "not supported", "only supports", "unsupported",
                       "not implemented for")
        tf = getattr(self, "triton_fa", None)
        if (tf is not None and isinstance(e, tf.Unsupported)) or isinstance(e, NotImplementedError) \
                or any(s in low for s in unsupported):
            # torch says why a backend refused in warnings just before the error
            why = [one_line(w.message) for w in caught if "not used because" not in str(w.message)][:2]
            return "unsupported", one_line("; ".join([first] + why))
        return "error", one_line(f"{type(e).__name__}: {first}")

    # -- the calls
    def _sdpa(self, q, k, v, p, scale):
        F = self.F
        if p["causal"] and p["seq_q"] != p["seq_k"]:
            from torch.nn.attention.bias import causal_lower_right  # torch's is_causal is top-left aligned
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(p["seq_q"], p["seq_k"]),
                                                  scale=scale)
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(p["causal"]), scale=scale)

    def _attention(self, q, k, v, p, scale):
        if self.impl == "triton":
            return self.triton_fa.attention(q, k, v, bool(p["causal"]), scale)
        return self._sdpa(q, k, v, p, scale)

    def _first_call(self, fn):
        """The validated call; returns (result, peak bytes allocated during it, inputs included)."""
        torch = self.torch
        if self.cpu:
            return fn(), 0
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        res = fn()
        torch.cuda.synchronize()
        return res, int(torch.cuda.max_memory_allocated())

    def _measure(self, p, row):
        torch = self.torch
        dt = self.dtypes[p["dtype"]]
        B, H, Sq, Sk, d = p["batch"], p["heads"], p["seq_q"], p["seq_k"], p["head_dim"]
        scale = 1.0 / math.sqrt(d)
        causal = bool(p["causal"])
        bwd = p["direction"] == "bwd"
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        dist = input_dist(p)
        q = draw_input(torch, (B, H, Sq, d), dt, self.device, gen, dist)
        k = draw_input(torch, (B, H, Sk, d), dt, self.device, gen, dist)
        v = draw_input(torch, (B, H, Sk, d), dt, self.device, gen, dist)
        dout = draw_input(torch, (B, H, Sq, d), dt, self.device, gen, dict(dist, scale=1.0)) if bwd else None
        atol, rtol = FWD_TOL[p["dtype"]]
        tf = getattr(self, "triton_fa", None)

        with self.sdpa_context():
            if not bwd:
                if tf is not None:  # the raw launch (allocates O and LSE, as SDPA allocates its output)
                    run = lambda: tf.forward(q, k, v, causal, scale)
                else:
                    run = lambda: self._attention(q, k, v, p, scale)
                if tf is not None:
                    # ours writes into NaN-poisoned buffers: an element it never writes stays NaN
                    o_buf = torch.full((B, H, Sq, d), float("nan"), device=self.device, dtype=dt)
                    lse_buf = torch.full((B, H, Sq), float("nan"), device=self.device, dtype=torch.float32)
                    validated = lambda: tf.forward(q, k, v, causal, scale, o=o_buf, lse=lse_buf)
                    (out, lse), peak = self._first_call(validated)
                    lse_nan = bool(torch.isnan(lse).any())
                else:
                    # torch allocates its own output, so it cannot be pre-poisoned; a NaN/Inf anywhere in
                    # the output is checked instead (the reference has none: masked rows are 0)
                    out, peak = self._first_call(run)
                    lse_nan = False
                row["peak_bytes"] = peak
                non_finite = int((~torch.isfinite(out)).sum())
                rows = sample_rows(B * H, Sq, self.rows, self.seed)
                ref = reference_rows(torch, q, k, v, rows, causal, scale)
                idx = torch.tensor(rows, dtype=torch.long, device=out.device)
                got = out.reshape(B * H * Sq, d).index_select(0, idx).double()
                stats = error_stats(torch, got, ref, atol, rtol)
                del out
                problems = []
                if non_finite:
                    problems.append(f"{non_finite} non-finite output elements")
                if lse_nan:
                    problems.append("LSE has unwritten (NaN) entries")
                if stats["bad"]:
                    problems.append(f"{stats['bad']} of {stats['count']} checked elements over atol+rtol*|ref| "
                                    f"(first: {stats['first_bad']})")
            else:
                for t in (q, k, v):
                    t.requires_grad_(True)
                if tf is not None:
                    out, lse = tf.attention(q, k, v, causal, scale, return_lse=True)
                else:
                    out = self._attention(q, k, v, p, scale)
                run = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                if tf is not None:
                    bufs = {n: torch.full(t.shape, float("nan"), device=self.device, dtype=dt)
                            for n, t in (("dq", q), ("dk", k), ("dv", v))}
                    validated = lambda: tf.backward(q.detach(), k.detach(), v.detach(), out.detach(), lse, dout,
                                                    causal, scale, **bufs)
                else:
                    validated = run  # torch allocates the gradients: checked for NaN/Inf instead
                grads, peak = self._first_call(validated)
                row["peak_bytes"] = peak
                non_finite = sum(int((~torch.isfinite(g)).sum()) for g in grads)
                n = min(BWD_REF_SLICES, B * H)
                refs = reference_grads(torch, q.detach(), k.detach(), v.detach(), dout, n, causal, scale)
                gots = [g.detach().reshape((B * H,) + tuple(g.shape[2:]))[:n].double() for g in grads]
                del grads
                if tf is not None:
                    del bufs
                stats = error_stats(torch, torch.cat([g.flatten() for g in gots]),
                                    torch.cat([r.flatten() for r in refs]), atol, rtol)
                bound = BWD_REL_L2[p["dtype"]]
                detail, problems = {}, []
                for name, g, r in zip(("dq", "dk", "dv"), gots, refs):
                    rel = rel_l2(torch, g, r)
                    detail[name + "_rel_l2"] = finite(rel)
                    if not (rel <= bound):  # NaN fails too
                        problems.append(f"{name} rel_l2 {rel:.3g} over {bound:g}")
                row["detail"] = detail
                if non_finite:
                    problems.insert(0, f"{non_finite} non-finite gradient elements")
            row.update(max_abs=finite(stats["max_abs"]), mean_abs=finite(stats["mean_abs"]),
                       mse=finite(stats["mse"]), max_rel=finite(stats["max_rel"]))
            if problems:
                row["status"], row["error"] = "invalid", one_line("; ".join(problems))
                return  # not timed, as the worker does not time an invalid candidate
            times = self._time_cpu(run) if self.cpu else self._time_gpu(run)
        set_timing(row, p, times)
        row["status"], row["error"] = "ok", ""

    def _time_gpu(self, run):
        torch = self.torch
        flush = torch.empty(L2_FLUSH_BYTES // 4, device="cuda", dtype=torch.float32)
        for _ in range(WARMUP):
            run()
        torch.cuda.synchronize()
        times = []
        for i in range(self.reps):
            flush.fill_(float(i))  # evicts the inputs from L2: each timed call starts cold
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        del flush
        return times

    def _time_cpu(self, run):
        t0 = time.perf_counter()
        run()  # warm-up, also sizes the number of repeats
        warm = time.perf_counter() - t0
        n = self.reps
        if warm * n > CPU_TIME_BUDGET_S:
            n = max(3, int(CPU_TIME_BUDGET_S / max(warm, 1e-9)))
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
        return times


# ------------------------------------------------------------------------- float64 references

def draw_input(torch, shape, dt, device, gen, dist):
    """Seeded inputs of the problem's distribution, as the worker draws them: normal times scale, or
    Student-t with 3 degrees of freedom (Z / sqrt(chi2_3 / 3), clamped to +-32) times scale; rounded to
    the dtype. The default (normal, 1) is torch.randn in the dtype, as before."""
    if dist == DEFAULT_INPUTS:
        return torch.randn(shape, device=device, dtype=dt, generator=gen)
    x = torch.randn(shape, device=device, dtype=torch.float32, generator=gen)
    if dist["distribution"] == "heavy":
        chi2 = sum(torch.randn(shape, device=device, dtype=torch.float32, generator=gen) ** 2 for _ in range(3))
        x = (x / torch.sqrt(torch.clamp(chi2, min=1e-30) / 3)).clamp(-HEAVY_CLAMP, HEAVY_CLAMP)
    return (x * dist["scale"]).to(dt)


def reference_rows(torch, q, k, v, rows, causal, scale):
    """Exact float64 attention for the flat query rows given (bh * Sq + i), on q's device: one head at a
    time, bottom-right causal, a fully masked row gives 0. Returns [len(rows), d] float64."""
    B, H, Sq, d = q.shape
    Sk = k.shape[2]
    qf, kf, vf = q.detach().reshape(B * H, Sq, d), k.detach().reshape(B * H, Sk, d), v.detach().reshape(B * H, Sk, d)
    out = torch.zeros((len(rows), d), dtype=torch.float64, device=q.device)
    by_head = {}
    for pos, r in enumerate(rows):
        by_head.setdefault(r // Sq, []).append(pos)
    for bh, positions in by_head.items():
        qi_list = [rows[pos] % Sq for pos in positions]
        qi = torch.tensor(qi_list, dtype=torch.long, device=q.device)
        s = (qf[bh].index_select(0, qi).double() @ kf[bh].double().T) * scale  # [r, Sk]
        if causal:
            j = torch.arange(Sk, device=q.device)
            s = s.masked_fill(j[None, :] > (qi[:, None] + (Sk - Sq)), float("-inf"))
        m = s.max(dim=1, keepdim=True).values
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # all -inf: exp gives 0s, not NaN
        e = torch.exp(s - m)
        l = e.sum(dim=1, keepdim=True)
        o = (e @ vf[bh].double()) / torch.where(l > 0, l, torch.ones_like(l))
        out[torch.tensor(positions, dtype=torch.long, device=q.device)] = o
    return out


def reference_grads(torch, q, k, v, dout, n_slices, causal, scale):
    """float64 dQ, dK, dV of the first n_slices (batch, head) slices by autograd, in query chunks so the
    score matrix stays small (the gradients are sums over query rows). Rows that see no key (Sq > Sk,
    causal) have O = 0 and contribute nothing: dQ = 0 there. Returns three [n, S, d] float64 tensors."""
    B, H, Sq, d = q.shape
    Sk = k.shape[2]
    qf = q.reshape(B * H, Sq, d)[:n_slices].double()
    kf = k.reshape(B * H, Sk, d)[:n_slices].double()
    vf = v.reshape(B * H, Sk, d)[:n_slices].double()
    dof = dout.reshape(B * H, Sq, d)[:n_slices].double()
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
    first = max(0, Sq - Sk) if causal else 0
    chunk = max(1, min(Sq, (64 << 20) // (8 * Sk)))
    with torch.enable_grad():
        for s in range(n_slices):
            for c0 in range(first, Sq, chunk):
                c1 = min(Sq, c0 + chunk)
                qc = qf[s, c0:c1].clone().requires_grad_(True)
                kc = kf[s].clone().requires_grad_(True)
                vc = vf[s].clone().requires_grad_(True)
                sc = (qc @ kc.T) * scale
                if causal:
                    i = torch.arange(c0, c1, device=q.device)
                    j = torch.arange(Sk, device=q.device)
                    sc = sc.masked_fill(j[None, :] > (i[:, None] + (Sk - Sq)), float("-inf"))
                oc = torch.softmax(sc, dim=-1) @ vc
                gq, gk, gv = torch.autograd.grad(oc, (qc, kc, vc), dof[s, c0:c1])
                dq[s, c0:c1] = gq
                dk[s] += gk
                dv[s] += gv
    return dq, dk, dv


def error_stats(torch, got, ref, atol, rtol):
    """max_abs, mean_abs, mse, max_rel (|e| / max(|ref|, atol)) and the count over atol + rtol*|ref|, as
    ErrorStats in worker/validate.hpp: a non-finite value counts as bad and makes max_abs/max_rel inf;
    mean and mse are over the finite ones."""
    got = got.double().flatten()
    ref = ref.double().flatten()
    ok_num = torch.isfinite(got)
    err = (got - ref).abs()
    bad_mask = ~ok_num | (err > atol + rtol * ref.abs())
    n_fin = int(ok_num.sum())
    e_fin = torch.where(ok_num, err, torch.zeros_like(err))
    out = {"count": int(got.numel()), "bad": int(bad_mask.sum())}
    if n_fin:
        out["mean_abs"] = float(e_fin.sum()) / n_fin
        out["mse"] = float((e_fin * e_fin).sum()) / n_fin
    else:
        out["mean_abs"] = out["mse"] = 0.0
    if n_fin < got.numel():
        out["max_abs"] = out["max_rel"] = math.inf
    elif got.numel():
        out["max_abs"] = float(err.max())
        out["max_rel"] = float((err / torch.clamp(ref.abs(), min=atol)).max())
    else:
        out["max_abs"] = out["max_rel"] = 0.0
    first = []
    if out["bad"]:
        for i in torch.nonzero(bad_mask).flatten()[:3].tolist():
            first.append(f"[{i}] got {float(got[i]):.7g} want {float(ref[i]):.7g}")
    out["first_bad"] = "; ".join(first)
    return out


def rel_l2(torch, g, r):
    num = float(torch.linalg.vector_norm((g - r).flatten()))
    den = float(torch.linalg.vector_norm(r.flatten()))
    return num / den if den > 0 else num


# ------------------------------------------------------------------------------------------- CLI

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", required=True, choices=IMPLS)
    ap.add_argument("--problems", required=True, help="JSON list of problems (or a flashtune problem-set file)")
    ap.add_argument("--out", required=True, help="JSON lines, one row per problem")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--rows", type=int, default=512, help="query rows checked against float64 (forward)")
    ap.add_argument("--cpu-max-gflop", type=float, default=50.0)
    ap.add_argument("--time-limit-s", type=float, default=0.0, help="0: no pace-based skipping")
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    return a


def main(argv=None):
    a = parse_args(argv)
    try:
        with open(a.problems) as f:
            problems = load_problems(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"baselines.py: {a.problems}: {one_line(e)}", file=sys.stderr)
        return 2
    runner = Runner(a.impl, reps=a.reps, seed=a.seed, rows=a.rows, cpu_max_gflop=a.cpu_max_gflop,
                    time_limit_s=a.time_limit_s)
    with open(a.out, "w") as out:
        for p in problems:
            try:
                row = runner.run(p)
            except Exception as e:  # belt and braces: run() already turns errors into rows
                row = new_row(a.impl, p, runner.device_name)
                row["error"] = one_line(f"{type(e).__name__}: {e}")
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(progress_line(row), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
