#!/usr/bin/env python3
"""The Python package without a GPU or torch (label unit): the ctypes structs of flashtune._lib match
runtime/include/flashtune/attention.h (sizes and offsets printed by tests/abi_layout.cpp, compiled
against the header), `import flashtune` works without torch, device_available() answers with one line
(False and the reason on a machine without a GPU), and the argument checks that need no GPU: the structs'
packers, the torch layer's keyword flags (return_lse), and the two backends' op schemas (the compiled
extension's m.def strings in python/csrc against the ctypes fallback's custom ops in flashtune/torch.py, read as
text: neither needs torch here). Where torch imports (it need not), the masked ops' fakes, autograd and
torch.compile tracing on the CPU (TorchMaskOps; skipped otherwise).

Environment (tests/CMakeLists.txt): PYTHONPATH=<repo>/python, FT_ABI_LAYOUT=<abi_layout binary>,
FLASHTUNE_LIBRARY=<the built libflashtune_attention.so> (optional: without it the library tests skip),
FLASHTUNE_CLI=<the built flashtune> and FIXTURE_TOOL=<make_fixture_db> (optional: `python -m flashtune` and
flashtune.tune's CLI side; without them those skip). flashtune.tune's argument checks need neither.
"""
import ast
import ctypes
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

import flashtune
from flashtune import _lib


class StructLayout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        exe = os.environ.get("FT_ABI_LAYOUT")
        if not exe:
            raise unittest.SkipTest("FT_ABI_LAYOUT not set")
        cls.c = json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)

    def check(self, cname, pytype):
        c = self.c[cname]
        self.assertEqual(ctypes.sizeof(pytype), c["sizeof"], f"sizeof({cname})")
        py_fields = [name for name, _ in pytype._fields_]
        self.assertEqual(sorted(py_fields), sorted(c["fields"]), f"{cname}: field names")
        for name in py_fields:
            self.assertEqual(getattr(pytype, name).offset, c["fields"][name], f"offsetof({cname}, {name})")

    def test_tensor(self):
        self.check("ft_tensor", _lib.FtTensor)

    def test_mods(self):
        self.check("ft_mods", _lib.FtMods)

    def test_forward_args(self):
        self.check("ft_forward_args", _lib.FtForwardArgs)

    def test_mask_mod(self):
        self.check("ft_mask_mod", _lib.FtMaskMod)

    def test_backward_args(self):
        self.check("ft_backward_args", _lib.FtBackwardArgs)

    def test_explanation(self):
        self.check("ft_explanation", _lib.FtExplanation)

    def test_packed_tensor(self):
        self.check("ft_packed_tensor", _lib.FtPackedTensor)

    def test_varlen_forward_args(self):
        self.check("ft_varlen_forward_args", _lib.FtVarlenForwardArgs)

    def test_varlen_backward_args(self):
        self.check("ft_varlen_backward_args", _lib.FtVarlenBackwardArgs)

    def test_paged_forward_args(self):
        self.check("ft_paged_forward_args", _lib.FtPagedForwardArgs)

    def test_enums(self):
        e = self.c["enums"]
        self.assertEqual(e["sizeof_ft_status"], ctypes.sizeof(ctypes.c_int))
        self.assertEqual(e["sizeof_ft_dtype"], ctypes.sizeof(ctypes.c_int))
        for name, value in _lib.STATUS_NAMES.items():
            self.assertEqual(e[value], name, value)
        self.assertEqual({"fp32": e["FT_FP32"], "fp16": e["FT_FP16"], "bf16": e["FT_BF16"]}, _lib.DTYPES)
        self.assertEqual({"hnd": e["FT_PAGES_HND"], "nhd": e["FT_PAGES_NHD"]}, _lib.PAGE_LAYOUTS)


class ImportWithoutTorch(unittest.TestCase):
    def test_import_does_not_load_torch(self):
        code = "import sys, flashtune; flashtune.device_available(); print('torch' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
        self.assertEqual(out.strip(), "False")

    def test_missing_library_is_one_line(self):
        env = dict(os.environ, FLASHTUNE_LIBRARY="/nonexistent/libflashtune_attention.so")
        code = "import flashtune; ok, why = flashtune.device_available(); print(ok); print(why)"
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
        lines = out.splitlines()
        self.assertEqual(lines[0], "False")
        self.assertEqual(len(lines), 2, out)
        self.assertIn("/nonexistent/libflashtune_attention.so", lines[1])
        code = "import flashtune\ntry:\n  flashtune.runtime_version()\nexcept flashtune.LibraryNotFoundError as e:\n  print('raised')"
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
        self.assertEqual(out.strip(), "raised")


class ArgumentChecks(unittest.TestCase):
    """Checked in Python before the library is called: no GPU, no library needed."""
    T = (0x1000, (4096, 1024, 64, 1))

    def fwd(self, **kw):
        a = dict(shape=(1, 16, 64, 64, 64), dtype="bf16", causal=False, scale=None, q=self.T, k=self.T, v=self.T,
                 o=self.T, lse=0x2000)
        a.update(kw)
        return _lib.forward_args(**a)

    def test_good_args_packed(self):
        a = self.fwd(causal=True, scale=0.125)
        self.assertEqual((a.batch, a.heads, a.seq_q, a.seq_k, a.head_dim), (1, 16, 64, 64, 64))
        self.assertEqual((a.dtype, a.causal), (_lib.DTYPES["bf16"], 1))
        self.assertAlmostEqual(a.scale, 0.125)
        self.assertEqual(list(a.q.stride), [4096, 1024, 64, 1])
        self.assertEqual(a.q.data, 0x1000)
        self.assertEqual(a.lse, 0x2000)
        self.assertEqual(self.fwd(scale=None).scale, 0.0)  # the runtime's 1/sqrt(d)

    def test_bad_dtype(self):
        with self.assertRaisesRegex(ValueError, "dtype must be one of fp32, fp16, bf16"):
            self.fwd(dtype="fp8")

    def test_bad_sizes(self):
        with self.assertRaisesRegex(ValueError, "seq_q = 0 is out of range"):
            self.fwd(shape=(1, 16, 0, 64, 64))
        with self.assertRaisesRegex(ValueError, "batch = 2147483648 is out of range"):
            self.fwd(shape=(2**31, 16, 64, 64, 64))
        with self.assertRaisesRegex(TypeError, "head_dim must be an int"):
            self.fwd(shape=(1, 16, 64, 64, 64.0))
        with self.assertRaisesRegex(ValueError, "shape must be"):
            self.fwd(shape=(1, 16, 64, 64))

    def test_bad_tensors(self):
        with self.assertRaisesRegex(ValueError, "q needs 4 strides"):
            self.fwd(q=(0x1000, (64, 1)))
        with self.assertRaisesRegex(TypeError, "k must be a \\(pointer, strides\\) pair"):
            self.fwd(k=0x1000)
        with self.assertRaisesRegex(ValueError, "v stride\\[0\\] = .* is out of range"):
            self.fwd(v=(0x1000, (2**63, 1, 1, 1)))

    def test_bad_scale(self):
        for s in (-1.0, float("nan"), float("inf")):
            with self.assertRaisesRegex(ValueError, "scale must be a positive finite number"):
                self.fwd(scale=s)

    def test_backward_args(self):
        t = self.T
        a = _lib.backward_args((2, 8, 128, 256, 128), "fp16", True, None, t, t, t, t, t, 0x3000, t, t, t)
        self.assertEqual((a.batch, a.seq_k, a.dtype, a.causal), (2, 256, _lib.DTYPES["fp16"], 1))
        self.assertEqual((a.workspace, a.workspace_bytes), (None, 0))
        with self.assertRaisesRegex(ValueError, "dout needs 4 strides"):
            _lib.backward_args((2, 8, 128, 256, 128), "fp16", True, None, t, t, t, t, (1, (1,)), 0x3000, t, t, t)

    def test_fast_packing_matches_the_checked_one(self):
        # pack_forward/pack_backward (the torch layer's path) write the same bytes as the field-by-field
        # packers, whose layout StructLayout checks against the header.
        t = (0x1000, (4096, 1024, 64, 1))
        flat = lambda x: (x[0], *x[1])  # noqa: E731
        slow = _lib.forward_args((3, 16, 64, 96, 64), "bf16", True, 0.125, t, (0x2000, (1, 2, 3, 1)), t, t, 0x9000,
                                 heads_k=4)
        fast = _lib.pack_forward((3, 16, 64, 96, 64), _lib.DTYPES["bf16"], 1, 0.125, flat(t), (0x2000, 1, 2, 3, 1),
                                 flat(t), flat(t), 0x9000, 4)
        self.assertEqual(bytes(slow), bytes(fast))
        self.assertEqual(slow.heads_k, 4)
        slow = _lib.backward_args((2, 8, 128, 256, 128), "fp16", False, None, t, t, t, t, t, 0x3000, t, t,
                                  (0x4000, (7, 6, 5, 1)), heads_k=2)
        fast = _lib.pack_backward((2, 8, 128, 256, 128), _lib.DTYPES["fp16"], 0, 0.0, *[flat(t)] * 5, 0x3000,
                                  flat(t), flat(t), (0x4000, 7, 6, 5, 1), 2)
        self.assertEqual(bytes(slow), bytes(fast))
        with self.assertRaisesRegex(ValueError, "heads_k 3 must divide heads 8"):
            _lib.backward_args((2, 8, 128, 256, 128), "fp16", False, None, t, t, t, t, t, 0x3000, t, t, t, heads_k=3)
        with self.assertRaisesRegex(ValueError, "does not fit"):
            _lib.pack_forward((2**31, 1, 1, 1, 64), 0, 0, 0.0, *[flat(t)] * 4, 0)
        # Score modifications: the same bytes both ways, FlashAttention's spelling in, ft_mods out.
        slow = _lib.forward_args((3, 16, 64, 96, 64), "bf16", False, 0.125, t, t, t, t, 0, window_size=(128, -1),
                                 softcap=30)
        fast = _lib.pack_forward((3, 16, 64, 96, 64), _lib.DTYPES["bf16"], 0, 0.125, *[flat(t)] * 4, 0, 0,
                                 _lib.mods_tuple((128, -1), 30))
        self.assertEqual(bytes(slow), bytes(fast))
        self.assertEqual((slow.mods.window, slow.mods.window_left, slow.mods.window_right, slow.mods.softcap),
                         (1, 128, -1, 30.0))
        slow = _lib.backward_args((2, 8, 128, 256, 128), "fp16", True, None, *[t] * 5, 0x3000, t, t, t,
                                  deterministic=True, window_size=(0, 0))
        fast = _lib.pack_backward((2, 8, 128, 256, 128), _lib.DTYPES["fp16"], 1, 0.0, *[flat(t)] * 5, 0x3000,
                                  *[flat(t)] * 3, 0, 1, _lib.mods_tuple((0, 0)))
        self.assertEqual(bytes(slow), bytes(fast))

    def test_mods(self):
        self.assertEqual(_lib.mods_tuple(), _lib.NO_MODS)  # zeroed: none
        self.assertEqual(_lib.mods_tuple((-1, -1), 0), (0, 0, 0, 0.0, 0, 0))  # no ALiBi slopes: NULL, stride 0
        self.assertEqual(_lib.mods_tuple((-1, 0)), (1, -1, 0, 0.0, 0, 0))
        self.assertEqual(_lib.mods_tuple((4096, 4096), 50.0), (1, 4096, 4096, 50.0, 0, 0))
        for bad, pattern in [(dict(window_size=(-2, 0)), r"window_size\[0\] = -2 is out of range"),
                             (dict(window_size=(0, 2**30 + 1)), r"window_size\[1\] = 1073741825 is out of range"),
                             (dict(window_size=5), r"window_size must be \(left, right\)"),
                             (dict(window_size=(1, 2, 3)), r"window_size must be \(left, right\)"),
                             (dict(softcap=-1.0), r"softcap must be 0 \(off\) or a number"),
                             (dict(softcap=float("nan")), r"softcap must be 0 \(off\) or a number"),
                             (dict(softcap=1e-4), r"softcap must be 0 \(off\) or a number"),
                             (dict(softcap="30"), r"softcap must be a number")]:
            with self.assertRaisesRegex((ValueError, TypeError), pattern):
                _lib.mods_tuple(**bad)
        with self.assertRaisesRegex(TypeError, r"window_size\[0\] must be an int"):
            _lib.mods_tuple((1.5, 0))

    def test_error_classes(self):
        self.assertTrue(issubclass(flashtune.UnsupportedError, ValueError))
        self.assertTrue(issubclass(flashtune.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(flashtune.CudaError, RuntimeError))
        self.assertTrue(issubclass(flashtune.UnsupportedError, flashtune.FlashtuneError))


class VarlenArgumentChecks(unittest.TestCase):
    """Packed variable-length batches: checked in Python before the library is called."""
    T = (0x1000, (8 * 128, 128, 1))
    K = (0x5000, (2 * 128, 128, 1))
    SIZES = dict(batch=3, heads=8, head_dim=128, total_q=300, total_k=500, max_seqlen_q=200, max_seqlen_k=300)

    def fwd(self, sizes=None, **kw):
        a = dict(sizes=dict(self.SIZES, **(sizes or {})), cu_seqlens_q=0x7000, cu_seqlens_k=0x7100, dtype="bf16",
                 causal=True, scale=None, q=self.T, k=self.K, v=self.K, o=self.T, lse=0x2000, heads_k=2)
        a.update(kw)
        return _lib.varlen_forward_args(**a)

    def test_good_args_packed(self):
        a = self.fwd()
        self.assertEqual((a.batch, a.heads, a.heads_k, a.head_dim), (3, 8, 2, 128))
        self.assertEqual((a.total_q, a.total_k, a.max_seqlen_q, a.max_seqlen_k), (300, 500, 200, 300))
        self.assertEqual((a.cu_seqlens_q, a.cu_seqlens_k), (0x7000, 0x7100))
        self.assertEqual((a.dtype, a.causal, a.scale), (_lib.DTYPES["bf16"], 1, 0.0))
        self.assertEqual(list(a.k.stride), [256, 128, 1])
        self.assertEqual(a.lse, 0x2000)

    def test_bad_sizes(self):
        cases = [({"batch": 0}, "batch = 0 is out of range"),
                 ({"batch": 65536}, "batch = 65536 is out of range \\[1, 65535\\]"),
                 ({"total_q": 2**24 + 1}, "total_q = 16777217 is out of range"),
                 ({"max_seqlen_k": 0}, "max_seqlen_k = 0 is out of range"),
                 ({"total_q": 601}, "total_q 601 is more than batch 3 x max_seqlen_q 200"),
                 ({"max_seqlen_k": 166}, "total_k 500 is more than batch 3 x max_seqlen_k 166")]
        for sizes, pattern in cases:
            with self.assertRaisesRegex(ValueError, pattern):
                self.fwd(sizes=sizes)
        with self.assertRaisesRegex(ValueError, "sizes must be a dict of batch"):
            _lib.varlen_forward_args({"batch": 3}, 0x7000, 0x7100, "bf16", True, None, self.T, self.K, self.K, self.T, 0)
        with self.assertRaisesRegex(TypeError, "head_dim must be an int"):
            self.fwd(sizes={"head_dim": 128.0})

    def test_bad_offsets_and_tensors(self):
        with self.assertRaisesRegex(ValueError, "cu_seqlens_q is null"):
            self.fwd(cu_seqlens_q=0)
        with self.assertRaisesRegex(ValueError, "q needs 3 strides \\(\\[total, heads, d\\]\\)"):
            self.fwd(q=(0x1000, (1024, 128, 128, 1)))
        with self.assertRaisesRegex(TypeError, "o must be a \\(pointer, strides\\) pair"):
            self.fwd(o=0x1000)
        with self.assertRaisesRegex(ValueError, "heads_k 3 must divide heads 8"):
            self.fwd(heads_k=3)
        with self.assertRaisesRegex(ValueError, "dtype must be one of"):
            self.fwd(dtype="fp8")

    def test_fast_packing_matches_the_checked_one(self):
        flat = lambda x: (x[0], *x[1])  # noqa: E731
        sz = self.SIZES
        sizes = (sz["batch"], sz["heads"], 2, sz["head_dim"], sz["total_q"], sz["total_k"], sz["max_seqlen_q"],
                 sz["max_seqlen_k"])
        slow = self.fwd(scale=0.125)
        fast = _lib.pack_varlen_forward(sizes, 0x7000, 0x7100, _lib.DTYPES["bf16"], 1, 0.125, flat(self.T),
                                        flat(self.K), flat(self.K), flat(self.T), 0x2000)
        self.assertEqual(bytes(slow), bytes(fast))
        t, k = self.T, self.K
        slow = _lib.varlen_backward_args(dict(sz), 0x7000, 0x7100, "fp16", False, None, t, k, k, t, t, 0x3000, t,
                                         (0x6000, (512, 128, 1)), k, heads_k=2)
        fast = _lib.pack_varlen_backward(sizes, 0x7000, 0x7100, _lib.DTYPES["fp16"], 0, 0.0, flat(t), flat(k), flat(k),
                                         flat(t), flat(t), 0x3000, flat(t), (0x6000, 512, 128, 1), flat(k))
        self.assertEqual(bytes(slow), bytes(fast))
        self.assertEqual((slow.workspace, slow.workspace_bytes), (None, 0))
        with self.assertRaisesRegex(ValueError, "does not fit"):
            _lib.pack_varlen_forward((2**31, *sizes[1:]), 0x7000, 0x7100, 2, 0, 0.0, *[flat(t)] * 4, 0)
        slow = self.fwd(scale=0.125, window_size=(64, 64), softcap=20.0)
        fast = _lib.pack_varlen_forward(sizes, 0x7000, 0x7100, _lib.DTYPES["bf16"], 1, 0.125, flat(self.T),
                                        flat(self.K), flat(self.K), flat(self.T), 0x2000, _lib.mods_tuple((64, 64), 20))
        self.assertEqual(bytes(slow), bytes(fast))
        slow = _lib.varlen_backward_args(dict(sz), 0x7000, 0x7100, "fp16", False, None, t, k, k, t, t, 0x3000, t, t, k,
                                         heads_k=2, deterministic=True, window_size=(7, -1), softcap=1.5)
        fast = _lib.pack_varlen_backward(sizes, 0x7000, 0x7100, _lib.DTYPES["fp16"], 0, 0.0, flat(t), flat(k), flat(k),
                                         flat(t), flat(t), 0x3000, flat(t), flat(t), flat(k), 1,
                                         _lib.mods_tuple((7, -1), 1.5))
        self.assertEqual(bytes(slow), bytes(fast))


class PagedArgumentChecks(unittest.TestCase):
    """Paged K/V caches: checked in Python before the library is called."""
    Q = (0x1000, (8 * 128, 128, 128, 1))
    POOL = (0x5000, (2 * 64 * 128, 64 * 128, 128, 1))
    SIZES = dict(batch=3, heads=8, seq_q=1, head_dim=128, num_pages=40, page_size=64, max_pages=16, max_seqlen_k=900)

    def fwd(self, sizes=None, **kw):
        a = dict(sizes=dict(self.SIZES, **(sizes or {})), block_table=0x7000, cache_seqlens=0x7100, dtype="bf16",
                 causal=True, scale=None, q=self.Q, k_pages=self.POOL, v_pages=self.POOL, o=self.Q, lse=0x2000,
                 heads_k=2)
        a.update(kw)
        return _lib.paged_forward_args(**a)

    def test_good_args_packed(self):
        a = self.fwd()
        self.assertEqual((a.batch, a.heads, a.heads_k, a.seq_q, a.head_dim), (3, 8, 2, 1, 128))
        self.assertEqual((a.num_pages, a.page_size, a.max_pages, a.max_seqlen_k), (40, 64, 16, 900))
        self.assertEqual((a.block_table, a.cache_seqlens), (0x7000, 0x7100))
        self.assertEqual((a.dtype, a.causal, a.scale), (_lib.DTYPES["bf16"], 1, 0.0))
        self.assertEqual(list(a.k_pages.stride), [2 * 64 * 128, 64 * 128, 128, 1])
        self.assertEqual(self.fwd(sizes={"max_seqlen_k": 0}).max_seqlen_k, 0)  # the capacity

    def test_bad_sizes(self):
        cases = [({"batch": 0}, "batch = 0 is out of range"),
                 ({"batch": 65536}, "batch = 65536 is out of range \\[1, 65535\\]"),
                 ({"page_size": 0}, "page_size = 0 is out of range"),
                 ({"max_pages": 2**20, "page_size": 2048}, "max_pages x page_size = 2147483648 keys a sequence is over "
                                                            "2\\^30"),
                 ({"max_seqlen_k": 1025}, "max_seqlen_k = 1025 is out of range \\[0, 1024\\]"),
                 ({"max_seqlen_k": -1}, "max_seqlen_k = -1 is out of range")]
        for sizes, pattern in cases:
            with self.assertRaisesRegex(ValueError, pattern):
                self.fwd(sizes=sizes)
        with self.assertRaisesRegex(ValueError, "sizes must be a dict of batch"):
            _lib.paged_forward_args({"batch": 3}, 0x7000, 0x7100, "bf16", True, None, self.Q, self.POOL, self.POOL,
                                    self.Q, 0)
        with self.assertRaisesRegex(TypeError, "num_pages must be an int"):
            self.fwd(sizes={"num_pages": 40.0})

    def test_bad_pointers_and_tensors(self):
        with self.assertRaisesRegex(ValueError, "block_table is null"):
            self.fwd(block_table=0)
        with self.assertRaisesRegex(ValueError, "cache_seqlens is null"):
            self.fwd(cache_seqlens=0)
        with self.assertRaisesRegex(ValueError, "k_pages needs 4 strides"):
            self.fwd(k_pages=(0x5000, (64 * 128, 128, 1)))
        with self.assertRaisesRegex(ValueError, "heads_k 3 must divide heads 8"):
            self.fwd(heads_k=3)

    def test_fast_packing_matches_the_checked_one(self):
        flat = lambda x: (x[0], *x[1])  # noqa: E731
        sz = self.SIZES
        sizes = (sz["batch"], sz["heads"], 2, sz["seq_q"], sz["head_dim"], sz["num_pages"], sz["page_size"],
                 sz["max_pages"], sz["max_seqlen_k"])
        slow = self.fwd(scale=0.125, v_pages=(0x6000, (1, 2, 3, 1)))
        fast = _lib.pack_paged_forward(sizes, 0x7000, 0x7100, _lib.DTYPES["bf16"], 1, 0.125, flat(self.Q),
                                       flat(self.POOL), (0x6000, 1, 2, 3, 1), flat(self.Q), 0x2000)
        self.assertEqual(bytes(slow), bytes(fast))
        with self.assertRaisesRegex(ValueError, "does not fit"):
            _lib.pack_paged_forward((2**31, *sizes[1:]), 0x7000, 0x7100, 2, 0, 0.0, *[flat(self.Q)] * 4, 0)
        # Token-major pools: the layout code in the struct's last field, both packers alike.
        nhd_pool = (0x5000, (64 * 2 * 128, 2 * 128, 128, 1))  # [num_pages, page_size, heads_k, d]
        slow = self.fwd(scale=0.125, k_pages=nhd_pool, v_pages=nhd_pool, layout="nhd")
        fast = _lib.pack_paged_forward(sizes, 0x7000, 0x7100, _lib.DTYPES["bf16"], 1, 0.125, flat(self.Q),
                                       flat(nhd_pool), flat(nhd_pool), flat(self.Q), 0x2000, _lib.FT_PAGES_NHD)
        self.assertEqual(bytes(slow), bytes(fast))
        self.assertEqual(fast.layout, _lib.FT_PAGES_NHD)

    def test_layout(self):
        self.assertEqual(self.fwd().layout, _lib.FT_PAGES_HND)  # the default: head-major pages, ABI 0.6's meaning
        self.assertEqual(self.fwd(layout="hnd").layout, 0)
        self.assertEqual(self.fwd(layout="nhd").layout, 1)
        self.assertEqual(_lib.PAGE_LAYOUTS, {"hnd": 0, "nhd": 1})
        for bad in ("NHD", "bshd", "", None, 1, b"nhd", ["nhd"]):
            with self.assertRaises(ValueError) as cm:
                self.fwd(layout=bad)
            self.assertNotIn("\n", str(cm.exception))
            self.assertRegex(str(cm.exception), r'^layout: layout must be "hnd" \(\[num_pages, heads_k, page_size, '
                                                r'head_dim\]\) or "nhd"')
        with self.assertRaisesRegex(ValueError, r"^flashtune\.torch\.attention_paged: layout must be .* got 'x'$"):
            _lib.page_layout_code("flashtune.torch.attention_paged", "x")


class WithLibrary(unittest.TestCase):
    """The built library through ctypes: version, device_available's one line, errors as exceptions."""

    @classmethod
    def setUpClass(cls):
        if not os.environ.get("FLASHTUNE_LIBRARY"):
            raise unittest.SkipTest("FLASHTUNE_LIBRARY not set (the runtime library is not built)")
        _lib.load()

    def test_version(self):
        self.assertRegex(flashtune.runtime_version(), r"^\d+\.\d+\.\d+$")

    def test_device_available_one_line(self):
        ok, why = flashtune.device_available()
        self.assertIsInstance(ok, bool)
        self.assertNotIn("\n", why)
        if ok:
            self.assertEqual(why, "")
        else:
            self.assertTrue(why, "no reason given")
            print(f"device_available() -> (False, {why!r})", file=sys.stderr)
        if os.environ.get("FT_EXPECT_NO_GPU") == "1":
            self.assertFalse(ok)

    def test_failing_call_raises_with_last_error(self):
        # Null pointers: refused as an invalid argument, or (no GPU) FT_NO_GPU first. Either way an
        # exception of the status's class whose message is ft_last_error()'s one line.
        t = (0, (4096, 1024, 64, 1))
        a = _lib.forward_args((1, 16, 64, 64, 64), "bf16", False, None, t, t, t, t, 0)
        with self.assertRaises(flashtune.FlashtuneError) as cm:
            _lib.forward(a, 0)
        e = cm.exception
        self.assertIn(e.status, (_lib.FT_INVALID_ARGUMENT, _lib.FT_NO_GPU))
        self.assertIsInstance(e, flashtune.InvalidArgumentError if e.status == _lib.FT_INVALID_ARGUMENT
                              else flashtune.NoGpuError)
        msg = str(e)
        self.assertNotIn("\n", msg)
        self.assertGreater(len(msg.split(": ", 1)[-1]), 0)
        print(f"null pointers -> {type(e).__name__}: {msg}", file=sys.stderr)

    def test_mask_mod_checks(self):
        # mask_mod (ABI 0.8): the predicate checked and compiled alone by the runtime (NVRTC, no GPU): a ValueError
        # (InvalidArgumentError) in one line for a refused text, an unread tensor, an NVRTC error; None when good.
        try:
            _lib.check_mask_mod("doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx", ["doc"])
        except flashtune.CompileError as e:
            raise unittest.SkipTest(f"no NVRTC: {e}")
        for text, names, says in [
                ("#include <cstdio>\nreturn true;", [], "mask_mod may not hold '#'"),
                ("return 1; } void f() {", [], "mask_mod has an unbalanced '}'"),
                ("return true;", ["doc"], "mask_mod tensor 'doc' is not read by the predicate"),
                ("int d = doc; return d > 0;", ["doc"], "mask_mod does not compile: no suitable conversion"),
                ("dox[q_idx] == 0", ["doc"], "mask_mod tensor 'doc' is not read"),
                ("dox[q_idx] == doc[0]", ["doc"], 'identifier "dox" is undefined (at column 1')]:
            with self.subTest(text=text):
                with self.assertRaises(ValueError) as cm:
                    _lib.check_mask_mod(text, names)
                self.assertIsInstance(cm.exception, flashtune.InvalidArgumentError)
                self.assertIn(says, str(cm.exception))
                self.assertNotIn("\n", str(cm.exception))
        with self.assertRaises(TypeError):
            _lib.check_mask_mod(b"kv_idx <= q_idx")
        with self.assertRaises(ValueError):
            _lib.check_mask_mod("q_idx > 0", ["a", "b", "c", "d", "e"])
        m = _lib.mask_mod_struct("doc[q_idx] > 0", ["doc"], [4096], [10], [3])
        self.assertEqual((m.num_tensors, m.tensors[0], m.lengths[0], m.versions[0]), (1, 4096, 10, 3))
        self.assertEqual(m.struct_size, ctypes.sizeof(_lib.FtMaskMod))
        t = (0, 4096, 1024, 64, 1)  # (pointer, 4 strides)
        a = _lib.pack_forward((1, 16, 64, 64, 64), 2, 0, 0.0, t, t, t, t, 0, 0, _lib.NO_MODS, ctypes.addressof(m))
        self.assertEqual(a.mask_mod, ctypes.addressof(m))

    def test_scratch_allocator_and_pool(self):
        # set_scratch_allocator: both functions or neither (one line, before the runtime; the runtime's own check is
        # one line too); an installed pair's alloc wrapper hands the runtime a pointer, or NULL with the exception kept
        # for check() to raise; the runtime's pool holds 0 bytes and releasing it is a no-op where no call reached a
        # GPU (no GPU here: calls stop at the driver before any scratch).
        with self.assertRaisesRegex(ValueError, r"^set_scratch_allocator: give alloc and free, or neither"):
            _lib.set_scratch_allocator(lambda n, d, s: 256, None)
        with self.assertRaisesRegex(TypeError, r"^set_scratch_allocator: alloc must be callable, got int$"):
            _lib.set_scratch_allocator(1, lambda p, n, d, s: None)
        keep = _lib.SCRATCH_ALLOC_FN(lambda n, d, s, u: None)
        self.assertEqual(_lib.load().ft_set_scratch_allocator(keep, _lib.SCRATCH_FREE_FN(), None),
                         _lib.FT_INVALID_ARGUMENT)
        self.assertEqual(_lib.last_error(), "free_fn is null: give both functions, or neither for the library's pool")
        seen = []

        def alloc(nbytes, device, stream):
            seen.append((nbytes, device, stream))
            if nbytes > 4096:
                raise MemoryError("out of memory (a test's)")
            return 0x7f0000000000

        try:
            _lib.set_scratch_allocator(alloc, lambda p, n, d, s: None)
            c_alloc = _lib._scratch_callbacks[0]
            self.assertEqual(c_alloc(512, 0, 0x5f00, None), 0x7f0000000000)
            self.assertIsNone(c_alloc(8192, 1, None, None))
            self.assertEqual(seen, [(512, 0, 0x5f00), (8192, 1, 0)])  # a NULL stream as 0, torch's default stream
            self.assertIsInstance(_lib._scratch_raised.error, MemoryError)
        finally:
            _lib._scratch_raised.error = None
            _lib.set_scratch_allocator(None, None)
        self.assertIsNone(_lib._scratch_callbacks)
        if not flashtune.device_available()[0]:
            self.assertEqual(_lib.scratch_pool_bytes(), 0)
        _lib.release_scratch()
        self.assertEqual(_lib.last_error(), "")

    def test_explain_text_and_its_decode_bucket(self):
        # The dense forward's explain line is bound (no GPU here: FT_NO_GPU or an argument refusal, one line), and the
        # decode bucket is read out of such a line, "" where there is none.
        t = (0, (4096, 1024, 64, 1))
        with self.assertRaises(flashtune.FlashtuneError) as cm:
            _lib.explain_forward_text(_lib.forward_args((1, 16, 64, 64, 64), "bf16", False, None, t, t, t, t, 0))
        self.assertIn(cm.exception.status, (_lib.FT_INVALID_ARGUMENT, _lib.FT_NO_GPU))
        self.assertNotIn("\n", str(cm.exception))
        line = ("decode_splitkv SPLITS=1,BLOCK_N=256,WARPS=4,STAGES=1 (config: device, bucket: batch x kv heads 512 "
                "(of 8, 64, 512), Sk <= 4096, kernel: jit) on NVIDIA H100 80GB HBM3 (sm_90)")
        self.assertEqual(_lib.explain_bucket(line), "batch x kv heads 512 (of 8, 64, 512), Sk <= 4096")
        self.assertEqual(_lib.explain_bucket(line + "; a note, bucket: not this, kernel: nor this"),
                         "batch x kv heads 512 (of 8, 64, 512), Sk <= 4096")
        self.assertEqual(_lib.explain_bucket("fa2_mma BLOCK_M=128 (config: device, kernel: disk) on GPU (sm_90)"), "")
        self.assertEqual(_lib.explain_bucket(""), "")
        # A grouped-query call's tabled or stored pick names its group's bucket; it is no decode bucket.
        gqa = ("fa3_wgmma_bwd BLOCK_M=64 (config: device, bucket: group 4 (query heads per kv head), S <= 8192, "
               "kernel: jit) on NVIDIA H200 (sm_90)")
        self.assertEqual(_lib.explain_bucket(gqa), "group 4 (query heads per kv head), S <= 8192")
        self.assertIsNone(flashtune._autotune.explained_batch_heads(_lib.explain_bucket(gqa)))

    def test_varlen_calls_raise_with_last_error(self):
        # A null q through the packed entry points: the runtime's own check (the Python packer accepts a 0
        # pointer), or FT_NO_GPU first; its line in the exception.
        t, k = (0, (8 * 128, 128, 1)), (0x5000, (2 * 128, 128, 1))
        sizes = dict(batch=3, heads=8, head_dim=128, total_q=300, total_k=500, max_seqlen_q=200, max_seqlen_k=300)
        a = _lib.varlen_forward_args(sizes, 0x7000, 0x7100, "bf16", True, None, t, k, k, (0x1000, t[1]), 0,
                                     heads_k=2)
        with self.assertRaises(flashtune.FlashtuneError) as cm:
            _lib.varlen_forward(a, 0)
        self.assertIn(cm.exception.status, (_lib.FT_INVALID_ARGUMENT, _lib.FT_NO_GPU))
        if cm.exception.status == _lib.FT_INVALID_ARGUMENT:
            self.assertIn("q.data is null", str(cm.exception))
        # fp32 has no packed family: FT_UNSUPPORTED before any driver call.
        a = _lib.varlen_forward_args(sizes, 0x7000, 0x7100, "fp32", True, None, (0x1000, t[1]), k, k, (0x1000, t[1]),
                                     0, heads_k=2)
        with self.assertRaisesRegex(flashtune.UnsupportedError, "no family runs fp32 packed variable-length forward"):
            _lib.varlen_forward(a, 0)
        q = (0x1000, t[1])
        b = _lib.varlen_backward_args(sizes, 0x7000, 0x7100, "bf16", True, None, q, k, k, q, q, 0, q, k, k, heads_k=2)
        with self.assertRaisesRegex(flashtune.InvalidArgumentError, "lse is null"):
            _lib.varlen_backward(b, 0)

    def test_paged_calls_raise_with_last_error(self):
        # The runtime's own checks, before any driver call: a pool in FlashAttention's [num_blocks, page_size,
        # heads_k, d] layout, pages no config reads, Sq past the decoding range; each its class and one line.
        q = (0x1000, (8 * 128, 128, 128, 1))
        pool = (0x5000, (2 * 64 * 128, 64 * 128, 128, 1))
        sizes = dict(batch=3, heads=8, seq_q=1, head_dim=128, num_pages=40, page_size=64, max_pages=16, max_seqlen_k=0)

        def call(fn, **kw):
            a = dict(sizes=dict(sizes), block_table=0x7000, cache_seqlens=0x7100, dtype="bf16", causal=False,
                     scale=None, q=q, k_pages=pool, v_pages=pool, o=q, lse=0, heads_k=2)
            a.update(kw)
            fn(_lib.paged_forward_args(**a))

        with self.assertRaisesRegex(flashtune.InvalidArgumentError, "k_pages is not a contiguous \\[num_pages, "
                                                                    "heads_k, page_size, head_dim\\] pool"):
            call(lambda a: _lib.paged_forward(a, 0), k_pages=(0x5000, (2 * 64 * 128, 128, 2 * 128, 1)))
        with self.assertRaisesRegex(flashtune.UnsupportedError, "page_size 16 is not one decode_splitkv reads"):
            call(lambda a: _lib.paged_forward(a, 0), sizes=dict(sizes, page_size=16),
                 k_pages=(0x5000, (2 * 16 * 128, 16 * 128, 128, 1)), v_pages=(0x5000, (2 * 16 * 128, 16 * 128, 128, 1)))
        with self.assertRaisesRegex(flashtune.UnsupportedError, "seq_q 17: paged K/V caches are read for Sq <= 16"):
            call(_lib.explain_paged_forward, sizes=dict(sizes, seq_q=17), q=(0x1000, (8 * 17 * 128, 17 * 128, 128, 1)),
                 o=(0x1000, (8 * 17 * 128, 17 * 128, 128, 1)))
        with self.assertRaisesRegex(flashtune.UnsupportedError, "no family runs fp32 paged K/V cache forward"):
            call(lambda a: _lib.paged_forward(a, 0), dtype="fp32")
        with self.assertRaisesRegex(flashtune.UnsupportedError, "head_dim 96 is not supported for bf16 paged"):
            call(_lib.explain_paged_forward_text, sizes=dict(sizes, head_dim=96), q=(0x1000, (8 * 96, 96, 96, 1)),
                 o=(0x1000, (8 * 96, 96, 96, 1)), k_pages=(0x5000, (2 * 64 * 96, 64 * 96, 96, 1)),
                 v_pages=(0x5000, (2 * 64 * 96, 64 * 96, 96, 1)))
        # The pools' layout (ABI 0.7): the head-major message names FT_PAGES_NHD for FlashAttention's layout; a
        # token-major call checks its own view [num_pages, page_size, heads_k, d]; another value is refused.
        with self.assertRaisesRegex(flashtune.InvalidArgumentError, "is layout FT_PAGES_NHD"):
            call(lambda a: _lib.paged_forward(a, 0), k_pages=(0x5000, (2 * 64 * 128, 128, 2 * 128, 1)))
        nhd = (0x5000, (64 * 2 * 128, 2 * 128, 128, 1))
        with self.assertRaisesRegex(flashtune.InvalidArgumentError, "k_pages is not a contiguous \\[num_pages, "
                                                                    "page_size, heads_k, head_dim\\] pool"):
            call(lambda a: _lib.paged_forward(a, 0), layout="nhd", v_pages=nhd)  # k_pages head-major
        with self.assertRaisesRegex(flashtune.UnsupportedError, "page_size 16 is not one decode_splitkv reads"):
            call(lambda a: _lib.paged_forward(a, 0), layout="nhd", sizes=dict(sizes, page_size=16),
                 k_pages=(0x5000, (16 * 2 * 128, 2 * 128, 128, 1)), v_pages=(0x5000, (16 * 2 * 128, 2 * 128, 128, 1)))

        def raw(layout):
            a = _lib.paged_forward_args(sizes=dict(sizes), block_table=0x7000, cache_seqlens=0x7100, dtype="bf16",
                                        causal=False, scale=None, q=q, k_pages=pool, v_pages=pool, o=q, lse=0, heads_k=2)
            a.layout = layout
            _lib.paged_forward(a, 0)

        for bad in (2, -1):
            with self.assertRaisesRegex(flashtune.InvalidArgumentError, "layout must be FT_PAGES_HND .* got " + str(bad)):
                raw(bad)


class TorchKeywordFlags(unittest.TestCase):
    """flashtune.torch's return_lse (and any later bool keyword) goes through _lib.flag: True or False pass, anything
    else is a one-line TypeError naming the function and the keyword."""

    def test_bools_pass(self):
        self.assertIs(_lib.flag("f", "return_lse", True), True)
        self.assertIs(_lib.flag("f", "return_lse", False), False)

    def test_hostile_values(self):
        class Truthy:
            def __bool__(self):
                raise AssertionError("a flag's truth must not be asked")

        for bad in ("yes", "", 1, 0, 1.0, None, [True], Truthy(), b"\n\n", "line\nbreak" * 100):
            with self.assertRaises(TypeError) as cm:
                _lib.flag("flashtune.torch.attention", "return_lse", bad)
            msg = str(cm.exception)
            self.assertNotIn("\n", msg)
            self.assertRegex(msg, r"^flashtune\.torch\.attention: return_lse must be True or False, got \w+$")


class TorchOpSchemas(unittest.TestCase):
    """The extension (python/csrc/flashtune_torch.cpp, TORCH_LIBRARY's m.def) and the ctypes fallback
    (@torch.library.custom_op("flashtune_ctypes::...") in flashtune/torch.py) declare the same ops: names, argument
    names, types and defaults, in order. Both are read as text, so this runs without torch."""
    ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    TYPES = {"torch.Tensor": "Tensor", "Optional[torch.Tensor]": "Tensor?", "bool": "bool", "float": "float",
             "int": "int", "str": "str", "list[torch.Tensor]": "Tensor[]"}
    # The masked ops (mask_mod) are the fallback's alone: a mask_mod call runs through ctypes in either backend.
    CTYPES_ONLY = {"attention_mask_fwd", "attention_mask_bwd"}
    MASK_ARGS = [("str", "mask_mod"), ("str", "mask_names"), ("Tensor[]", "mask_tensors")]

    def cpp_ops(self):
        src = open(os.path.join(self.ROOT, "python", "csrc", "flashtune_torch.cpp")).read()
        ops = {}
        for call in re.findall(r'm\.def\(((?:\s*"[^"]*")+)\s*\)', src):
            schema = "".join(re.findall(r'"([^"]*)"', call))
            name, args = re.match(r"(\w+)\((.*)\)\s*->", schema).groups()
            ops[name] = [tuple(a.split()) for a in args.split(",")]
        return ops

    def python_ops(self):
        tree = ast.parse(open(os.path.join(self.ROOT, "python", "flashtune", "torch.py")).read())
        ops = {}
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            for dec in fn.decorator_list:
                if isinstance(dec, ast.Call) and ast.unparse(dec.func) == "torch.library.custom_op":
                    ns, name = dec.args[0].value.split("::")
                    self.assertEqual(ns, "flashtune_ctypes")
                    args, defaults = fn.args.args, fn.args.defaults  # defaults: of the last arguments
                    first_default = len(args) - len(defaults)
                    ops[name] = [(self.TYPES[ast.unparse(a.annotation)],
                                  a.arg if i < first_default else f"{a.arg}={ast.unparse(defaults[i - first_default])}")
                                 for i, a in enumerate(args)]
        return ops

    def test_same_ops(self):
        cpp, py = self.cpp_ops(), self.python_ops()
        self.assertEqual(sorted(cpp), sorted(set(py) - self.CTYPES_ONLY))
        self.assertGreaterEqual(len(cpp), 5)
        for name in cpp:
            self.assertEqual(cpp[name], py[name], name)

    def test_mask_ops(self):
        # attention_mask_fwd/bwd: attention_fwd's and attention_bwd's arguments with the predicate, the tensors' names
        # and the tensors after scale, everything else (names, types, defaults, order) the same.
        py = self.python_ops()
        self.assertLessEqual(self.CTYPES_ONLY, set(py))
        for masked, plain in (("attention_mask_fwd", "attention_fwd"), ("attention_mask_bwd", "attention_bwd")):
            args = list(py[plain])
            at = [a[1] for a in args].index("scale") + 1
            self.assertEqual(py[masked], args[:at] + self.MASK_ARGS + args[at:], masked)


class TorchMaskOps(unittest.TestCase):
    """The masked ops (flashtune_ctypes::attention_mask_fwd/bwd) where torch imports, on the CPU: their fakes on meta
    tensors, autograd through them (the forward's registered backward runs the backward op), torch.compile of a
    training step with them (fullgraph, AOT autograd: the forward op in the forward graph, the backward op in the
    backward graph), attention(mask_mod=...) traced without a graph break on fake CUDA tensors, and the argument
    checks that need no GPU. Skipped without torch (the unit suite's machines have none)."""

    DOC = "doc[q_idx] == doc[kv_idx]"

    @classmethod
    def setUpClass(cls):
        try:
            import torch
        except ImportError:
            raise unittest.SkipTest("torch is not installed")
        import flashtune.torch as ft
        cls.torch, cls.ft = torch, ft
        cls.ops = torch.ops.flashtune_ctypes

    def qkv(self, device="meta", B=2, H=4, Hk=2, S=128, d=64, grad=True):
        t = self.torch
        q = t.empty(B, H, S, d, device=device, dtype=t.bfloat16, requires_grad=grad)
        k, v = (t.empty(B, Hk, S, d, device=device, dtype=t.bfloat16, requires_grad=grad) for _ in range(2))
        return q, k, v

    def test_fakes_and_autograd(self):
        t = self.torch
        q, k, v = self.qkv()
        doc = t.empty(128, device="meta", dtype=t.int32)
        o, lse = self.ops.attention_mask_fwd(q, k, v, True, 0.0, self.DOC, "doc", [doc])
        self.assertEqual((o.shape, o.dtype, lse.shape, lse.dtype),
                         ((2, 4, 128, 64), t.bfloat16, (2, 4, 128), t.float32))
        self.assertFalse(lse.requires_grad)
        o.float().sum().backward()
        self.assertEqual([x.grad.shape for x in (q, k, v)], [q.shape, k.shape, v.shape])
        # no tensor (a predicate of positions alone), and the backward op called alone
        q, k, v = self.qkv(grad=False)
        dq, dk, dv = self.ops.attention_mask_bwd(q, q, k, v, q, q.new_empty((2, 4, 128), dtype=t.float32), False,
                                                 0.0, "kv_idx <= q_idx", "", [])
        self.assertEqual([x.shape for x in (dq, dk, dv)], [q.shape, k.shape, v.shape])

    def test_compiled_training_step(self):
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func
        t = self.torch
        graphs = []

        def keep(gm, example_inputs):
            graphs.append(gm.code)
            return make_boxed_func(gm.forward)

        def step(q, k, v, doc, seg):
            o, _ = self.ops.attention_mask_fwd(q, k, v, True, 0.0, self.DOC + " && seg[kv_idx] > 0", "doc,seg",
                                               [doc, seg], False, -1, -1, 0.0, None)
            return o.float().sum()

        q, k, v = self.qkv()
        doc = t.empty(128, device="meta", dtype=t.int32)
        t._dynamo.reset()
        loss = t.compile(step, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))(
            q, k, v, doc, doc)
        loss.backward()
        self.assertEqual([x.grad.shape for x in (q, k, v)], [q.shape, k.shape, v.shape])
        self.assertEqual(len(graphs), 2)
        self.assertIn("flashtune_ctypes.attention_mask_fwd.default", graphs[0])
        self.assertNotIn("attention_mask_bwd", graphs[0])
        self.assertIn("flashtune_ctypes.attention_mask_bwd.default", graphs[1])
        self.assertIn("'doc,seg'", graphs[1])

    def test_attention_traced_without_graph_break(self):
        # attention(mask_mod=...) under torch.compile(fullgraph=True) calls the masked op: one graph holding it. Fake
        # CUDA tensors (no GPU here); the graph runs on them too (the op's fake).
        from torch._subclasses.fake_tensor import FakeTensorMode
        t, ft = self.torch, self.ft
        graphs = []

        def keep(gm, example_inputs):
            graphs.append(gm.code)
            return gm.forward

        def f(q, k, v, doc):
            o, lse = ft.attention(q, k, v, causal=True, mask_mod=self.DOC, mask_tensors={"doc": doc}, return_lse=True,
                                  softcap=30.0)
            return o.float().sum() + lse.sum()

        t._dynamo.reset()
        with FakeTensorMode(allow_non_fake_inputs=True):
            q, k, v = self.qkv(device="cuda", grad=False)
            doc = t.empty(128, device="cuda", dtype=t.int32)
            out = t.compile(f, fullgraph=True, backend=keep)(q, k, v, doc)
            self.assertEqual(out.shape, ())
        self.assertEqual(len(graphs), 1)
        self.assertIn("flashtune_ctypes.attention_mask_fwd.default", graphs[0])
        self.assertIn(repr(self.DOC), graphs[0])
        self.assertIn("30.0", graphs[0])  # the softcap, among the ops' mods

    def test_op_argument_checks(self):
        # Checked in Python before any GPU work: one line each.
        t, ft = self.torch, self.ft
        doc = t.zeros(8, dtype=t.int32)
        fn = "flashtune_ctypes::attention_mask_fwd"
        with self.assertRaisesRegex(ValueError, r"mask_names names 2 tensors \('doc,seg'\), mask_tensors holds 1$"):
            ft._op_mask(fn, self.DOC, "doc,seg", [doc], None, (-1, -1))
        with self.assertRaisesRegex(ValueError, r"mask_names names a tensor twice \('doc,doc'\)$"):
            ft._op_mask(fn, self.DOC, "doc,doc", [doc, doc], None, (-1, -1))
        with self.assertRaisesRegex(ValueError, r"mask_mod and window_size do not combine"):
            ft._op_mask(fn, self.DOC, "doc", [doc], None, (16, 0))
        with self.assertRaisesRegex(TypeError, r"mask_tensors\['doc'\] must be torch.int32, got torch.int64$"):
            ft._op_mask(fn, self.DOC, "doc", [doc.long()], None, (-1, -1))
        with self.assertRaisesRegex(ValueError, r"mask_tensors' names are C\+\+ identifiers, got 'a,b'$"):
            ft._mask_tensors("flashtune.torch.attention", self.DOC, {"a,b": doc}, None, (-1, -1))
        m = ft._op_mask(fn, self.DOC, "doc", [doc[::2]], None, (-1, -1))  # strided: a contiguous copy
        self.assertTrue(m.tensors["doc"].is_contiguous())
        self.assertEqual((m.struct.num_tensors, m.struct.lengths[0]), (1, 4))
        q, k, v = self.qkv(device="cpu", grad=False)
        with self.assertRaisesRegex(ValueError, r"^flashtune_ctypes::attention_mask_fwd: q is on cpu"):
            self.ops.attention_mask_fwd(q, k, v, True, 0.0, self.DOC, "doc", [doc])
        # explain() takes attention()'s mask arguments, checked the same way before anything reaches the runtime
        with self.assertRaisesRegex(ValueError, r"^flashtune.torch.explain: mask_tensors goes with mask_mod$"):
            ft.explain(q, k, v, mask_tensors={"doc": doc})
        with self.assertRaisesRegex(TypeError, r"^flashtune.torch.explain: mask_mod must be a str"):
            ft.explain(q, k, v, mask_mod=3)
        with self.assertRaisesRegex(ValueError, r"^flashtune.torch.explain: mask_mod and window_size do not combine"):
            ft.explain(q, k, v, window_size=(16, 0), mask_mod=self.DOC, mask_tensors={"doc": doc})


class TuneArguments(unittest.TestCase):
    """flashtune.tune checks every argument before anything runs: a ValueError of one line naming it (the CLI is
    never looked for: $FLASHTUNE_CLI points nowhere here, which would be a CliNotFoundError, an OSError)."""

    GOOD = dict(shapes=[(4, 16, 4096, 128)], dtype="bf16", causal=True, budget="5m", strategy="halving")
    BAD = [
        (dict(shapes="4,16,4096,128"), "shapes must be a list"),
        (dict(shapes=None), "shapes must be a list"),
        (dict(shapes=[]), "shapes is empty"),
        (dict(shapes=5), "shapes must be a list"),
        (dict(shapes=[(4, 16, 4096)]), r"shapes\[0\]: a shape is"),
        (dict(shapes=[(4, 16, 4096, 128), "x"]), r"shapes\[1\]: a shape is a tuple"),
        (dict(shapes=[(4, 16, 4096, 128.0)]), "head_dim must be an integer"),
        (dict(shapes=[(True, 16, 4096, 128)]), "batch must be an integer"),
        (dict(shapes=[(0, 16, 4096, 128)]), r"batch must be in 1\.\.1048576, got 0"),
        (dict(shapes=[(4, 16, 2**21, 128)]), "seq_q must be in"),
        (dict(shapes=[(4, 16, 4096, 4096, 2048)]), "head_dim must be in"),
        (dict(shapes=[(4, -16, 4096, 128)]), "heads must be in"),
        (dict(shapes=[{"batch": 1, "heads": 8, "seq": 64, "head_dim": 64, "heads_k": 3}]), r"heads_k \(3\) must divide"),
        (dict(shapes=[{"batch": 1, "heads": 8, "seq": 64, "head_dim": 64, "path": "../x"}]), "unknown key 'path'"),
        (dict(shapes=[{"batch": 1, "heads": 8, "seq": 64, "seq_q": 1, "head_dim": 64}]), "not both"),
        (dict(shapes=[{"batch": 1, "heads": 8, "head_dim": 64}]), "missing seq"),
        (dict(shapes=[(1, 1, 1, 64)] * 257), "at most 256 shapes"),
        (dict(dtype="int8"), "dtype must be one of"),
        (dict(dtype=None), "dtype must be one of"),
        (dict(causal=1), "causal must be True, False"),
        (dict(causal="yes"), "causal must be True, False"),
        (dict(causal=[]), "causal must be True, False"),
        (dict(direction="sideways"), "direction must be"),
        (dict(direction=["fwd", "--db=/tmp/x"]), "direction must be"),
        (dict(budget="5 minutes"), "budget must be a duration"),
        (dict(budget="1h30"), "budget must be a duration"),
        (dict(budget="-5m"), "budget must be a duration"),
        (dict(budget="--time-budget=1s"), "budget must be a duration"),
        (dict(budget="9" * 40), "budget must be a duration"),
        (dict(budget=0), "budget must be between"),
        (dict(budget=float("inf")), "budget must be between"),
        (dict(budget=float("nan")), "budget must be between"),
        (dict(budget="31d"), "budget must be a duration"),
        (dict(budget=True), "budget must be a duration"),
        (dict(budget=40 * 86400), "budget must be between"),
        (dict(strategy="greedy"), "strategy must be one of"),
        (dict(strategy="--db=/etc/x"), "strategy must be one of"),
        (dict(strategy=None), "strategy must be one of"),
        (dict(device=-1), "device must be"),
        (dict(device="0"), "device must be"),
        (dict(device=1.0), "device must be"),
        (dict(device=65), "device must be"),
        (dict(progress="no"), "progress must be True or False"),
    ]

    def setUp(self):
        self.saved = os.environ.get("FLASHTUNE_CLI")
        os.environ["FLASHTUNE_CLI"] = "/nonexistent/flashtune"

    def tearDown(self):
        if self.saved is None:
            os.environ.pop("FLASHTUNE_CLI", None)
        else:
            os.environ["FLASHTUNE_CLI"] = self.saved

    def test_bad_arguments_are_one_line_value_errors(self):
        for edit, says in self.BAD:
            with self.subTest(edit=str(edit)[:80]):
                with self.assertRaisesRegex(ValueError, says) as cm:
                    flashtune.tune(**dict(self.GOOD, **edit))
                msg = str(cm.exception)
                self.assertTrue(msg.startswith("flashtune.tune: "), msg)
                self.assertNotIn("\n", msg)
                self.assertLess(len(msg), 400)

    def test_good_arguments_reach_the_cli(self):
        from flashtune import _cli
        for edit in ({}, dict(shapes=(1, 8, 1, 4096, 128)), dict(dtype="torch.float16", direction="both"),
                     dict(causal=(False, True), budget=90), dict(budget="1h30m", strategy="guided", device=3),
                     dict(shapes=[{"batch": 2, "heads": 32, "heads_k": 8, "seq_q": 1, "seq_k": 8192, "head_dim": 128}])):
            with self.subTest(edit=edit):
                with self.assertRaises(_cli.CliNotFoundError):  # checked, then the CLI is looked for
                    flashtune.tune(**dict(self.GOOD, **edit))

    def test_problems(self):
        from flashtune import _tune
        ps = _tune.problems([(4, 16, 4096, 128), (4, 16, 4096, 4096, 128), [2, 8, 1, 512, 64]], "bfloat16",
                            (True, False), "both")
        self.assertEqual(len(ps), 2 * 2 * 2)  # the first two are one shape
        self.assertEqual(ps[0], {"batch": 4, "heads": 16, "seq_q": 4096, "seq_k": 4096, "head_dim": 128,
                                 "dtype": "bf16", "causal": False, "direction": "fwd"})
        self.assertEqual({p["direction"] for p in ps}, {"fwd", "bwd"})
        gqa = _tune.problems({"batch": 1, "heads": 32, "heads_k": 8, "seq_q": 1, "seq_k": 4096, "head_dim": 128})
        self.assertEqual(gqa[0]["heads_k"], 8)
        mha = _tune.problems({"batch": 1, "heads": 32, "heads_k": 32, "seq": 64, "head_dim": 128})
        self.assertNotIn("heads_k", mha[0])  # heads_k == heads: multi-head, one spelling
        self.assertEqual([_tune.parse_budget(b) for b in ("5m", "90s", "1h30m", "2.5m", "1h", 42, "300")],
                         [300, 90, 5400, 150, 3600, 42, 300])

    def test_progress_line(self):
        from flashtune import _tune
        p = _tune._Progress(False, 600)
        p.begin("[1/2] fa2_mma fwd", 300, 300)
        self.assertTrue(p.cli_line("tune fa2_mma sm_90 [12/36]  33%  elapsed 40s  eta 1m20s  B=4 H=16"))
        self.assertFalse(p.cli_line("fa2_mma: candidates 36 ok"))
        text = p.text()
        self.assertIn("[1/2] fa2_mma fwd [12/36]", text)
        eta = _tune._seconds(text.split("eta ")[1])
        self.assertTrue(370 <= eta <= 380, text)  # this step's 1m20s, then the later step's 5m


class WithCli(unittest.TestCase):
    """`python -m flashtune` and flashtune.tune's CLI side through the built CLI ($FLASHTUNE_CLI) without a GPU:
    the verbs' help, the plan of families and spaces for a GPU's arch, the picks read back from a store, the
    user's store's checks, and no GPU as one NoGpuError line."""

    @classmethod
    def setUpClass(cls):
        cls.cli = os.environ.get("FLASHTUNE_CLI")
        if not cls.cli:
            raise unittest.SkipTest("FLASHTUNE_CLI not set (the CLI is not built)")
        cls.env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))

    def module(self, *args, env=None):
        return subprocess.run([sys.executable, "-m", "flashtune", *args], capture_output=True, text=True,
                              env=env or self.env, cwd="/")

    def test_help(self):
        r = self.module("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("usage: flashtune <command>", r.stdout)
        for verb in ("tune", "best", "emit", "report", "devices", "merge"):
            with self.subTest(verb=verb):
                r = self.module(verb, "--help")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(f"usage: flashtune {verb}", r.stdout)
        r = self.module("no-such-verb")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip().count("\n"), 0, r.stderr)

    def test_missing_cli_is_one_line(self):
        for value in ("relative/flashtune", "/nonexistent/flashtune"):
            r = self.module("--help", env=dict(self.env, FLASHTUNE_CLI=value))
            self.assertEqual(r.returncode, 2)
            self.assertIn("FLASHTUNE_CLI", r.stderr)
            self.assertEqual(r.stderr.strip().count("\n"), 0, r.stderr)

    def test_autotune_decode_families_match_the_registry(self):
        # flashtune._autotune's copy of what the decoding families serve against the CLI's registry.
        from flashtune import _autotune
        families = json.loads(subprocess.run([self.cli, "families", "--json"], check=True, capture_output=True,
                                             text=True).stdout)
        ranged = sorted((f["name"], f["max_seq_q"], tuple(f["dtypes"]), tuple(f["head_dims"]))
                        for f in families if f.get("max_seq_q") and not f.get("test_only"))
        self.assertEqual(ranged, sorted((f["name"], f["max_seq_q"], f["dtypes"], f["head_dims"])
                                        for f in _autotune.DECODE_FAMILIES))

    def test_plan(self):
        from flashtune import _cli, _tune
        families = json.loads(subprocess.run([self.cli, "families", "--json"], check=True, capture_output=True,
                                             text=True).stdout)
        spaces = os.path.join(_cli.data_dir(), "configs", "spaces")

        def names(ps, arch):
            return sorted((name, dr) for name, dr, _, _ in _tune.plan(ps, families, arch, spaces))

        bf16 = _tune.problems([(4, 16, 4096, 128)], "bf16", True, "both")
        hopper = names(bf16, "sm_90")
        self.assertIn(("fa3_wgmma", "fwd"), hopper)
        self.assertIn(("fa2_mma", "fwd"), hopper)
        self.assertTrue({dr for _, dr in hopper} == {"fwd", "bwd"})
        ampere = names(bf16, "sm_80")
        self.assertNotIn(("fa3_wgmma", "fwd"), ampere)  # Hopper-only families only on sm_90
        self.assertIn(("fa2_mma", "fwd"), ampere)
        decode = _tune.problems({"batch": 8, "heads": 32, "heads_k": 8, "seq_q": 1, "seq_k": 8192, "head_dim": 128})
        self.assertIn(("decode_splitkv", "fwd"), names(decode, "sm_80"))
        self.assertNotIn(("decode_splitkv", "fwd"), names(_tune.problems((8, 32, 4096, 128)), "sm_80"))
        for _, _, space, ps in _tune.plan(bf16, families, "sm_90", spaces):
            self.assertTrue(os.path.isfile(space), space)
            self.assertTrue(all(p in bf16 for p in ps))
        with self.assertRaisesRegex(ValueError, "no kernel family runs fp32 forward d=256 on sm_80"):
            _tune.plan(_tune.problems((1, 1, 128, 256), "fp32"), families, "sm_80", spaces)

    def test_picks_from_a_store(self):
        from flashtune import _tune
        tool = os.environ.get("FIXTURE_TOOL")
        if not tool:
            self.skipTest("FIXTURE_TOOL not set")
        with tempfile.TemporaryDirectory() as tmp:
            db = os.path.join(tmp, "s.db")
            subprocess.run([tool, db], check=True)
            ps = _tune.problems([(4, 16, 4096, 64), (1, 1, 128, 64)], "fp32")
            picks = _tune._picks(self.cli, db, "NVIDIA H100 80GB HBM3", ps)
            self.assertEqual(picks[0]["family"], "fa2_simt")
            self.assertGreater(picks[0]["tflops"], 0)
            self.assertEqual(picks[0]["seq_q"], 4096)
            self.assertIsNone(picks[1]["family"])  # nothing measured for it
            self.assertIsNone(_tune._picks(self.cli, db, "Another GPU", ps)[0]["family"])

    def test_store_checks(self):
        from flashtune import _tune
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "cache", "flashtune", "gpu.db")
            _tune._check_store(store)  # creates the folder, mode 0700
            self.assertEqual(os.stat(os.path.dirname(store)).st_mode & 0o777, 0o700)
            with open(store, "w"):
                pass
            os.chmod(store, 0o664)
            with self.assertRaisesRegex(flashtune.FlashtuneError, "only you can write"):
                _tune._check_store(store)
            _tune._private(store)  # what tune does to what SQLite made under the umask
            self.assertEqual(os.stat(store).st_mode & 0o777, 0o600)
            _tune._check_store(store)
            os.remove(store)
            os.symlink("/etc/passwd", store)
            with self.assertRaisesRegex(flashtune.FlashtuneError, "not a regular file"):
                _tune._check_store(store)
            os.remove(store)
            os.chmod(os.path.dirname(store), 0o777)
            with self.assertRaisesRegex(flashtune.FlashtuneError, "writable by others"):
                _tune._check_store(store)
            with self.assertRaisesRegex(flashtune.FlashtuneError, "no user's store"):
                _tune._check_store("relative.db")

    def test_no_gpu_is_one_line(self):
        r = subprocess.run([self.cli, "devices", "--json"], capture_output=True, text=True)
        if r.returncode == 0:
            self.skipTest("a GPU is present: flashtune.tune would tune")
        with self.assertRaises(flashtune.NoGpuError) as cm:
            flashtune.tune([(1, 2, 128, 64)], dtype="fp16", budget="10s", progress=False)
        self.assertNotIn("\n", str(cm.exception))
        self.assertTrue(str(cm.exception).startswith("flashtune.tune: no GPU"), str(cm.exception))


class AutotuneFirstUse(unittest.TestCase):
    """flashtune._autotune's protocol with its pieces stubbed (no GPU, no torch): settings from the environment,
    buckets, once per process, the already-tuned case, failures as one line, and two processes that contend
    for one bucket tuning it once."""

    def setUp(self):
        from flashtune import _autotune
        self.a = _autotune
        self.a.reset()
        self.env = {k: os.environ.pop(k) for k in ("FLASHTUNE_AUTOTUNE", "FLASHTUNE_AUTOTUNE_BUDGET") if k in os.environ}
        self.tmp = tempfile.TemporaryDirectory()
        self.store = os.path.join(self.tmp.name, "cache", "gpu.db")

    def tearDown(self):
        self.a.reset()
        for k in ("FLASHTUNE_AUTOTUNE", "FLASHTUNE_AUTOTUNE_BUDGET"):
            os.environ.pop(k, None)
        os.environ.update(self.env)
        self.tmp.cleanup()

    def test_settings_from_the_environment(self):
        self.assertFalse(self.a.requested())
        self.assertEqual(self.a.settings(), (False, 60.0))
        os.environ["FLASHTUNE_AUTOTUNE"] = "1"
        os.environ["FLASHTUNE_AUTOTUNE_BUDGET"] = "2m"
        self.assertTrue(self.a.requested())
        self.assertEqual(self.a.settings(), (True, 120.0))
        for bad, var in (("yes", "FLASHTUNE_AUTOTUNE"), ("2 minutes", "FLASHTUNE_AUTOTUNE_BUDGET"),
                         ("0s", "FLASHTUNE_AUTOTUNE_BUDGET")):
            os.environ["FLASHTUNE_AUTOTUNE"], os.environ["FLASHTUNE_AUTOTUNE_BUDGET"] = "1", "60s"
            os.environ[var] = bad
            self.assertTrue(self.a.requested())
            with self.assertRaises(ValueError) as e:
                self.a.settings()
            self.assertIn(var, str(e.exception))
            self.assertNotIn("\n", str(e.exception))
        self.a.configure(False, "10s")  # autotune() overrides the environment
        self.assertFalse(self.a.requested())
        self.assertEqual(self.a.settings(), (False, 10.0))
        with self.assertRaises(TypeError):
            self.a.configure("yes")

    def test_buckets(self):
        self.assertEqual(self.a.seq_bucket(1000, 1), 1024)
        self.assertEqual(self.a.seq_bucket(1024, 1024), 1024)
        self.assertEqual(self.a.seq_bucket(1, 1025), 2048)
        self.assertEqual(self.a.bucket("bf16", 64, True, False, 900, 1000), self.a.bucket("bf16", 64, True, False, 1024, 513))
        self.assertNotEqual(self.a.bucket("bf16", 64, True, False, 1024, 1024), self.a.bucket("bf16", 64, True, True, 1024, 1024))
        self.assertNotEqual(self.a.lock_path(self.store, ("a",)), self.a.lock_path(self.store, ("b",)))

    def test_decode_buckets_by_batch_kv_heads(self):
        # A call decode_splitkv serves (Sq <= 16, fp16/bf16, d 64/128/256): its batch x kv heads class joins the
        # key, as the runtime's decode buckets key on it (Llama-3's 32/8 heads at Sk 4096).
        a = self.a
        def key(b, dtype="bf16", sq=1, sk=4096, d=128, h=32, hk=8):
            return a.call_bucket(dtype, b, h, hk, sq, sk, d, False)[0]
        self.assertNotEqual(key(1), key(64))                 # 8 against 512: B 64 tunes its own class
        self.assertNotEqual(key(1, sq=16), key(64, sq=16))   # speculative decoding: still decode_splitkv's
        self.assertEqual(key(1)[:6], key(64)[:6])             # the same bucket otherwise
        self.assertEqual(key(1)[6], 8)
        self.assertEqual(key(64)[6], 512)
        self.assertEqual(key(7), key(8))                     # 56 and 64: one class (64)
        self.assertEqual(key(6), key(9))                     # 48 and 72: nearest 64 by ratio
        self.assertNotEqual(key(5), key(6))                  # 40: nearer 32 than 64
        self.assertEqual(key(3), key(4))                     # 24 and 32: class 32
        self.assertEqual(key(4, h=64, hk=16), key(8))        # 64 either way: batch x kv heads, not batch
        self.assertEqual((key(1, h=8, hk=8)[6], key(8, h=8, hk=8)[6]), (8, 64))  # multi-head: heads are the kv heads
        self.assertNotEqual(key(1, dtype="torch.float16", d=64), key(64, dtype="torch.float16", d=64))  # torch's names
        self.assertEqual([a.batch_heads_class(x) for x in (0, 1, 2, 3, 5, 6, 11, 12, 2**40)],
                         [1, 1, 2, 4, 4, 8, 8, 16, 2**31])
        # The tune runs at the call's own shape: the stored row's batch x kv heads is the call's, in the key's class.
        for b, hk in ((1, 8), (5, 8), (64, 8), (3, 32), (2, 4)):
            k, shape = a.call_bucket("bf16", b, 32, hk, 1, 4096, 128, False)
            want = {"batch": b, "heads": 32, "seq_q": 1, "seq_k": 4096, "head_dim": 128}
            self.assertEqual(shape, dict(want, heads_k=hk) if hk != 32 else want)  # 32: multi-head, no heads_k
            self.assertEqual(a.batch_heads_class(shape["batch"] * shape.get("heads_k", shape["heads"])), k[6])
        # The lock file: one per class, a single safe path component beside the store.
        locks = {a.lock_path(self.store, key(b)) for b in (1, 8, 64)}
        self.assertEqual(len(locks), 3)
        for lock in locks:
            self.assertEqual(os.path.dirname(lock), os.path.dirname(self.store))
            self.assertRegex(os.path.basename(lock), r"^gpu\.db\.autotune-[0-9a-f]{16}\.lock$")

    def test_non_decode_buckets_unchanged(self):
        # Prefill, an Sq past decode_splitkv's 16, fp32 and a head dim it has no kernel for: the bucket over every
        # batch, as before (the 6 fields; B 1 and B 64 one bucket).
        a = self.a
        for dtype, sq, sk, d in (("bf16", 4096, 4096, 128), ("bf16", 17, 4096, 128), ("fp32", 1, 4096, 128),
                                 ("torch.float32", 1, 4096, 64), ("bf16", 1, 4096, 96), ("fp16", 0, 4096, 64)):
            with self.subTest(dtype=dtype, sq=sq, d=d):
                k1, shape = a.call_bucket(dtype, 1, 32, 8, sq, sk, d, True, True)
                k64, _ = a.call_bucket(dtype, 64, 32, 8, sq, sk, d, True, True)
                self.assertEqual(k1, k64)
                self.assertEqual(k1, (dtype, d, True, True, a.seq_bucket(sq, sk), True))
                self.assertEqual(k1, a.bucket(dtype, d, True, True, sq, sk, True))
                self.assertEqual(shape["batch"], 1)
        mha, shape = a.call_bucket("bf16", 2, 16, 16, 1024, 1024, 64, False)
        self.assertEqual(mha, ("bf16", 64, False, False, 1024, False))
        self.assertNotIn("heads_k", shape)
        # Without batch x kv heads (flashtune.tune_model's grouping): the bucket over every batch, decoding too.
        self.assertEqual(a.bucket("bf16", 128, False, True, 1, 4096), ("bf16", 128, False, True, 4096, False))

    def test_is_tuned_checks_the_decode_class(self):
        a = self.a
        b1 = a.call_bucket("bf16", 1, 32, 8, 1, 4096, 128, False)[0]
        b64 = a.call_bucket("bf16", 64, 32, 8, 1, 4096, 128, False)[0]
        b7 = a.call_bucket("bf16", 7, 32, 8, 1, 4096, 128, False)[0]
        prefill = a.call_bucket("bf16", 1, 32, 8, 4096, 4096, 128, False)[0]

        def explained(bh, source="user", bwd="device"):
            bucket = f"batch x kv heads {bh} (of 8, 64, 512), Sk <= 4096" if bh else ""
            return {"source": source, "bucket": bucket, "backward": {"source": bwd}}

        self.assertEqual(a.explained_batch_heads(explained(512)["bucket"]), 512)
        self.assertIsNone(a.explained_batch_heads(""))
        self.assertTrue(a.is_tuned(b1, explained(8)))
        self.assertFalse(a.is_tuned(b64, explained(8)))   # B 1's pick: not B 64's bucket
        self.assertTrue(a.is_tuned(b64, explained(512)))
        self.assertTrue(a.is_tuned(b7, explained(64)))
        self.assertTrue(a.is_tuned(b7, explained(56)))    # a row tuned at B 7 itself
        self.assertFalse(a.is_tuned(b7, explained(32)))
        self.assertFalse(a.is_tuned(b1, explained(0)))    # a pick not keyed by batch x kv heads
        self.assertFalse(a.is_tuned(b1, explained(8, source="arch")))
        self.assertFalse(a.is_tuned(b1, explained(8, bwd="default")))
        self.assertTrue(a.is_tuned(prefill, explained(0)))
        self.assertTrue(a.is_tuned(prefill, explained(8)))
        self.assertFalse(a.is_tuned(prefill, explained(0, source="default")))
        self.assertFalse(a.is_tuned(prefill, {"source": "user", "backward": {"error": "no kernel"}}))

    def test_a_decode_call_of_another_class_tunes_its_own(self):
        # B 1 then B 64 at one Sk: the second is not "seen" in B 1's bucket; it tunes at B 64's shape, and the
        # store's B 1 row (explain() names class 8) does not count as B 64's.
        tuned, shapes = set(), []

        def tune(shape, **kw):
            shapes.append(shape)
            tuned.add(shape["batch"] * shape["heads_k"])

        def run(b):
            key, shape = self.a.call_bucket("bf16", b, 32, 8, 1, 4096, 128, False)

            def is_tuned():
                bh = min(tuned, key=lambda x: abs(math.log2(x / (b * 8))), default=0)  # the runtime's nearest
                return self.a.is_tuned(key, {"source": "user" if bh else "default", "backward": {"source": "user"},
                                             "bucket": f"batch x kv heads {bh} (of 8), Sk <= 4096" if bh else ""})
            return self.a.first_use(key, shape, "bf16", False, 0, is_tuned, lambda: self.store, tune, 30.0)

        self.assertEqual(run(1), "autotuned")
        self.assertEqual(run(64), "autotuned")
        self.assertEqual([s["batch"] for s in shapes], [1, 64])
        self.assertEqual(run(2), "autotuned")  # 16: the store's nearest is 8, another class
        self.assertEqual(run(8), "autotuned")
        self.assertEqual(run(7), "seen")       # 56: B 8's class, considered in this process
        self.a.reset()
        self.assertEqual(run(7), "tuned")      # another process: the store's 64 row is its class's
        self.assertEqual(len(shapes), 4)

    def test_once_per_process_and_already_tuned(self):
        calls = []
        tune = lambda *args, **kw: calls.append((args, kw))
        key = self.a.bucket("bf16", 64, False, False, 4096, 4096)
        run = lambda tuned: self.a.first_use(key, {"batch": 1}, "bf16", False, 0, lambda: tuned,
                                             lambda: self.store, tune, 30.0)
        self.assertEqual(run(False), "autotuned")
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0][1]["direction"], "both")
        self.assertEqual(calls[0][1]["budget"], 30.0)
        self.assertEqual(run(False), "seen")  # once per process
        self.assertEqual(len(calls), 1)
        other = self.a.bucket("bf16", 128, False, False, 4096, 4096)
        self.assertEqual(self.a.first_use(other, {}, "bf16", False, 0, lambda: True, lambda: self.store, tune, 30.0),
                         "tuned")
        self.assertEqual(len(calls), 1)
        self.assertEqual(oct(os.stat(os.path.dirname(self.store)).st_mode & 0o777), "0o700")

    def test_a_failed_tune_is_one_line_and_not_retried(self):
        def tune(*args, **kw):
            raise flashtune.FlashtuneError("worker crashed")
        key = self.a.bucket("fp16", 64, True, False, 1024, 1024)
        r = self.a.first_use(key, {}, "fp16", True, 0, lambda: False, lambda: self.store, tune, 5.0)
        self.assertTrue(r.startswith("failed: ") and "worker crashed" in r and "\n" not in r, r)
        self.assertEqual(self.a.first_use(key, {}, "fp16", True, 0, lambda: False, lambda: self.store, tune, 5.0), "seen")

    def test_two_processes_tune_a_bucket_once(self):
        # Each child: tuned means a marker file exists; its tune sleeps, then writes the marker and logs itself.
        child = """
import os, sys, time
from flashtune import _autotune as a
store, marker, log = sys.argv[1:4]
def tune(*args, **kw):
    time.sleep(1.0)
    open(marker, "w").close()
    with open(log, "a") as f: f.write(str(os.getpid()) + chr(10))
print(a.first_use(("bf16", 64, False, False, 4096, False), {}, "bf16", False, 0,
                  lambda: os.path.exists(marker), lambda: store, tune, 10.0))
"""
        marker, log = os.path.join(self.tmp.name, "tuned"), os.path.join(self.tmp.name, "log")
        env = dict(os.environ)
        procs = [subprocess.Popen([sys.executable, "-c", child, self.store, marker, log], stdout=subprocess.PIPE,
                                  text=True, env=env) for _ in range(2)]
        outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
        self.assertEqual(outs, ["autotuned", "tuned"])
        with open(log) as f:
            self.assertEqual(len(f.read().split()), 1)


class TuneModelPlan(unittest.TestCase):
    """flashtune.tune_model's grouping of recorded calls (flashtune._model.plan): by (dtype, mask), one shape per
    runtime bucket (its largest), the backward only where a call needed gradients."""

    def call(self, **kw):
        c = {"batch": 2, "heads": 8, "heads_k": 8, "seq_q": 1024, "seq_k": 1024, "head_dim": 64, "dtype": "bf16",
             "causal": True, "deterministic": False, "grad": True}
        c.update(kw)
        return c

    def test_groups_and_buckets(self):
        from flashtune._model import plan
        calls = [self.call(), self.call(batch=4), self.call(seq_q=700, seq_k=700),  # one bucket: the largest kept
                 self.call(seq_q=2048, seq_k=2048),                                  # another bucket
                 self.call(heads_k=2),                                               # grouped-query: another
                 self.call(causal=False, grad=False),                                # another group, forward only
                 self.call(dtype="fp16", head_dim=128, deterministic=True)]          # another group
        g = plan(calls)
        self.assertEqual([(d, c, dr) for d, c, dr, _ in g], [("bf16", True, "both"), ("bf16", False, "fwd"),
                                                              ("fp16", True, "both")])
        shapes = g[0][3]
        self.assertEqual(len(shapes), 3)
        self.assertEqual(shapes[0], {"batch": 4, "heads": 8, "seq_q": 1024, "seq_k": 1024, "head_dim": 64})
        self.assertEqual(shapes[1]["seq_q"], 2048)
        self.assertEqual(shapes[2]["heads_k"], 2)
        self.assertEqual(plan([]), [])

    def test_decode_calls_by_batch_class(self):
        """Decode calls (Sq 1) of one Sk are tuned per batch x kv heads class, as the runtime keys them: B 1 and
        B 64 are two shapes, B 7 and B 8 (8 kv heads: 56 and 64) one, its larger; prefill is not split."""
        from flashtune._model import plan
        dec = dict(heads=32, heads_k=8, seq_q=1, seq_k=4096, head_dim=128, causal=False, grad=False)
        g = plan([self.call(batch=1, **dec), self.call(batch=64, **dec), self.call(batch=7, **dec),
                  self.call(batch=8, **dec)])
        self.assertEqual(sorted(s["batch"] for s in g[0][3]), [1, 8, 64])
        pre = dict(heads=32, heads_k=8, seq_q=4096, seq_k=4096, head_dim=128, causal=False, grad=False)
        self.assertEqual(len(plan([self.call(batch=1, **pre), self.call(batch=64, **pre)])[0][3]), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
