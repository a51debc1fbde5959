"""flashtune.tune_model(model, example_inputs, ...) (this module is flashtune._model): record the attention calls
of one forward and backward of the model through flashtune.torch.attention, then tune exactly their buckets.

    import flashtune
    picks = flashtune.tune_model(model, (tokens,), budget="10m")

The model must call flashtune.torch.attention (directly or through flashtune.torch.FlashAttention). One
forward runs with the example inputs (a tuple of positional arguments, or a dict of keyword arguments); when
any recorded call had inputs that require a gradient and the output gives a loss (loss_fn(output), else the sum
of every floating-point tensor in the output), one backward runs too, and the backward is tuned as well. The
recorded calls are grouped by (dtype, mask) and deduplicated by the runtime's bucket (dtype,
head dim, mask, grouped-query or not, the next power of two of max(Sq, Sk)), keeping each bucket's largest
shape; each group is tuned by flashtune.tune with an equal share of the budget. Returns (calls, picks): the
recorded calls as dicts, and flashtune.tune's picks of every group.
"""
from ._autotune import bucket
from ._lib import one_line
from ._tune import parse_budget, tune

__all__ = ["tune_model"]

MAX_CALLS = 100000  # recorded calls kept (a model that calls attention more often in one step is cut there)


def plan(calls):
    """The tune groups of recorded calls: [(dtype, causal, direction, [shape dicts])], one shape per bucket (its
    largest by batch x heads x seq_q x seq_k), in first-seen order. A call is a dict with batch, heads, heads_k,
    seq_q, seq_k, head_dim, dtype, causal, deterministic, grad (True: the backward ran for it). (A tune measures
    every config of a family's space, its bitwise-reproducible ones too: deterministic calls need no group.)"""
    groups, order = {}, []
    for c in calls:
        g = (c["dtype"], bool(c["causal"]))
        if g not in groups:
            groups[g] = {"grad": False, "buckets": {}}
            order.append(g)
        grp = groups[g]
        grp["grad"] = grp["grad"] or bool(c["grad"])
        # decode calls also by their batch x kv heads class, as the runtime's decode buckets (_autotune.bucket)
        key = bucket(c["dtype"], c["head_dim"], c["causal"], c["heads_k"] != c["heads"], c["seq_q"], c["seq_k"],
                     batch_heads=int(c["batch"]) * int(c["heads_k"]))
        shape = {k: int(c[k]) for k in ("batch", "heads", "seq_q", "seq_k", "head_dim")}
        if c["heads_k"] != c["heads"]:
            shape["heads_k"] = int(c["heads_k"])
        old = grp["buckets"].get(key)
        if old is None or _size(shape) > _size(old):
            grp["buckets"][key] = shape
    return [(g[0], g[1], "both" if groups[g]["grad"] else "fwd", list(groups[g]["buckets"].values())) for g in order]


def _size(shape):
    return shape["batch"] * shape["heads"] * shape["seq_q"] * shape["seq_k"]


def tune_model(model, example_inputs, budget="10m", strategy="halving", loss_fn=None, device=0, progress=True):
    """Records the flashtune.torch.attention calls of one forward (and backward) of `model` on `example_inputs`
    and tunes their buckets into the user's store within `budget` (see the module's doc). ValueError (one line)
    when the model made no such call."""
    import torch  # noqa: F401  (flashtune.torch needs it; a clear ImportError otherwise)
    from . import torch as ft_torch

    budget_s = parse_budget(budget)
    calls = ft_torch._record_calls(lambda: _step(model, example_inputs, loss_fn), MAX_CALLS)
    if not calls:
        raise ValueError(one_line("flashtune.tune_model: the model made no flashtune.torch.attention call on the "
                                  "example inputs (it must call flashtune.torch.attention or FlashAttention)"))
    groups = plan(calls)
    picks = []
    for dtype, causal, direction, shapes in groups:
        share = budget_s / len(groups)
        picks += tune(shapes, dtype=dtype, causal=causal, budget=max(1.0, share), strategy=strategy,
                      direction=direction, device=device, progress=progress)
    return calls, picks


def _step(model, example_inputs, loss_fn):
    import torch
    out = model(**example_inputs) if isinstance(example_inputs, dict) else model(*example_inputs)
    loss = loss_fn(out) if loss_fn is not None else _sum_floats(out)
    if loss is not None and torch.is_tensor(loss) and loss.requires_grad:
        loss.backward()


def _sum_floats(out):
    import torch
    if torch.is_tensor(out):
        return out.float().sum() if out.is_floating_point() else None
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else ()
    total = None
    for x in items:
        s = _sum_floats(x)
        if s is not None:
            total = s if total is None else total + s
    return total
