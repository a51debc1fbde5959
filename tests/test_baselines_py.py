#!/usr/bin/env python3
"""No-GPU checks of experiments/baselines.py: FLOP and byte counts against hand-computed values, problem
parsing, the row format, row sampling, quantiles, the pace rule, error classification, and the CLI end to
end on rows that need no torch (CPU size-limit skips; without torch every other row is an error row).

usage: python3 tests/test_baselines_py.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "experiments"))
import baselines as bl  # noqa: E402  (must import without torch)

EXPECTED_KEYS = ["impl", "family", "config", "direction", "dtype", "batch", "heads", "seq_q", "seq_k", "head_dim",
                 "causal", "status", "error", "ms_median", "ms_p20", "ms_p80", "reps", "tflops", "gbps", "max_abs",
                 "mean_abs", "mse", "max_rel", "peak_bytes", "device"]


def prob(**kw):
    p = dict(batch=2, heads=3, seq_q=128, seq_k=256, head_dim=64, dtype="fp16", causal=False, direction="fwd")
    p.update(kw)
    return p


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


class Counts(unittest.TestCase):
    def test_flops(self):
        # 4 * 2 * 3 * 128 * 256 * 64
        self.assertEqual(bl.flops(prob()), 50331648.0)
        self.assertEqual(bl.flops(prob(causal=True)), 25165824.0)
        self.assertEqual(bl.flops(prob(direction="bwd")), 125829120.0)
        self.assertEqual(bl.flops(prob(direction="bwd", causal=True)), 62914560.0)
        self.assertEqual(bl.fwd_flops(prob(direction="bwd", causal=True)), 25165824.0)
        # dtype does not change the count
        self.assertEqual(bl.flops(prob(dtype="fp32")), 50331648.0)

    def test_bytes(self):
        # fwd fp16: B*H * (2 * 64 * (2*128 + 2*256) + 4*128) = 6 * (98304 + 512)
        self.assertEqual(bl.bytes_moved(prob()), 592896.0)
        # fwd fp32: 6 * (4 * 64 * 768 + 512)
        self.assertEqual(bl.bytes_moved(prob(dtype="fp32")), 1182720.0)
        # bwd fp16: 6 * (2 * 64 * (4*128 + 2*256 + 128 + 2*256) + 512) = 6 * (128 * 1664 + 512)
        self.assertEqual(bl.bytes_moved(prob(direction="bwd")), 1281024.0)
        self.assertEqual(bl.bytes_moved(prob(direction="bwd", causal=True)), 1281024.0)  # causal: same traffic
        # bwd bf16, square: 1 * 1 * (2 * 32 * (4*10 + 20 + 10 + 20) + 40)
        self.assertEqual(bl.bytes_moved(prob(batch=1, heads=1, seq_q=10, seq_k=10, head_dim=32, dtype="bf16",
                                             direction="bwd")), 2 * 32 * 90 + 40)

    def test_timing_fields(self):
        row = bl.new_row("triton", prob())
        bl.set_timing(row, prob(), [2.0, 1.0, 3.0, 5.0, 4.0])
        self.assertEqual(row["ms_median"], 3.0)
        self.assertAlmostEqual(row["ms_p20"], 1.8)
        self.assertAlmostEqual(row["ms_p80"], 4.2)
        self.assertEqual(row["reps"], 5)
        self.assertAlmostEqual(row["tflops"], 50331648.0 / 3e-3 / 1e12)
        self.assertAlmostEqual(row["gbps"], 592896.0 / 3e-3 / 1e9)

    def test_percentile(self):
        self.assertEqual(bl.percentile([7.0], 0.2), 7.0)
        self.assertEqual(bl.percentile([], 0.5), 0.0)
        self.assertEqual(bl.percentile([1, 2, 3, 4], 0.5), 2.5)
        self.assertEqual(bl.percentile([4, 1, 3, 2], 0.0), 1)
        self.assertEqual(bl.percentile([4, 1, 3, 2], 1.0), 4)


class Problems(unittest.TestCase):
    def test_list(self):
        ps = bl.load_problems([prob(), dict(batch=1, heads=2, seq=64, head_dim=128)])
        self.assertEqual(ps[0], prob())
        self.assertEqual(ps[1], dict(batch=1, heads=2, seq_q=64, seq_k=64, head_dim=128, dtype="fp32", causal=False,
                                     direction="fwd"))

    def test_cpp_to_json_form(self):
        # what tuner/experiments/experiment.cpp writes: to_json(Problem) for every problem, in a list
        text = ('[{"batch":1,"causal":true,"direction":"bwd","dtype":"bf16","head_dim":96,"heads":4,'
                '"seq_k":300,"seq_q":200}]')
        (p,) = bl.load_problems(json.loads(text))
        self.assertEqual(p, dict(batch=1, heads=4, seq_q=200, seq_k=300, head_dim=96, dtype="bf16", causal=True,
                                 direction="bwd"))

    def test_problem_set_grid(self):
        ps = bl.load_problems({"problems": [prob()],
                               "grid": {"tokens": 4096, "hidden": 512, "seq": [1024, 2048], "head_dim": [64, 128],
                                        "causal": [False, True], "dtype": ["bf16"]}})
        self.assertEqual(len(ps), 1 + 2 * 2 * 2)
        self.assertIn(dict(batch=2, heads=4, seq_q=2048, seq_k=2048, head_dim=128, dtype="bf16", causal=True,
                           direction="fwd"), ps)

    def test_committed_problem_sets_parse(self):
        folder = os.path.join(SRC, "configs", "problems")
        if not os.path.isdir(folder):
            self.skipTest("no configs/problems")
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json"):
                with open(os.path.join(folder, name)) as f:
                    obj = json.load(f)
                if any("varlen" in p for p in obj.get("problems", [])):  # packed batches: refused by name
                    with self.assertRaisesRegex(ValueError, "varlen_vs_peers.py"):
                        bl.load_problems(obj)
                    continue
                if any("paged" in p for p in obj.get("problems", [])):  # paged caches: likewise
                    with self.assertRaisesRegex(ValueError, r"decode_vs_peers.py --paged"):
                        bl.load_problems(obj)
                    continue
                if any("window" in p or "softcap" in p or "alibi" in p or "mask_mod" in p
                       for p in obj.get("problems", [])):  # variants and masks: likewise
                    with self.assertRaisesRegex(ValueError, "plain attention only"):
                        bl.load_problems(obj)
                    continue
                self.assertTrue(bl.load_problems(obj), name)

    def test_inputs_field(self):
        # to_json(Problem) always writes "inputs"; the default stays implicit so plain problems compare as before
        p = bl.parse_problem(prob(inputs={"distribution": "normal", "scale": 1}))
        self.assertNotIn("inputs", p)
        self.assertEqual(bl.input_dist(p), {"distribution": "normal", "scale": 1.0})
        p = bl.parse_problem(prob(inputs={"distribution": "heavy", "scale": 5}))
        self.assertEqual(p["inputs"], {"distribution": "heavy", "scale": 5.0})
        self.assertEqual(bl.parse_problem(prob(inputs={"scale": 30}))["inputs"], {"distribution": "normal", "scale": 30.0})
        self.assertEqual(bl.parse_problem(prob(inputs={"distribution": "heavy"}))["inputs"]["scale"], 1.0)
        text = ('[{"batch":1,"causal":false,"direction":"fwd","dtype":"bf16","head_dim":64,"heads":1,'
                '"inputs":{"distribution":"normal","scale":30.0},"seq_k":300,"seq_q":200}]')
        (q,) = bl.load_problems(json.loads(text))
        self.assertEqual(q["inputs"], {"distribution": "normal", "scale": 30.0})
        (g,) = bl.load_problems({"grid": {"tokens": 1024, "hidden": 64, "seq": [1024], "head_dim": [64],
                                          "inputs": {"distribution": "heavy", "scale": 3}}})
        self.assertEqual(g["inputs"], {"distribution": "heavy", "scale": 3.0})
        for bad in ({"distribution": "cauchy"}, {"scale": 0}, {"scale": 1e4}, {"scale": "2"}, {"scale": True},
                    {"spread": 1}, "heavy", {"scale": float("nan")}):
            with self.assertRaises(ValueError, msg=repr(bad)):
                bl.parse_problem(prob(inputs=bad))

    def test_causal_as_int(self):
        self.assertTrue(bl.parse_problem(prob(causal=1))["causal"])
        self.assertFalse(bl.parse_problem(prob(causal=0))["causal"])

    def test_errors(self):
        bad = [prob(extra=1), prob(dtype="fp8"), prob(direction="both"), prob(causal="yes"), prob(causal=2),
               prob(batch=0), prob(heads=1.5), prob(head_dim=True), {k: v for k, v in prob().items() if k != "seq_k"},
               [1, 2], "x"]
        for j in bad:
            with self.assertRaises(ValueError, msg=repr(j)):
                bl.parse_problem(j)
        with self.assertRaises(ValueError):
            bl.load_problems(3)


class Rows(unittest.TestCase):
    def test_keys_and_order(self):
        self.assertEqual(list(bl.ROW_KEYS), EXPECTED_KEYS)
        row = bl.new_row("torch_flash", prob(causal=True), "NVIDIA H100")
        self.assertEqual(list(row), EXPECTED_KEYS)
        self.assertEqual(list(json.loads(json.dumps(row))), EXPECTED_KEYS)  # order survives the JSON line
        self.assertEqual(row["causal"], 1)
        self.assertIs(type(row["causal"]), int)
        self.assertEqual(row["family"], "")
        self.assertEqual((row["seq_q"], row["seq_k"]), (128, 256))
        self.assertIn(row["status"], bl.STATUSES)

    def test_clear_and_finite(self):
        row = bl.new_row("triton", prob(direction="bwd"))
        row.update(ms_median=1.0, reps=3, peak_bytes=10, detail={"dq_rel_l2": 0.1})
        bl.clear_measurements(row)
        self.assertEqual(list(row), EXPECTED_KEYS)
        self.assertEqual((row["ms_median"], row["reps"], row["peak_bytes"]), (0.0, 0, 0))
        self.assertEqual(bl.finite(float("inf")), sys.float_info.max)
        self.assertEqual(bl.finite(float("nan")), sys.float_info.max)
        self.assertEqual(bl.finite(2), 2.0)
        json.loads(json.dumps({"x": bl.finite(float("inf"))}), parse_constant=lambda c: self.fail(c))

    def test_one_line(self):
        self.assertEqual(bl.one_line("a\n  b\tc"), "a b c")
        self.assertEqual(len(bl.one_line("x" * 1000)), 300)

    def test_progress_line(self):
        row = bl.new_row("triton", prob(direction="bwd"))
        row["detail"] = {"dq_rel_l2": 1e-3, "dk_rel_l2": 2e-3, "dv_rel_l2": 3e-3}
        self.assertIn("rel_l2", bl.progress_line(row))


class Sampling(unittest.TestCase):
    def test_all_rows_when_few(self):
        self.assertEqual(bl.sample_rows(3, 100, 512, 1), list(range(300)))
        self.assertEqual(bl.sample_rows(3, 100, 0, 1), [])

    def test_sampled(self):
        n_heads, sq, m = 64, 1000, 512
        rows = bl.sample_rows(n_heads, sq, m, 20261121)
        self.assertEqual(len(rows), m)
        self.assertEqual(len(set(rows)), m)
        self.assertTrue(all(0 <= r < n_heads * sq for r in rows))
        # first and last rows of the last and the first head; the start of the last (ragged) tile
        last_tile = (sq - 1) // 128 * 128
        for r in (0, sq - 1, (n_heads - 1) * sq, n_heads * sq - 1, last_tile, (n_heads - 1) * sq + last_tile):
            self.assertIn(r, rows)
        self.assertEqual(rows, bl.sample_rows(n_heads, sq, m, 20261121))  # deterministic
        self.assertNotEqual(rows, bl.sample_rows(n_heads, sq, m, 7))
        self.assertGreater(len({r // sq for r in rows}), 8)  # spread over heads

    def test_fewer_rows_than_fixed(self):
        rows = bl.sample_rows(4, 1000, 3, 5)
        self.assertEqual(rows, [3 * 1000 + 999, 3 * 1000, 3 * 1000 + 896])

    def test_one_row_heads(self):
        rows = bl.sample_rows(1000, 1, 100, 3)  # Sq = 1: every head has one row
        self.assertEqual(len(set(rows)), 100)
        self.assertIn(0, rows)
        self.assertIn(999, rows)


class Pace(unittest.TestCase):
    def test_rule(self):
        pace = bl.Pace(2.0)
        small, big = prob(seq_q=1024, seq_k=1024), prob(seq_q=16384, seq_k=16384)
        self.assertFalse(pace.over("triton", big))  # nothing measured yet
        row = bl.new_row("triton", small)
        row.update(status="ok", ms_median=10.0)
        pace.record(row, small)
        self.assertAlmostEqual(pace.predicted_s("triton", big), 10e-3 * 256)
        self.assertTrue(pace.over("triton", big))
        self.assertFalse(pace.over("triton", prob(seq_q=16384, seq_k=16384, causal=True)))  # other kind
        self.assertFalse(pace.over("torch_flash", big))
        self.assertFalse(bl.Pace(0.0).over("triton", big))
        row2 = bl.new_row("triton", small)
        row2.update(status="invalid", ms_median=1e9)
        pace.record(row2, small)  # only ok rows count
        self.assertAlmostEqual(pace.predicted_s("triton", big), 10e-3 * 256)


class Classify(unittest.TestCase):
    def test_without_torch_objects(self):
        r = bl.Runner.__new__(bl.Runner)
        r.torch = None
        self.assertEqual(r.classify(RuntimeError("CUDA out of memory. Tried to allocate 64.00 GiB\nmore"))[0], "oom")
        st, msg = r.classify(RuntimeError("No available kernel. Aborting execution."))
        self.assertEqual((st, msg), ("unsupported", "No available kernel. Aborting execution."))
        self.assertEqual(r.classify(NotImplementedError("x"))[0], "unsupported")
        st, msg = r.classify(ValueError("bad\nthing"))
        self.assertEqual((st, msg), ("error", "ValueError: bad"))


class Cli(unittest.TestCase):
    def run_cli(self, impl, problems, *extra):
        with tempfile.TemporaryDirectory() as tmp:
            pf, of = os.path.join(tmp, "p.json"), os.path.join(tmp, "rows.jsonl")
            with open(pf, "w") as f:
                json.dump(problems, f)
            r = subprocess.run([sys.executable, os.path.join(SRC, "experiments", "baselines.py"), "--impl", impl,
                                "--problems", pf, "--out", of, *extra], capture_output=True, text=True, timeout=600)
            rows = []
            if os.path.exists(of):
                with open(of) as f:
                    rows = [json.loads(line) for line in f]
            return r, rows

    def test_cpu_size_limit(self):
        big = prob(batch=8, heads=16, seq_q=8192, seq_k=8192, head_dim=128, dtype="fp32")
        r, rows = self.run_cli("torch_cpu", [big, prob(direction="bwd", causal=True, dtype="fp32")],
                               "--cpu-max-gflop", "1e-9", "--reps", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(rows), 2)
        for row in rows:
            self.assertEqual(list(row), EXPECTED_KEYS)
            self.assertEqual(row["status"], "skipped")
            self.assertEqual(row["error"], "over the CPU size limit")
            self.assertTrue(row["device"].startswith("cpu: "))
        self.assertEqual(rows[1]["causal"], 1)
        self.assertEqual(len(r.stderr.strip().splitlines()), 2)  # one progress line per row

    @unittest.skipIf(have_torch(), "torch is installed: the rows would be measured")
    def test_no_torch_rows(self):
        r, rows = self.run_cli("torch_flash", [prob(), prob(direction="bwd")])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([row["status"] for row in rows], ["error", "error"])
        self.assertIn("torch", rows[0]["error"])
        self.assertEqual(list(rows[0]), EXPECTED_KEYS)

    def test_bad_problems_file(self):
        r, rows = self.run_cli("triton", [prob(dtype="fp64")])
        self.assertEqual(r.returncode, 2)
        self.assertIn("dtype", r.stderr)

    def test_bad_impl(self):
        r, _ = self.run_cli("torch_magic", [prob()])
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main(verbosity=1)
