#!/usr/bin/env python3
"""No-GPU checks of experiments/decode_vs_peers.py --paged: the points as `flashtune problems --json` gives them
(the committed paged grid: decode_bf16.json's shapes from 256-key pages, the bytes of the dense shape), the
`flashtune run` command lines of a point (paged and dense), BLOCK_N read from a config, the row (ratios, the
same-config column taken from the paged pick when the configs agree, empty cells and the reason when a run
failed), and that the module imports without torch.

usage: FLASHTUNE=build/flashtune python3 tests/test_decode_peers_py.py
"""
import json
import os
import sys
import unittest

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "experiments"))
sys.modules["torch"] = None  # an import of torch fails: --paged must not need it
import decode_vs_peers as dp  # noqa: E402

FLASHTUNE = os.environ.get("FLASHTUNE", os.path.join(SRC, "build", "flashtune"))


def run(config, gbps, ms, status="ok"):
    return {"status": status, "config": config, "gbps": gbps, "ms_median": ms, "device": "GPU A",
            **({} if status == "ok" else {"error": "no stored valid result\nsecond line"})}


class PagedPoints(unittest.TestCase):
    def test_committed_grid(self):
        points = dp.load_paged_points(FLASHTUNE, os.path.join(SRC, "configs/problems/decode_paged_bf16.json"))
        self.assertEqual(len(points), 9)
        self.assertEqual({(p["batch"], p["seq_k"]) for p in points},
                         {(b, s) for b in (1, 8, 64) for s in (4096, 32768, 131072)})
        for p in points:
            self.assertEqual(p["paged"], {"page_size": 256, "seed": 0})
            self.assertEqual((p["heads"], p["heads_k"], p["seq_q"], p["head_dim"], p["dtype"]), (32, 8, 1, 128, "bf16"))
            self.assertEqual(p["cache_seqlens"], [p["seq_k"]] * p["batch"])
            self.assertEqual(p["num_pages"], p["batch"] * p["seq_k"] // 256)
            # The bytes of the dense shape: Q, O, LSE of 32 heads, K and V of 8, every key once.
            self.assertEqual(p["bytes"], 32 * p["batch"] * (2 * 128 * 2 + 4) + 8 * p["batch"] * p["seq_k"] * 2 * 128 * 2)

    def test_dense_points_left_out(self):
        self.assertEqual(dp.load_paged_points(FLASHTUNE, os.path.join(SRC, "configs/problems/decode_bf16.json")), [])

    def test_command_lines(self):
        p = {"batch": 3, "heads": 8, "heads_k": 2, "seq_q": 1, "seq_k": 300, "head_dim": 128, "dtype": "fp16",
             "causal": True, "paged": {"page_size": 64, "seed": 3, "seq_lens_k": [300, 0, 65]}}
        cmd = dp.run_command("ft", "decode_splitkv", p, ["--best", "--db", "x.db"], True)
        self.assertEqual(cmd[:6], ["ft", "run", "--family", "decode_splitkv", "--shape", "3,8,1,300,128"])
        self.assertEqual(cmd[cmd.index("--paged") + 1], '{"page_size":64,"seed":3,"seq_lens_k":[300,0,65]}')
        self.assertEqual(cmd[cmd.index("--heads-k") + 1], "2")
        self.assertIn("--causal", cmd)
        self.assertIn("--best", cmd)
        dense = dp.run_command("ft", "decode_splitkv", p, ["--params", "SPLITS=1"], False)
        self.assertNotIn("--paged", dense)
        self.assertEqual(dense[dense.index("--params") + 1], "SPLITS=1")
        self.assertEqual(dp.block_n("SPLITS=16,BLOCK_N=128,WARPS=4,STAGES=1"), 128)
        self.assertEqual(dp.block_n(""), 0)

    def test_rows(self):
        p = {"batch": 8, "heads": 32, "heads_k": 8, "seq_q": 1, "seq_k": 32768, "head_dim": 128, "dtype": "bf16",
             "causal": False, "paged": {"page_size": 256, "seed": 0}}
        a, b = "SPLITS=16,BLOCK_N=256,WARPS=4,STAGES=1", "SPLITS=4,BLOCK_N=64,WARPS=2,STAGES=1"
        row = dp.paged_row(p, run(a, 2800.0, 0.4), run(b, 2900.0, 0.38), run(b, 2750.0, 0.41), "GPU A")
        self.assertEqual(list(row), dp.PAGED_COLUMNS)
        self.assertEqual(row["ratio_paged_vs_dense"], f"{2800 / 2900:.3f}")
        self.assertEqual(row["ratio_same_config"], f"{2750 / 2900:.3f}")
        self.assertEqual((row["page_size"], row["heads_k"], row["paged_status"]), (256, 8, "ok"))
        # The same config: the paged pick's own figure stands for the same-config run.
        row = dp.paged_row(p, run(a, 2800.0, 0.4), run(a, 2900.0, 0.38), None, "GPU A")
        self.assertEqual(row["dense_config_paged_gbps"], "2800.0")
        self.assertEqual(row["dense_config_paged_status"], "the paged pick")
        # A failed run: empty cells, its reason on one line.
        row = dp.paged_row(p, run(a, 2800.0, 0.4), run("", 0.0, 0.0, "error"), None, "GPU A")
        self.assertEqual((row["dense_gbps"], row["ratio_paged_vs_dense"], row["dense_config_paged_gbps"]), ("0.0", "", ""))
        self.assertEqual(row["dense_status"], "error: no stored valid result")  # its first line


if __name__ == "__main__":
    unittest.main()
