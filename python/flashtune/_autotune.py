"""Tuning at first use, opt-in (this module is flashtune._autotune; flashtune.torch.autotune() and the
FLASHTUNE_AUTOTUNE=1 environment variable switch it on).

The first eager call of a bucket whose pick is not tuned for this GPU runs flashtune.tune() for the call's shape,
forward and backward, within the budget (FLASHTUNE_AUTOTUNE_BUDGET or autotune(budget=...), default 60 s per
bucket), in the CLI's worker processes (a candidate that faults takes down a worker, never the caller), into the
user's store, which this call's pick and every later call and process then read. A bucket is what the runtime's
tables key on: dtype, head dim, mask, grouped-query or not, and the sequence bucket (the next power of two of
max(Sq, Sk)). Tuned means that explain() names the user's store, a store in $FLASHTUNE_DB or this GPU's own
table ("user", "db", "device") for the forward and the backward.

A call a decoding family serves (decode_splitkv: Sq <= 16, fp16/bf16, d 64/128/256) is keyed by batch x kv heads
as well, as the runtime's decode buckets are (tuned::find_in, pick_bucket: the stored value nearest the call's by
ratio): its bucket holds the power of two nearest B x Hk by ratio (batch_heads_class), it is tuned at the call's
own batch (the stored row's batch x kv heads is the call's, so it lands in that class and is the runtime's pick
for the call), and it is tuned only when explain()'s decode "bucket" also names a batch x kv heads of that class:
a B 64 call after a B 1 call at the same Sk tunes its own class rather than running B 1's pick.

Concurrent processes tune a bucket once: each takes an exclusive lock on a file beside the store named after
the bucket (flock); the one that waited finds the bucket tuned when it gets the lock and goes on. A bucket is
considered once per process: a tune that failed (its one-line error is printed once) is not retried until the
next process. Nothing is tuned while torch.compile traces or a CUDA graph is captured (the call runs the pick
it has; the next eager call of the bucket tunes).
"""
import fcntl
import hashlib
import os
import re
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


# os.environ's own mapping (what os.environ[...] = ... and os.environ.pop write), read directly by requested():
# os.environ.get costs ~0.6 us a call (the key encoded, the value decoded), on every attention() call.
_ENV_DATA = getattr(os.environ, "_data", None)
try:
    _FLAG_KEY = os.environ.encodekey("FLASHTUNE_AUTOTUNE")
    _FLAG_OFF = (os.environ.encodevalue(""), os.environ.encodevalue("0"))
except AttributeError:  # another os.environ: the mapping's own get below
    _ENV_DATA = None


def requested():
    """Whether the caller asked for tuning at first use at all (cheap: the hot path's only question). An invalid
    environment value counts as asked, so that settings() reports it on the first call."""
    if _override is not None:
        return _override[0]
    if _ENV_DATA is not None:
        v = _ENV_DATA.get(_FLAG_KEY)
        return v is not None and v not in _FLAG_OFF
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


# What the decoding families serve (core/families/decode_splitkv.cpp: Family::max_seq_q, dtypes, head_dims; the
# registry's only family with a query-length range, whose buckets the runtime keys by batch x kv heads too).
# tests/test_python_unit.py checks it against `flashtune families --json`.
DECODE_FAMILIES = (
    {"name": "decode_splitkv", "max_seq_q": 16, "dtypes": ("fp16", "bf16"), "head_dims": (64, 128, 256)},
)
_DTYPE_NAMES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}
_INT_MAX = 2**31 - 1


def dtype_name(dtype):
    """"fp16", "bf16" or "fp32" for a torch dtype or its name (anything else: its str)."""
    s = str(dtype)
    s = s[len("torch."):] if s.startswith("torch.") else s
    return _DTYPE_NAMES.get(s, s)


def decoding(dtype, head_dim, seq_q):
    """Whether a decoding family serves a call of this dtype, head dim and query length (its forward's pick, tabled
    or stored, is then keyed by batch x kv heads: runtime/src/lookup.cpp)."""
    name, sq, d = dtype_name(dtype), int(seq_q), int(head_dim)
    return any(0 < sq <= f["max_seq_q"] and name in f["dtypes"] and d in f["head_dims"] for f in DECODE_FAMILIES)


def batch_heads_class(batch_heads):
    """The class of a decode call's batch x kv heads: the power of two nearest it by ratio, a tie to the smaller
    (the rule of tuned::nearer_batch_heads and pick_bucket; 0 or less: unknown, taken as 1; at most 2^31 - 1)."""
    bh = min(max(int(batch_heads), 1), _INT_MAX)
    lo = 1 << (bh.bit_length() - 1)  # lo <= bh < 2 lo
    return lo if bh * bh <= 2 * lo * lo else 2 * lo  # bh / lo <= 2 lo / bh: lo is nearer (or a tie)


def bucket(dtype, head_dim, causal, gqa, seq_q, seq_k, deterministic=False, batch_heads=None):
    """A call's first-use bucket: (dtype, head dim, mask, grouped or not, sequence bucket, deterministic), and for a
    call a decoding family serves (decoding()) the class of its batch x kv heads (batch_heads: B x Hk, heads for
    multi-head) after them. batch_heads None: the key without it (the bucket over every batch)."""
    key = (str(dtype), int(head_dim), bool(causal), bool(gqa), seq_bucket(seq_q, seq_k), bool(deterministic))
    if batch_heads is not None and decoding(dtype, head_dim, seq_q):
        key += (batch_heads_class(batch_heads),)
    return key


def call_bucket(dtype, batch, heads, heads_k, seq_q, seq_k, head_dim, causal, deterministic=False):
    """(key, shape) for one attention() call: its bucket, and the shape to tune it at (the call's own, heads_k
    where grouped), so that a decode bucket's stored row has the call's batch x kv heads and lands in its class."""
    batch, heads, heads_k = int(batch), int(heads), int(heads_k)
    key = bucket(dtype, head_dim, causal, heads_k != heads, seq_q, seq_k, deterministic, batch * heads_k)
    shape = {"batch": batch, "heads": heads, "seq_q": int(seq_q), "seq_k": int(seq_k), "head_dim": int(head_dim)}
    if heads_k != heads:
        shape["heads_k"] = heads_k
    return key, shape


_BUCKET_TEXT = re.compile(r"batch x kv heads (\d+) ")


def explained_batch_heads(bucket_text):
    """The batch x kv heads explain()'s "bucket" names ("batch x kv heads 512 (of 8, 64, 512), Sk <= 4096": 512),
    None where it names none (the pick is not keyed by batch x kv heads)."""
    m = _BUCKET_TEXT.match(bucket_text or "")
    return int(m.group(1)) if m else None


def is_tuned(key, explanation):
    """Whether explain()'s dict says the bucket `key` is tuned: the forward's and the backward's sources are tuned
    ones, and for a decode bucket (a key with its batch x kv heads class) the forward's pick is keyed by a batch x
    kv heads of that class (a pick tuned for another batch is not this bucket's)."""
    e = explanation
    if e.get("source") not in TUNED_SOURCES or e.get("backward", {}).get("source") not in TUNED_SOURCES:
        return False
    if len(key) <= 6:
        return True
    bh = explained_batch_heads(e.get("bucket", ""))
    return bh is not None and batch_heads_class(bh) == key[6]


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
