#!/usr/bin/env python3
"""The Python package without a GPU or torch (label unit): the ctypes structs of flashtune._lib match
runtime/include/flashtune/attention.h (sizes and offsets printed by tests/abi_layout.cpp, compiled
against the header), `import flashtune` works without torch, device_available() answers with one line
(False and the reason on a machine without a GPU), and the argument checks that need no GPU.

Environment (tests/CMakeLists.txt): PYTHONPATH=<repo>/python, FT_ABI_LAYOUT=<abi_layout binary>,
FLASHTUNE_LIBRARY=<the built libflashtune_attention.so> (optional: without it the library tests skip).
"""
import ctypes
import json
import os
import subprocess
import sys
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

    def test_forward_args(self):
        self.check("ft_forward_args", _lib.FtForwardArgs)

    def test_backward_args(self):
        self.check("ft_backward_args", _lib.FtBackwardArgs)

    def test_explanation(self):
        self.check("ft_explanation", _lib.FtExplanation)

    def test_enums(self):
        e = self.c["enums"]
        self.assertEqual(e["sizeof_ft_status"], ctypes.sizeof(ctypes.c_int))
        self.assertEqual(e["sizeof_ft_dtype"], ctypes.sizeof(ctypes.c_int))
        for name, value in _lib.STATUS_NAMES.items():
            self.assertEqual(e[value], name, value)
        self.assertEqual({"fp32": e["FT_FP32"], "fp16": e["FT_FP16"], "bf16": e["FT_BF16"]}, _lib.DTYPES)


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

    def test_error_classes(self):
        self.assertTrue(issubclass(flashtune.UnsupportedError, ValueError))
        self.assertTrue(issubclass(flashtune.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(flashtune.CudaError, RuntimeError))
        self.assertTrue(issubclass(flashtune.UnsupportedError, flashtune.FlashtuneError))


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


if __name__ == "__main__":
    unittest.main(verbosity=2)
