"""Tuning at first use, opt-in (this module is flashtune._autotune; flashtune.torch.autotune() and the
FLASHTUNE_AUTOTUNE=1 environment variable switch it on).

The first eager call of a bucket whose pick is not tuned for this GPU runs flashtune.tune() for the call's shape,
forward and backward, within the budget (FLASHTUNE_AUTOTUNE_BUDGET or autotune(budget=...), default 60 s per
bucket), in the CLI's worker processes (a candidate that faults takes down a worker, never the caller), into the
user's store, which this call's pick and every later call and process then read. A bucket is what the runtime's
tables key on: dtype, head dim, mask, grouped-query or not, and the sequence bucket (the next power of two of
max(Sq, Sk)). Tuned means that explain() names the user's store, a store in $FLASHTUNE_DB or this GPU's own
table ("user", "db", "device") for the forward and the backward.

Concurrent processes tune a bucket once: each takes an exclusive lock on a file beside the store named after
the bucket (flock); the one that waited finds the bucket tuned when it gets the lock and goes on. A bucket is
considered once per process: a tune that failed (its one-line error is printed once) is not retried until the
next process. Nothing is tuned while torch.compile traces or a CUDA graph is captured (the call runs the pick
it has; the next eager call of the bucket tunes).
"""
import fcntl
import hashlib
import os
import sys
import threading

from ._lib import FlashtuneError, one_line
from ._tune import parse_budget

DEFAULT_BUDGET_S = 60.0
TUNED_SOURCES = ("user", "db", "device")

_lock = threading.Lock()
_seen = set()
_override = None  # (enabled, budget_s) from autotune(), else the environment decides


def _env():
    """(enabled, budget_s) from FLASHTUNE_AUTOTUNE ("1" on; unset, "" or "0" off) and FLASHTUNE_AUTOTUNE_BUDGET;
    ValueError, one line, for any other value."""
    flag = os.environ.get("FLASHTUNE_AUTOTUNE", "")
    if flag not in ("", "0", "1"):
        raise ValueError(one_line(f"FLASHTUNE_AUTOTUNE must be 0 or 1, not {flag[:40]!r}"))
    budget = os.environ.get("FLASHTUNE_AUTOTUNE_BUDGET", "")
    try:
        budget_s = parse_budget(budget) if budget else DEFAULT_BUDGET_S
    except ValueError as e:
        raise ValueError(one_line(f"FLASHTUNE_AUTOTUNE_BUDGET: {e}")) from None
    return flag == "1", budget_s


def requested():
    """Whether the caller asked for tuning at first use at all (cheap: the hot path's only question). An invalid
    environment value counts as asked, so that settings() reports it on the first call."""
    if _override is not None:
        return _override[0]
    return os.environ.get("FLASHTUNE_AUTOTUNE", "") not in ("", "0")


def settings():
    """(enabled, budget_s): autotune()'s, else the environment's (checked)."""
    return _override if _override is not None else _env()


def configure(enabled=True, budget="60s"):
    """autotune(budget=...): on (or off) for this process from now on, whatever the environment says."""
    global _override
    if not isinstance(enabled, bool):
        raise TypeError(one_line(f"flashtune.torch.autotune: enabled must be a bool, not {type(enabled).__name__}"))
    _override = (enabled, parse_budget(budget))


def reset():
    """Back to the environment's setting, every bucket unseen (tests)."""
    global _override
    with _lock:
        _seen.clear()
    _override = None


def seq_bucket(seq_q, seq_k):
    """The tables' sequence bucket: the next power of two of max(Sq, Sk) (core/problem.cpp, Problem::seq_bucket)."""
    s, b = max(int(seq_q), int(seq_k)), 1
    while b < s:
        b *= 2
    return b


def bucket(dtype, head_dim, causal, gqa, seq_q, seq_k, deterministic=False):
    return (str(dtype), int(head_dim), bool(causal), bool(gqa), seq_bucket(seq_q, seq_k), bool(deterministic))


def lock_path(store, key):
    """The bucket's lock file beside the store."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    return f"{store}.autotune-{digest}.lock"


def first_use(key, shape, dtype, causal, device, is_tuned, store_path, tune, budget_s):
    """The first-use protocol for one bucket, with its pieces passed in (flashtune.torch passes explain(),
    the user's store path and flashtune.tune): returns "seen" (considered before in this process), "tuned"
    (already tuned, or tuned by another process while this one waited), "autotuned" (tuned here) or
    "failed: <one line>" (the call goes on with the pick it has)."""
    with _lock:
        if key in _seen:
            return "seen"
        _seen.add(key)
    try:
        if is_tuned():
            return "tuned"
        store = store_path()
        folder = os.path.dirname(store)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(lock_path(store, key), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another process tuning this bucket: wait for it
            if is_tuned():
                return "tuned"
            tune(shape, dtype=dtype, causal=causal, budget=budget_s, direction="both", device=device, progress=False)
            return "autotuned"
        finally:
            os.close(fd)  # releases the lock
    except (FlashtuneError, ValueError, OSError) as e:
        msg = one_line(f"flashtune autotune: {key}: {e}")
        print(msg, file=sys.stderr)
        return "failed: " + msg
