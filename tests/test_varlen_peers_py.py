#!/usr/bin/env python3
"""No-GPU checks of experiments/varlen_vs_peers.py: the points as `flashtune problems --json` gives them (the
committed varlen problem sets: lengths summing to the batch's tokens, offsets, FLOPs recomputed here per
sequence), the `flashtune run` command line of a point, the row (ratios, empty cells for a backend that
refused, the reason kept), and that the module imports without torch.

usage: FLASHTUNE=build/flashtune python3 tests/test_varlen_peers_py.py
"""
import json
import os
import shlex
import subprocess
import sys
import unittest

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "experiments"))
import varlen_vs_peers as vp  # noqa: E402  (must import without torch)

FLASHTUNE = os.environ.get("FLASHTUNE", os.path.join(SRC, "build", "flashtune"))


def point(**kw):
    p = {"heads": 32, "heads_k": 8, "head_dim": 128, "dtype": "bf16", "causal": True, "direction": "fwd",
         "varlen": {"seq_lens": [3, 5]}, "seq_lens_q": [3, 5], "seq_lens_k": [3, 5], "cu_seqlens_q": [0, 3, 8],
         "cu_seqlens_k": [0, 3, 8], "flops": 4.0 * 32 * 128 * (9 + 25) / 2}
    p.update(kw)
    return p


class Points(unittest.TestCase):
    def test_committed_sets(self):
        files = [os.path.join(SRC, "configs/problems", f) for f in ("varlen_bf16.json", "varlen_bwd_bf16.json")]
        points = vp.load_points(FLASHTUNE, files)
        self.assertEqual(len(points), 16)
        self.assertEqual({p["direction"] for p in points}, {"fwd", "bwd"})
        for p in points:
            lq, lk = p["seq_lens_q"], p["seq_lens_k"]
            self.assertEqual(lq, lk)  # self-attention
            self.assertEqual(sum(lq), 16384)
            self.assertEqual(p["cu_seqlens_q"][0], 0)
            self.assertEqual(p["cu_seqlens_q"][-1], 16384)
            self.assertEqual(len(p["cu_seqlens_q"]), len(lq) + 1)
            v = p["varlen"]
            self.assertTrue(all(v["min"] <= x <= v["max"] for x in lq[:-1]), lq)  # the last one is cut to fit
            self.assertEqual(p["batch"], len(lq))
            self.assertEqual(p["seq_q"], max(lq))
            flops = 4.0 * p["heads"] * p["head_dim"] * sum(a * b for a, b in zip(lq, lk))
            flops *= (0.5 if p["causal"] else 1.0) * (2.5 if p["direction"] == "bwd" else 1.0)
            self.assertAlmostEqual(p["flops"] / flops, 1.0, places=12)
        # The same description gives the same lengths in both files (fwd and bwd points are the same batches).
        key = lambda p: (json.dumps(p["varlen"], sort_keys=True), p.get("heads_k"), p["causal"])
        fwd = {key(p): p["seq_lens_q"] for p in points if p["direction"] == "fwd"}
        for p in points:
            if p["direction"] == "bwd":
                self.assertEqual(fwd[key(p)], p["seq_lens_q"])

    def test_dense_points_left_out(self):
        points = vp.load_points(FLASHTUNE, [os.path.join(SRC, "configs/problems/ragged_gqa.json")])
        self.assertEqual(points, [])

    def test_bad_file_stops(self):
        with self.assertRaises(SystemExit):
            vp.load_points(FLASHTUNE, [os.path.join(SRC, "configs/problems/does_not_exist.json")])


class Commands(unittest.TestCase):
    def test_run_argv(self):
        argv = vp.run_argv("ft", point(), "r.db")
        self.assertEqual(argv[:8], ["ft", "run", "--family", "fa2_mma", "--best", "--db", "r.db", "--shape"])
        self.assertEqual(vp.run_argv("ft", point(), "r.db", "fa3_wgmma")[3], "fa3_wgmma")
        self.assertEqual(argv[8], "32,128")
        self.assertEqual(json.loads(argv[argv.index("--varlen") + 1]), {"seq_lens": [3, 5]})
        self.assertIn("--causal", argv)
        self.assertEqual(argv[argv.index("--heads-k") + 1], "8")
        mha = point(direction="bwd", causal=False)
        del mha["heads_k"]
        b = vp.run_argv("ft", mha, "r.db")
        self.assertEqual(b[b.index("--family") + 1], "fa2_mma_bwd")
        self.assertEqual(b[b.index("--direction") + 1], "bwd")
        self.assertNotIn("--causal", b)
        self.assertNotIn("--heads-k", b)

    def test_run_parses_the_problem_back(self):
        # The command line's --varlen and --shape describe the point itself: flashtune parses it to the same
        # problem (no GPU needed to get that far: it stops at "no GPU" or runs).
        files = [os.path.join(SRC, "configs/problems/varlen_bf16.json")]
        p = vp.load_points(FLASHTUNE, files)[0]
        argv = vp.run_argv(FLASHTUNE, p, "/nonexistent/x.db")
        r = subprocess.run(argv, capture_output=True, text=True)
        self.assertNotIn("--varlen", r.stderr, shlex.join(argv))  # not a usage error about the flag itself
        self.assertIn("x.db", r.stderr + r.stdout)  # stopped at the missing store, after parsing the problem

    def test_best_of_our_families(self):
        runs = [{"family": "fa3_wgmma", "status": "error", "error": "no stored result"},
                {"family": "fa2_mma", "status": "ok", "tflops": 300.0}]
        self.assertEqual(vp.best_run(runs)["family"], "fa2_mma")
        runs[0] = {"family": "fa3_wgmma", "status": "ok", "tflops": 500.0}
        self.assertEqual(vp.best_run(runs)["family"], "fa3_wgmma")
        self.assertEqual(vp.best_run([{"family": "x", "status": "invalid"}])["family"], "x")
        self.assertEqual(vp.FAMILIES["bwd"], ("fa2_wgmma_bwd", "fa2_mma_bwd"))
        bwd = [{"family": "fa2_wgmma_bwd", "status": "error", "error": "no stored result"},
               {"family": "fa2_mma_bwd", "status": "ok", "tflops": 200.0}]
        self.assertEqual(vp.best_run(bwd)["family"], "fa2_mma_bwd")
        bwd[0] = {"family": "fa2_wgmma_bwd", "status": "ok", "tflops": 260.0}
        self.assertEqual(vp.best_run(bwd)["family"], "fa2_wgmma_bwd")

    def test_labels(self):
        self.assertEqual(vp.lengths_label({"lengths": "uniform", "min": 64, "max": 1024, "total_tokens": 16384, "seed": 0}),
                         "uniform 64-1024 x16384 seed 0")
        self.assertEqual(vp.lengths_label({"lengths": "fixed", "length": 96, "total_tokens": 500}), "fixed 96 x500")
        self.assertEqual(vp.lengths_label({"seq_lens": [1, 2]}), "[1,2]")
        self.assertEqual(vp.lengths_label({"seq_lens": list(range(20))}), "[20 seqs]")


class Rows(unittest.TestCase):
    def test_ratios_and_empty_cells(self):
        p = point()
        ms = p["flops"] / 1e12 / 100.0 * 1e3  # 100 TFLOP/s
        row = vp.make_row(p, {"status": "ok", "tflops": 150.0, "config": "BLOCK_M=128", "ms_median": 0.5, "family": "fa2_mma"},
                          {"flash": ms, "cudnn": 2 * ms}, "aten._cudnn_attention_forward", [], "GPU",
                          {"flash": ms * 1.01, "cudnn": 80.0})
        self.assertEqual(set(row), set(vp.COLUMNS))
        self.assertEqual(row["torch_flash_tflops"], "100.0")
        self.assertEqual(row["torch_cudnn_tflops"], "50.0")
        self.assertEqual(row["ratio_vs_flash"], "1.500")
        self.assertEqual(row["ratio_vs_cudnn"], "3.000")
        self.assertEqual((row["sequences"], row["total_tokens"], row["max_len"]), (2, 8, 5))
        self.assertEqual(row["torch_cudnn_call_ms"], "80.0000")  # the whole call: reported, not rated
        self.assertEqual(row["torch_flash_call_ms"], f"{ms * 1.01:.4f}")

        refused = vp.make_row(p, {"status": "invalid", "error": "x" * 500, "tflops": 9.0}, {"flash": ms}, "",
                              ["cudnn: RuntimeError: no"], "GPU")
        self.assertEqual(refused["tuned_tflops"], "")
        self.assertEqual(refused["ratio_vs_flash"], "")
        self.assertEqual(refused["torch_cudnn_tflops"], "")
        self.assertEqual(refused["ratio_vs_cudnn"], "")
        self.assertIn("cudnn: RuntimeError", refused["torch_notes"])
        self.assertLess(len(refused["tuned_status"]), 140)

    def test_sleep_covers_the_host_time(self):
        # The GPU sleeps longer than the host takes to queue the call (at up to 2 GHz), plus a floor.
        self.assertGreaterEqual(vp.sleep_cycles(0.07), int(0.07 * 2.0e9))
        self.assertEqual(vp.sleep_cycles(0.0), 1_000_000)

    def test_imports_without_torch(self):
        r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; "
                            f"sys.path.insert(0, {os.path.join(SRC, 'experiments')!r}); import varlen_vs_peers"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
