"""ctypes bindings over the flashtune runtime's C ABI (runtime/include/flashtune/attention.h).

The structs below mirror the header field for field (tests/test_python_unit.py compares their sizes and
offsets with a C++ program compiled against the header). The library is found through
$FLASHTUNE_LIBRARY (a path to libflashtune_attention.so, as the tests in the build tree use), else beside
this package (where `pip install .` puts it). It is loaded at first use, so `import flashtune` works
where it is missing, and a non-FT_OK status becomes a Python exception carrying ft_last_error()'s line.
Nothing here needs torch: tensors are passed as (device pointer, 4 element strides), packed
variable-length tensors ([total, heads, d]) as (device pointer, 3 element strides), a paged K/V cache's pools
([num_pages, heads_k, page_size, d]) as (device pointer, 4 element strides) too.
"""
import atexit
import ctypes
import math
import os
import struct
import threading

LIBRARY_NAME = "libflashtune_attention.so"
ENV_LIBRARY = "FLASHTUNE_LIBRARY"

# ft_status
FT_OK = 0
FT_INVALID_ARGUMENT = 1
FT_UNSUPPORTED = 2
FT_NO_GPU = 3
FT_CUDA_ERROR = 4
FT_COMPILE_ERROR = 5
STATUS_NAMES = {FT_OK: "FT_OK", FT_INVALID_ARGUMENT: "FT_INVALID_ARGUMENT", FT_UNSUPPORTED: "FT_UNSUPPORTED",
                FT_NO_GPU: "FT_NO_GPU", FT_CUDA_ERROR: "FT_CUDA_ERROR", FT_COMPILE_ERROR: "FT_COMPILE_ERROR"}

# ft_dtype
DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2}

_INT_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


# --- errors ------------------------------------------------------------------------------------
class FlashtuneError(RuntimeError):
    """A runtime call returned a status other than FT_OK; str() is ft_last_error()'s line."""
    status = None


class InvalidArgumentError(FlashtuneError, ValueError):
    status = FT_INVALID_ARGUMENT


class UnsupportedError(FlashtuneError, ValueError):
    status = FT_UNSUPPORTED


class NoGpuError(FlashtuneError):
    status = FT_NO_GPU


class CudaError(FlashtuneError):
    status = FT_CUDA_ERROR


class CompileError(FlashtuneError):
    status = FT_COMPILE_ERROR


class LibraryNotFoundError(FlashtuneError, OSError):
    """libflashtune_attention.so could not be found or loaded."""


_ERRORS = {c.status: c for c in (InvalidArgumentError, UnsupportedError, NoGpuError, CudaError, CompileError)}


def one_line(msg, limit=400):
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


# --- the structs of attention.h ----------------------------------------------------------------
class FtTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("stride", ctypes.c_int64 * 4)]


class FtMods(ctypes.Structure):
    """ft_mods: a sliding window (window 1, its edges; -1 unbounded), a softcap (0: off) and ALiBi's fp32 device
    slopes (NULL: none) with their batch stride (0: [H]); zeroed: none."""
    _fields_ = [("window", ctypes.c_int), ("window_left", ctypes.c_int), ("window_right", ctypes.c_int),
                ("softcap", ctypes.c_float), ("alibi_slopes", ctypes.c_void_p), ("alibi_batch_stride", ctypes.c_int64)]


# C enums (ft_dtype) are int-sized on the platforms CUDA supports.
_HEAD = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("seq_q", ctypes.c_int), ("seq_k", ctypes.c_int),
         ("head_dim", ctypes.c_int), ("dtype", ctypes.c_int), ("causal", ctypes.c_int), ("scale", ctypes.c_float)]


# ft_mask_mod (ABI 0.8): a mask predicate and its named int32 tensors (attention.h).
MAX_MASK_TENSORS = 4


class FtMaskMod(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("predicate", ctypes.c_char_p), ("num_tensors", ctypes.c_int),
                ("names", ctypes.c_char_p * MAX_MASK_TENSORS), ("tensors", ctypes.c_void_p * MAX_MASK_TENSORS),
                ("lengths", ctypes.c_int64 * MAX_MASK_TENSORS), ("versions", ctypes.c_uint64 * MAX_MASK_TENSORS)]


class FtForwardArgs(ctypes.Structure):
    _fields_ = _HEAD + [("q", FtTensor), ("k", FtTensor), ("v", FtTensor), ("o", FtTensor),
                        ("lse", ctypes.c_void_p), ("heads_k", ctypes.c_int), ("mods", FtMods),
                        ("mask_mod", ctypes.c_void_p)]


class FtBackwardArgs(ctypes.Structure):
    _fields_ = _HEAD + [("q", FtTensor), ("k", FtTensor), ("v", FtTensor), ("o", FtTensor), ("dout", FtTensor),
                        ("lse", ctypes.c_void_p),
                        ("dq", FtTensor), ("dk", FtTensor), ("dv", FtTensor),
                        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
                        ("heads_k", ctypes.c_int), ("deterministic", ctypes.c_int), ("mods", FtMods),
                        ("mask_mod", ctypes.c_void_p)]


class FtPackedTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("stride", ctypes.c_int64 * 3)]


_VARLEN_HEAD = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("heads_k", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("total_q", ctypes.c_int), ("total_k", ctypes.c_int), ("max_seqlen_q", ctypes.c_int),
                ("max_seqlen_k", ctypes.c_int), ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("causal", ctypes.c_int), ("scale", ctypes.c_float)]


class FtVarlenForwardArgs(ctypes.Structure):
    _fields_ = _VARLEN_HEAD + [("q", FtPackedTensor), ("k", FtPackedTensor), ("v", FtPackedTensor),
                               ("o", FtPackedTensor), ("lse", ctypes.c_void_p), ("mods", FtMods)]


class FtVarlenBackwardArgs(ctypes.Structure):
    _fields_ = _VARLEN_HEAD + [("q", FtPackedTensor), ("k", FtPackedTensor), ("v", FtPackedTensor),
                               ("o", FtPackedTensor), ("dout", FtPackedTensor), ("lse", ctypes.c_void_p),
                               ("dq", FtPackedTensor), ("dk", FtPackedTensor), ("dv", FtPackedTensor),
                               ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
                               ("deterministic", ctypes.c_int), ("mods", FtMods)]


class FtPagedForwardArgs(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("heads_k", ctypes.c_int), ("seq_q", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("num_pages", ctypes.c_int), ("page_size", ctypes.c_int),
                ("max_pages", ctypes.c_int), ("max_seqlen_k", ctypes.c_int), ("dtype", ctypes.c_int),
                ("causal", ctypes.c_int), ("scale", ctypes.c_float), ("block_table", ctypes.c_void_p),
                ("cache_seqlens", ctypes.c_void_p), ("q", FtTensor), ("k_pages", FtTensor), ("v_pages", FtTensor),
                ("o", FtTensor), ("lse", ctypes.c_void_p), ("layout", ctypes.c_int)]


# ft_page_layout: the pools' layout of a paged call (FtPagedForwardArgs.layout, ABI 0.7).
FT_PAGES_HND, FT_PAGES_NHD = 0, 1
PAGE_LAYOUTS = {"hnd": FT_PAGES_HND, "nhd": FT_PAGES_NHD}


class FtExplanation(ctypes.Structure):
    _fields_ = [("family", ctypes.c_char * 32), ("config", ctypes.c_char * 160), ("source", ctypes.c_char * 16),
                ("cache", ctypes.c_char * 16), ("device", ctypes.c_char * 96), ("arch", ctypes.c_char * 16)]

    def as_dict(self):
        return {name: getattr(self, name).decode("utf-8", "replace") for name, _ in self._fields_}


# ft_scratch_alloc_fn, ft_scratch_free_fn (set_scratch_allocator)
SCRATCH_ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
SCRATCH_FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_void_p)


# --- loading -----------------------------------------------------------------------------------
_lock = threading.Lock()
_lib = None
_load_error = None


def library_path():
    """Where the library is looked for: $FLASHTUNE_LIBRARY, else beside this package."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def _bind(lib):
    P = ctypes.POINTER
    sigs = {
        "ft_attention_forward": (ctypes.c_int, [P(FtForwardArgs), ctypes.c_void_p]),
        "ft_attention_backward": (ctypes.c_int, [P(FtBackwardArgs), ctypes.c_void_p]),
        "ft_backward_workspace_bytes": (ctypes.c_int, [P(FtBackwardArgs), P(ctypes.c_size_t)]),
        "ft_explain_forward": (ctypes.c_int, [P(FtForwardArgs), P(FtExplanation)]),
        "ft_explain_forward_text": (ctypes.c_int, [P(FtForwardArgs), ctypes.c_char_p, ctypes.c_size_t]),
        "ft_explain_backward": (ctypes.c_int, [P(FtBackwardArgs), P(FtExplanation)]),
        "ft_attention_varlen_forward": (ctypes.c_int, [P(FtVarlenForwardArgs), ctypes.c_void_p]),
        "ft_attention_varlen_backward": (ctypes.c_int, [P(FtVarlenBackwardArgs), ctypes.c_void_p]),
        "ft_varlen_backward_workspace_bytes": (ctypes.c_int, [P(FtVarlenBackwardArgs), P(ctypes.c_size_t)]),
        "ft_explain_varlen_forward": (ctypes.c_int, [P(FtVarlenForwardArgs), P(FtExplanation)]),
        "ft_explain_varlen_backward": (ctypes.c_int, [P(FtVarlenBackwardArgs), P(FtExplanation)]),
        "ft_attention_paged_forward": (ctypes.c_int, [P(FtPagedForwardArgs), ctypes.c_void_p]),
        "ft_explain_paged_forward": (ctypes.c_int, [P(FtPagedForwardArgs), P(FtExplanation)]),
        "ft_explain_paged_forward_text": (ctypes.c_int, [P(FtPagedForwardArgs), ctypes.c_char_p, ctypes.c_size_t]),
        "ft_set_scratch_allocator": (ctypes.c_int, [SCRATCH_ALLOC_FN, SCRATCH_FREE_FN, ctypes.c_void_p]),
        "ft_release_scratch": (ctypes.c_int, []),
        "ft_check_mask_mod": (ctypes.c_int, [P(FtMaskMod)]),
        "ft_scratch_pool_bytes": (ctypes.c_int, [P(ctypes.c_size_t)]),
        "ft_reload_settings": (ctypes.c_int, []),
        "ft_device_available": (ctypes.c_int, []),
        "ft_last_error": (ctypes.c_char_p, []),
        "ft_version": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)  # AttributeError: a library without the whole ABI
        fn.restype, fn.argtypes = res, args
    return lib


def load():
    """The bound library; raises LibraryNotFoundError (one line) when it cannot be loaded."""
    global _lib, _load_error
    with _lock:
        if _lib is None and _load_error is None:
            path = library_path()
            try:
                if not os.path.isfile(path):
                    raise OSError(f"{path} does not exist")
                _lib = _bind(ctypes.CDLL(path))
            except (OSError, AttributeError) as e:
                _load_error = one_line(f"cannot load the flashtune runtime library ({ENV_LIBRARY} or beside the "
                                       f"package): {e}")
        if _lib is None:
            raise LibraryNotFoundError(_load_error)
        return _lib


def last_error():
    return one_line(load().ft_last_error().decode("utf-8", "replace"))


def check(status, what):
    """FT_OK passes; any other status raises its exception with ft_last_error()'s line, or the exception the
    Python scratch allocator raised during the call (torch's out-of-memory error, as a torch.empty would)."""
    if status == FT_OK:
        return
    raised = getattr(_scratch_raised, "error", None)
    _scratch_raised.error = None
    if raised is not None and last_error().startswith("the scratch allocator"):
        raise raised
    msg = last_error() or STATUS_NAMES.get(status, f"status {status}")
    cls = _ERRORS.get(status, FlashtuneError)
    err = cls(f"{what}: {msg}")
    err.status = status
    raise err


def version():
    return load().ft_version().decode()


def device_available():
    """(True, "") when a CUDA device is usable, else (False, one line saying why); never raises."""
    try:
        lib = load()
    except LibraryNotFoundError as e:
        return False, str(e)
    status = lib.ft_device_available()
    if status == FT_OK:
        return True, ""
    return False, last_error() or STATUS_NAMES.get(status, f"status {status}")


# --- scratch (ft_set_scratch_allocator) ----------------------------------------------------------
_scratch_callbacks = None  # the installed ctypes pair
_scratch_kept = []  # every pair ever installed: a call in flight on another thread frees through the pair it began with
_scratch_raised = threading.local()  # what alloc raised during this thread's call, for check() to raise


def set_scratch_allocator(alloc, free):
    """Every runtime call's scratch from alloc(nbytes, device, stream) -> device pointer (an int, 256-byte aligned,
    usable in stream order on `stream`, a raw CUstream int, 0 for the legacy default stream) and back through
    free(ptr, nbytes, device, stream), as ft_set_scratch_allocator says; (None, None): the library's own pool again.
    An exception alloc raises fails the call, which then raises that exception (check). Process-wide; the pair is
    uninstalled when the interpreter exits (no Python to call after it)."""
    global _scratch_callbacks
    if (alloc is None) != (free is None):
        raise ValueError("set_scratch_allocator: give alloc and free, or neither (None, None) for the library's pool")
    for name, fn in (("alloc", alloc), ("free", free)):
        if fn is not None and not callable(fn):
            raise TypeError(f"set_scratch_allocator: {name} must be callable, got {type(fn).__name__}")
    lib = load()
    if alloc is None:
        check(lib.ft_set_scratch_allocator(SCRATCH_ALLOC_FN(), SCRATCH_FREE_FN(), None), "flashtune scratch")
        _scratch_callbacks = None
        return

    def c_alloc(nbytes, device, stream, _user):
        try:
            ptr = alloc(nbytes, device, stream or 0)
            return _int_in("the scratch allocator's pointer", ptr, 1, 2**64 - 1)
        except BaseException as e:  # nothing may unwind into the library: the call fails, check() raises e
            _scratch_raised.error = e
            return None

    def c_free(ptr, nbytes, device, stream, _user):
        free(ptr, nbytes, device, stream or 0)  # an exception here is printed by ctypes (unraisable): no caller

    pair = (SCRATCH_ALLOC_FN(c_alloc), SCRATCH_FREE_FN(c_free))
    check(lib.ft_set_scratch_allocator(pair[0], pair[1], None), "flashtune scratch")
    if not _scratch_kept:
        atexit.register(_uninstall_scratch_allocator)
    _scratch_kept.append(pair)
    _scratch_callbacks = pair


def _uninstall_scratch_allocator():
    global _scratch_callbacks
    if _scratch_callbacks is not None and _lib is not None:
        _lib.ft_set_scratch_allocator(SCRATCH_ALLOC_FN(), SCRATCH_FREE_FN(), None)
        _scratch_callbacks = None


def release_scratch():
    """ft_release_scratch: the library's own pool returns its memory to the driver (what no queued call still uses)."""
    check(load().ft_release_scratch(), "flashtune release scratch")


def reload_settings():
    """ft_reload_settings: every cached plan forgotten; the next call reads $FLASHTUNE_DB, $XDG_CACHE_HOME, $HOME
    and the store they name again (otherwise looked at again at most once a second)."""
    check(load().ft_reload_settings(), "flashtune reload settings")


def scratch_pool_bytes():
    """ft_scratch_pool_bytes: the bytes the library's own pool holds now (0 when it was never used)."""
    n = ctypes.c_size_t(0)
    check(load().ft_scratch_pool_bytes(ctypes.byref(n)), "flashtune scratch pool")
    return n.value


# --- keyword flags of the torch layer (no torch: tested without it) ---------------------------
def flag(fn, name, value):
    """value when it is True or False, else a one-line TypeError: a keyword that picks what a call returns or runs
    (flashtune.torch's return_lse) takes a bool, never a truthy object or a tensor, whose truth would need a
    device read."""
    if value is True or value is False:
        return value
    raise TypeError(f"{fn}: {name} must be True or False, got {type(value).__name__}")


# --- argument packing (no torch) ---------------------------------------------------------------
def _int_in(name, x, lo, hi):
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if not lo <= x <= hi:
        raise ValueError(f"{name} = {x} is out of range [{lo}, {hi}]")
    return x


def _pointer_strides(name, t, dims):
    """(device pointer, strides in elements) checked in range: the pointer (None for 0) and a ctypes int64
    array; dims names the axes, one stride each."""
    try:
        ptr, strides = t
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a (pointer, strides) pair") from None
    _int_in(f"{name} pointer", ptr, 0, 2**64 - 1)
    strides = tuple(strides)
    if len(strides) != len(dims):
        raise ValueError(f"{name} needs {len(dims)} strides ([{', '.join(dims)}]), got {len(strides)}")
    for i, s in enumerate(strides):
        _int_in(f"{name} stride[{i}]", s, -_INT64_MAX, _INT64_MAX)
    return ptr or None, (ctypes.c_int64 * len(dims))(*strides)


def make_tensor(name, t):
    """(device pointer, 4 strides in elements) -> FtTensor, every value checked in range."""
    return FtTensor(*_pointer_strides(name, t, ("B", "H", "S", "d")))


def _dtype_causal_scale(args, dtype, causal, scale):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    args.dtype = DTYPES[dtype]
    args.causal = 1 if causal else 0
    if scale is None:
        scale = 0.0  # the runtime's 1/sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"scale must be a positive finite number (or None for 1/sqrt(head_dim)), got {scale}")
    args.scale = scale


def _head(args, shape, dtype, causal, scale):
    if len(shape) != 5:
        raise ValueError(f"shape must be (batch, heads, seq_q, seq_k, head_dim), got {len(shape)} values")
    for name, x in zip(("batch", "heads", "seq_q", "seq_k", "head_dim"), shape):
        setattr(args, name, _int_in(name, x, 1, _INT_MAX))
    _dtype_causal_scale(args, dtype, causal, scale)


def _heads_k(args, heads_k):
    """Grouped-query attention's kv heads: 0 (= heads) or a divisor of heads."""
    hk = _int_in("heads_k", heads_k, 0, _INT_MAX)
    if hk and args.heads % hk:
        raise ValueError(f"heads_k {hk} must divide heads {args.heads}")
    args.heads_k = hk


# Score modifications (ft_mods): FlashAttention's window_size and softcap.
MAX_WINDOW = 2**30
NO_MODS = (0, 0, 0, 0.0, 0, 0)  # ..., alibi_slopes (pointer, 0: none), alibi_batch_stride


def mods_tuple(window_size=(-1, -1), softcap=0.0):
    """(window, window_left, window_right, softcap, 0, 0) for ft_mods from FlashAttention's window_size (left, right;
    -1 unbounded) and softcap (0: off), no ALiBi slopes; ValueError (one line) for a value the runtime refuses."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be (left, right), -1 unbounded, got {window_size!r}") from None
    left = _int_in("window_size[0]", left, -1, MAX_WINDOW)
    right = _int_in("window_size[1]", right, -1, MAX_WINDOW)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise ValueError(f"softcap must be a number, got {softcap!r}")
    softcap = float(softcap)
    if not math.isfinite(softcap) or softcap < 0 or (softcap and not 1e-3 <= softcap <= 1e6):
        raise ValueError(f"softcap must be 0 (off) or a number in [0.001, 1000000], got {softcap}")
    windowed = left >= 0 or right >= 0
    return (1, left, right, softcap, 0, 0) if windowed else (0, 0, 0, softcap, 0, 0)


def _set_mods(args, window_size, softcap):
    args.mods = FtMods(*mods_tuple(window_size, softcap))


def forward_args(shape, dtype, causal, scale, q, k, v, o, lse, heads_k=0, window_size=(-1, -1), softcap=0.0):
    """shape (B, H, Sq, Sk, d); q, k, v, o as (pointer, strides); lse a pointer (0: not wanted); heads_k
    the kv heads of k and v (grouped-query attention; 0: H)."""
    a = FtForwardArgs()
    _head(a, shape, dtype, causal, scale)
    _heads_k(a, heads_k)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        setattr(a, name, make_tensor(name, t))
    a.lse = _int_in("lse pointer", lse, 0, 2**64 - 1) or None
    _set_mods(a, window_size, softcap)
    return a


# Packed variable-length batches: the sizes checked here are those the runtime checks on the host too
# (attention.h); the offsets in device memory are the caller's to get right.
MAX_VARLEN_SEQS = 65535
MAX_VARLEN_TOKENS = 2**24
VARLEN_SIZES = ("batch", "heads", "head_dim", "total_q", "total_k", "max_seqlen_q", "max_seqlen_k")


def make_packed_tensor(name, t):
    """(device pointer, 3 strides in elements: token, head, head dim) -> FtPackedTensor, checked in range."""
    return FtPackedTensor(*_pointer_strides(name, t, ("total", "heads", "d")))


def _varlen_head(args, sizes, cu_seqlens_q, cu_seqlens_k, dtype, causal, scale, heads_k):
    """sizes: dict of VARLEN_SIZES; cu_seqlens_q/k device pointers."""
    if not isinstance(sizes, dict) or set(sizes) != set(VARLEN_SIZES):
        raise ValueError(f"sizes must be a dict of {', '.join(VARLEN_SIZES)}")
    limits = {"batch": MAX_VARLEN_SEQS, "heads": _INT_MAX, "head_dim": _INT_MAX}
    for name in VARLEN_SIZES:
        setattr(args, name, _int_in(name, sizes[name], 1, limits.get(name, MAX_VARLEN_TOKENS)))
    for name, total, longest in (("q", args.total_q, args.max_seqlen_q), ("k", args.total_k, args.max_seqlen_k)):
        if total > args.batch * longest:
            raise ValueError(f"total_{name} {total} is more than batch {args.batch} x max_seqlen_{name} {longest}: "
                             f"some sequence would be longer than max_seqlen_{name}")
    for name, p in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not _int_in(f"{name} pointer", p, 0, 2**64 - 1):
            raise ValueError(f"{name} is null (batch + 1 int32 offsets in device memory)")
        setattr(args, name, p)
    _dtype_causal_scale(args, dtype, causal, scale)
    _heads_k(args, heads_k)


def varlen_forward_args(sizes, cu_seqlens_q, cu_seqlens_k, dtype, causal, scale, q, k, v, o, lse, heads_k=0,
                        window_size=(-1, -1), softcap=0.0):
    """FtVarlenForwardArgs: sizes a dict of VARLEN_SIZES; cu_seqlens_q/k device pointers; q, k, v, o as
    (pointer, 3 strides); lse a pointer (0: not wanted); heads_k the kv heads (0: heads)."""
    a = FtVarlenForwardArgs()
    _varlen_head(a, sizes, cu_seqlens_q, cu_seqlens_k, dtype, causal, scale, heads_k)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        setattr(a, name, make_packed_tensor(name, t))
    a.lse = _int_in("lse pointer", lse, 0, 2**64 - 1) or None
    _set_mods(a, window_size, softcap)
    return a


def varlen_backward_args(sizes, cu_seqlens_q, cu_seqlens_k, dtype, causal, scale, q, k, v, o, dout, lse, dq, dk, dv,
                         workspace=0, workspace_bytes=0, heads_k=0, deterministic=False, window_size=(-1, -1),
                         softcap=0.0):
    a = FtVarlenBackwardArgs()
    _varlen_head(a, sizes, cu_seqlens_q, cu_seqlens_k, dtype, causal, scale, heads_k)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        setattr(a, name, make_packed_tensor(name, t))
    a.lse = _int_in("lse pointer", lse, 0, 2**64 - 1) or None
    a.workspace = _int_in("workspace pointer", workspace, 0, 2**64 - 1) or None
    a.workspace_bytes = _int_in("workspace_bytes", workspace_bytes, 0, 2**64 - 1)
    a.deterministic = int(flag("varlen_backward_args", "deterministic", deterministic))
    _set_mods(a, window_size, softcap)
    return a


# Paged K/V caches: the sizes checked here are those the runtime checks on the host too (attention.h); the block
# table and the cache lengths in device memory are the caller's to get right.
MAX_PAGED_KEYS = 2**30  # max_pages x page_size: the kernels index a sequence's keys in 32 bits
PAGED_SIZES = ("batch", "heads", "seq_q", "head_dim", "num_pages", "page_size", "max_pages", "max_seqlen_k")


def paged_forward_args(sizes, block_table, cache_seqlens, dtype, causal, scale, q, k_pages, v_pages, o, lse, heads_k=0,
                       layout="hnd"):
    """FtPagedForwardArgs: sizes a dict of PAGED_SIZES (max_seqlen_k 0: the capacity max_pages x page_size);
    block_table and cache_seqlens device pointers (int32 [batch, max_pages] and [batch]); q, o [B, H, Sq, d] and the
    pools [num_pages, heads_k, page_size, d] (layout "nhd": [num_pages, page_size, heads_k, d]) as (pointer, 4
    strides); lse a pointer (0: not wanted); heads_k the pools' kv heads (0: heads)."""
    if not isinstance(sizes, dict) or set(sizes) != set(PAGED_SIZES):
        raise ValueError(f"sizes must be a dict of {', '.join(PAGED_SIZES)}")
    a = FtPagedForwardArgs()
    limits = {"batch": MAX_VARLEN_SEQS}
    for name in PAGED_SIZES[:-1]:
        setattr(a, name, _int_in(name, sizes[name], 1, limits.get(name, _INT_MAX)))
    capacity = a.max_pages * a.page_size
    if capacity > MAX_PAGED_KEYS:
        raise ValueError(f"max_pages x page_size = {capacity} keys a sequence is over 2^30 (the kernels index keys in "
                         f"32 bits)")
    a.max_seqlen_k = _int_in("max_seqlen_k", sizes["max_seqlen_k"], 0, capacity)
    for name, p in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        if not _int_in(f"{name} pointer", p, 0, 2**64 - 1):
            raise ValueError(f"{name} is null (int32 in device memory)")
        setattr(a, name, p)
    _dtype_causal_scale(a, dtype, causal, scale)
    _heads_k(a, heads_k)
    for name, t in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages), ("o", o)):
        setattr(a, name, make_tensor(name, t))
    a.lse = _int_in("lse pointer", lse, 0, 2**64 - 1) or None
    a.layout = page_layout_code("layout", layout)
    return a


def page_layout_code(fn, layout):
    """The ft_page_layout code of "hnd" or "nhd"; ValueError (one line) for anything else."""
    if isinstance(layout, str) and layout in PAGE_LAYOUTS:
        return PAGE_LAYOUTS[layout]
    raise ValueError(f"{fn}: layout must be \"hnd\" ([num_pages, heads_k, page_size, head_dim]) or \"nhd\" ([num_pages, "
                     f"page_size, heads_k, head_dim], FlashAttention's and vLLM's), got "
                     f"{one_line(repr(layout), 60) if isinstance(layout, str) else type(layout).__name__}")


def backward_args(shape, dtype, causal, scale, q, k, v, o, dout, lse, dq, dk, dv, workspace=0, workspace_bytes=0,
                  heads_k=0, deterministic=False, window_size=(-1, -1), softcap=0.0):
    a = FtBackwardArgs()
    _head(a, shape, dtype, causal, scale)
    _heads_k(a, heads_k)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        setattr(a, name, make_tensor(name, t))
    a.lse = _int_in("lse pointer", lse, 0, 2**64 - 1) or None
    a.workspace = _int_in("workspace pointer", workspace, 0, 2**64 - 1) or None
    a.workspace_bytes = _int_in("workspace_bytes", workspace_bytes, 0, 2**64 - 1)
    a.deterministic = int(flag("backward_args", "deterministic", deterministic))
    _set_mods(a, window_size, softcap)
    return a


# --- packing for trusted callers ------------------------------------------------------------------
# The torch layer calls the runtime twice per training step; packing field by field above costs tens of
# microseconds of Python per call (measured on an H100 host: 35-110 us of a 0.1-0.3 ms forward). Its
# values come from torch (ints, checked shapes), so it packs the same structs with one struct.pack_into:
# the formats below spell the structs' layouts (checked against ctypes, and through tests/abi_layout.cpp
# against the header, by tests/test_python_unit.py). The runtime checks every value again.
_HEAD_FMT = "=7if"
_TENSOR_FMT = "Q4q"
_MODS_FMT = "3ifQq"  # window, window_left, window_right, softcap, alibi_slopes, alibi_batch_stride (8-aligned)
FORWARD_FMT = struct.Struct(_HEAD_FMT + _TENSOR_FMT * 4 + "Q" + "i" + "4x" + _MODS_FMT + "Q")  # ..., mods, mask_mod
BACKWARD_FMT = struct.Struct(_HEAD_FMT + _TENSOR_FMT * 5 + "Q" + _TENSOR_FMT * 3 + "QQ" + "ii" + _MODS_FMT + "Q")
assert FORWARD_FMT.size == ctypes.sizeof(FtForwardArgs) and BACKWARD_FMT.size == ctypes.sizeof(FtBackwardArgs)
# Packed variable-length: 8 sizes, the two offset pointers, dtype, causal, scale (and padding), then
# 3-stride tensors.
_VARLEN_HEAD_FMT = "=8iQQiif4x"
_PACKED_FMT = "Q3q"
VARLEN_FORWARD_FMT = struct.Struct(_VARLEN_HEAD_FMT + _PACKED_FMT * 4 + "Q" + _MODS_FMT)
VARLEN_BACKWARD_FMT = struct.Struct(_VARLEN_HEAD_FMT + _PACKED_FMT * 5 + "Q" + _PACKED_FMT * 3 + "QQ" + "i" + "4x" +
                                    _MODS_FMT)
assert VARLEN_FORWARD_FMT.size == ctypes.sizeof(FtVarlenForwardArgs)
assert VARLEN_BACKWARD_FMT.size == ctypes.sizeof(FtVarlenBackwardArgs)
# Paged: 11 ints (9 sizes, dtype, causal) and scale, the block table and cache lengths, 4 tensors, lse, layout.
PAGED_FORWARD_FMT = struct.Struct("=11ifQQ" + _TENSOR_FMT * 4 + "Q" + "i4x")
assert PAGED_FORWARD_FMT.size == ctypes.sizeof(FtPagedForwardArgs)


def pack_forward(shape, dtype_code, causal, scale, q, k, v, o, lse, heads_k=0, mods=NO_MODS, mask_mod=0):
    """FtForwardArgs from (B, H, Sq, Sk, d), an ft_dtype code, causal (0/1), scale (0.0: 1/sqrt(d)), q, k,
    v, o each a 5-tuple (pointer, 4 strides), the lse pointer, heads_k (0: H), mods (mods_tuple's) and the address
    of an FtMaskMod (mask_mod_struct's; 0: none). ValueError (one line) when a value does not fit its field."""
    a = FtForwardArgs()
    try:
        FORWARD_FMT.pack_into(a, 0, *shape, dtype_code, causal, scale, *q, *k, *v, *o, lse, heads_k, *mods, mask_mod)
    except struct.error as e:
        raise ValueError(f"flashtune: an argument does not fit the runtime's struct: {e}") from None
    return a


def pack_backward(shape, dtype_code, causal, scale, q, k, v, o, dout, lse, dq, dk, dv, heads_k=0, deterministic=0,
                  mods=NO_MODS, mask_mod=0):
    """FtBackwardArgs as pack_forward, with dout, the lse pointer and dq, dk, dv; no workspace (the
    runtime allocates it); deterministic 1: bitwise-reproducible gradients; mask_mod the forward's."""
    a = FtBackwardArgs()
    try:
        BACKWARD_FMT.pack_into(a, 0, *shape, dtype_code, causal, scale, *q, *k, *v, *o, *dout, lse, *dq, *dk, *dv,
                               0, 0, heads_k, deterministic, *mods, mask_mod)
    except struct.error as e:
        raise ValueError(f"flashtune: an argument does not fit the runtime's struct: {e}") from None
    return a


def mask_mod_struct(predicate, names=(), pointers=(), lengths=(), versions=()):
    """FtMaskMod for a predicate (the body of bool mask(int b, int h, int q_idx, int kv_idx)) and its tensors: names,
    device pointers, lengths (elements) and version counters, one each per tensor. The struct keeps the encoded
    strings alive (its _keep). TypeError/ValueError (one line) for a text or name that is not a str, or too many."""
    if not isinstance(predicate, str):
        raise TypeError(f"mask_mod must be a str (the body of bool mask(int b, int h, int q_idx, int kv_idx)), got "
                        f"{type(predicate).__name__}")
    names = list(names)
    if len(names) > MAX_MASK_TENSORS:
        raise ValueError(f"mask_mod reads at most {MAX_MASK_TENSORS} tensors, got {len(names)}")
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"mask_mod tensor names must be str, got {type(n).__name__}")
    m = FtMaskMod()
    m.struct_size = ctypes.sizeof(FtMaskMod)
    try:
        keep = [predicate.encode("ascii")] + [n.encode("ascii") for n in names]
    except UnicodeEncodeError:
        raise ValueError("mask_mod holds a character that is not printable ASCII") from None
    m._keep = keep
    m.predicate = keep[0]
    m.num_tensors = len(names)
    for i, n in enumerate(keep[1:]):
        m.names[i] = n
        m.tensors[i] = pointers[i] if i < len(pointers) else 0
        m.lengths[i] = lengths[i] if i < len(lengths) else 0
        m.versions[i] = versions[i] if i < len(versions) else 0
    return m


def check_mask_mod(predicate, names=()):
    """A mask predicate and its tensors' names checked and compiled alone by the runtime (NVRTC, no GPU:
    ft_check_mask_mod): None, or InvalidArgumentError (a ValueError) with one line naming what is wrong or NVRTC's
    first error; CompileError without NVRTC."""
    names = list(names)
    m = mask_mod_struct(predicate, names, [256] * len(names), [1] * len(names))  # stand-ins: the text is checked
    check(load().ft_check_mask_mod(ctypes.byref(m)), "flashtune")


def pack_varlen_forward(sizes, cu_seqlens_q, cu_seqlens_k, dtype_code, causal, scale, q, k, v, o, lse, mods=NO_MODS):
    """FtVarlenForwardArgs from sizes (batch, heads, heads_k, head_dim, total_q, total_k, max_seqlen_q,
    max_seqlen_k: heads_k 0 means heads), the offset pointers, an ft_dtype code, causal (0/1), scale, q, k, v,
    o each a 4-tuple (pointer, 3 strides) and the lse pointer. ValueError (one line) when a value does not fit."""
    a = FtVarlenForwardArgs()
    try:
        VARLEN_FORWARD_FMT.pack_into(a, 0, *sizes, cu_seqlens_q, cu_seqlens_k, dtype_code, causal, scale, *q, *k, *v, *o,
                                     lse, *mods)
    except struct.error as e:
        raise ValueError(f"flashtune: an argument does not fit the runtime's struct: {e}") from None
    return a


def pack_varlen_backward(sizes, cu_seqlens_q, cu_seqlens_k, dtype_code, causal, scale, q, k, v, o, dout, lse, dq, dk,
                         dv, deterministic=0, mods=NO_MODS):
    """FtVarlenBackwardArgs as pack_varlen_forward, with dout, the lse pointer and dq, dk, dv; no workspace;
    deterministic 1: bitwise-reproducible gradients."""
    a = FtVarlenBackwardArgs()
    try:
        VARLEN_BACKWARD_FMT.pack_into(a, 0, *sizes, cu_seqlens_q, cu_seqlens_k, dtype_code, causal, scale, *q, *k, *v,
                                      *o, *dout, lse, *dq, *dk, *dv, 0, 0, deterministic, *mods)
    except struct.error as e:
        raise ValueError(f"flashtune: an argument does not fit the runtime's struct: {e}") from None
    return a


def pack_paged_forward(sizes, block_table, cache_seqlens, dtype_code, causal, scale, q, k_pages, v_pages, o, lse,
                       layout_code=FT_PAGES_HND):
    """FtPagedForwardArgs from sizes (batch, heads, heads_k, seq_q, head_dim, num_pages, page_size, max_pages,
    max_seqlen_k: heads_k 0 means heads, max_seqlen_k 0 the capacity), the block table and cache lengths' pointers,
    an ft_dtype code, causal (0/1), scale, q, k_pages, v_pages, o each a 5-tuple (pointer, 4 strides: the pools'
    in their layout's order), the lse pointer and an ft_page_layout code. ValueError (one line) when a value does
    not fit."""
    a = FtPagedForwardArgs()
    try:
        PAGED_FORWARD_FMT.pack_into(a, 0, *sizes, dtype_code, causal, scale, block_table, cache_seqlens, *q, *k_pages,
                                    *v_pages, *o, lse, layout_code)
    except struct.error as e:
        raise ValueError(f"flashtune: an argument does not fit the runtime's struct: {e}") from None
    return a


def _stream(stream):
    return _int_in("stream", stream or 0, 0, 2**64 - 1) or None


# --- calls -------------------------------------------------------------------------------------
def forward(args, stream=0):
    check((_lib or load()).ft_attention_forward(ctypes.byref(args), _stream(stream)), "flashtune forward")


def backward(args, stream=0):
    check((_lib or load()).ft_attention_backward(ctypes.byref(args), _stream(stream)), "flashtune backward")


def backward_workspace_bytes(args):
    n = ctypes.c_size_t(0)
    check(load().ft_backward_workspace_bytes(ctypes.byref(args), ctypes.byref(n)), "flashtune workspace")
    return n.value


def explain_forward(args):
    out = FtExplanation()
    check(load().ft_explain_forward(ctypes.byref(args), ctypes.byref(out)), "flashtune explain")
    return out.as_dict()


def explain_forward_text(args):
    """The runtime's one explain line for a dense forward (with the decode bucket and the note, where there are)."""
    buf = ctypes.create_string_buffer(512)
    check(load().ft_explain_forward_text(ctypes.byref(args), buf, len(buf)), "flashtune explain")
    return buf.value.decode("utf-8", "replace")


def explain_bucket(line):
    """The bucket an explain line names ("batch x kv heads 512 (of 8, 64, 512), Sk <= 4096": a decoding family's
    tabled or stored pick is keyed by batch x kv heads and the sequence; "group 4 (query heads per kv head),
    S <= 8192": a grouped-query call's, by its group), or "" where it names none (a multi-head bucket)."""
    head = line.split(") on ", 1)[0]
    if ", bucket: " not in head:
        return ""
    return head.split(", bucket: ", 1)[1].rsplit(", kernel: ", 1)[0]


def explain_backward(args):
    out = FtExplanation()
    check(load().ft_explain_backward(ctypes.byref(args), ctypes.byref(out)), "flashtune explain")
    return out.as_dict()


def varlen_forward(args, stream=0):
    check((_lib or load()).ft_attention_varlen_forward(ctypes.byref(args), _stream(stream)), "flashtune varlen forward")


def varlen_backward(args, stream=0):
    check((_lib or load()).ft_attention_varlen_backward(ctypes.byref(args), _stream(stream)),
          "flashtune varlen backward")


def varlen_backward_workspace_bytes(args):
    n = ctypes.c_size_t(0)
    check(load().ft_varlen_backward_workspace_bytes(ctypes.byref(args), ctypes.byref(n)), "flashtune workspace")
    return n.value


def explain_varlen_forward(args):
    out = FtExplanation()
    check(load().ft_explain_varlen_forward(ctypes.byref(args), ctypes.byref(out)), "flashtune explain")
    return out.as_dict()


def paged_forward(args, stream=0):
    check((_lib or load()).ft_attention_paged_forward(ctypes.byref(args), _stream(stream)), "flashtune paged forward")


def explain_paged_forward(args):
    out = FtExplanation()
    check(load().ft_explain_paged_forward(ctypes.byref(args), ctypes.byref(out)), "flashtune explain")
    return out.as_dict()


def explain_paged_forward_text(args):
    """The runtime's one explain line for a paged call (with its note: where the config came from when not the
    tables' paged entry)."""
    buf = ctypes.create_string_buffer(512)
    check(load().ft_explain_paged_forward_text(ctypes.byref(args), buf, len(buf)), "flashtune explain")
    return buf.value.decode("utf-8", "replace")


def explain_varlen_backward(args):
    out = FtExplanation()
    check(load().ft_explain_varlen_backward(ctypes.byref(args), ctypes.byref(out)), "flashtune explain")
    return out.as_dict()
