#!/usr/bin/env python3
"""No-GPU checks of experiments/autotune_first_use.py (issue 36's first-use measurement): it imports without torch;
the buckets of the committed grid (18, a forward and a backward each), --subset and --offset; bad arguments exit 2
with one line; the CSV's columns (the issue's, in its order); a row's ratio and the bar; the children's environment
(the committed tables off, first use on with the budget, the store under --store-dir, no $FLASHTUNE_DB); the
--fault-check CLI wrapper.

usage: python3 tests/test_autotune_first_use_py.py
"""
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(SRC, "experiments", "autotune_first_use.py")
sys.path.insert(0, os.path.join(SRC, "experiments"))
import autotune_first_use as af  # noqa: E402  (must import without torch)


def args(*extra):
    return af.parse_args(["--out", os.path.join(tempfile.gettempdir(), "af.csv"), *extra])


def run_script(*extra):
    return subprocess.run([sys.executable, SCRIPT, *extra], capture_output=True, text=True, timeout=60)


class Buckets(unittest.TestCase):
    def test_grid(self):
        a = args()
        self.assertEqual(len(a.buckets), 18)
        self.assertTrue(all(b["directions"] == ["fwd", "bwd"] for b in a.buckets))
        seen = {(b["shape"]["seq_q"], b["shape"]["head_dim"], b["shape"]["causal"]) for b in a.buckets}
        self.assertEqual(seen, {(s, d, c) for s in (1024, 4096, 16384) for d in (64, 128, 256) for c in (False, True)})
        for b in a.buckets:
            s = b["shape"]
            self.assertEqual((s["dtype"], s["batch"] * s["seq_q"], s["heads"] * s["head_dim"]), ("bf16", 16384, 2048))
        self.assertEqual(a.buckets[0]["name"], "bf16 d64 full S1024 B16 H32")
        self.assertEqual(len({b["name"] for b in a.buckets}), 18)

    def test_subset_offset_and_forward_only(self):
        everything = args().buckets
        a = args("--subset", "4", "--offset", "2")
        self.assertEqual(a.buckets, everything[2:6])
        self.assertEqual(args("--offset", "16", "--subset", "5").buckets, everything[16:])
        fwd = args("--problems", os.path.join(SRC, "configs/problems/anchors_bf16.json"))
        self.assertEqual([b["directions"] for b in fwd.buckets], [["fwd"]] * 18)


class Arguments(unittest.TestCase):
    def test_bad_arguments_are_one_line_exit_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "x.csv")
            a_file = os.path.join(tmp, "store-file")
            open(a_file, "w").close()
            cases = [
                (["--out", out, "--budget-s", "0"], "--budget-s must be in 1..600"),
                (["--out", out, "--budget-s", "x"], "invalid float value"),
                (["--out", out, "--subset", "0"], "--subset must be at least 1"),
                (["--out", out, "--offset", "-1"], "--offset must be at least 0"),
                (["--out", out, "--offset", "18"], "past the 18 buckets"),
                (["--out", out, "--reps", "0"], "--reps must be in 1..1000"),
                (["--out", out, "--time-limit-s", "-5"], "--time-limit-s must be at least 0"),
                (["--out", os.path.join(tmp, "missing", "x.csv")], "--out: no folder"),
                (["--out", out, "--store-dir", a_file], "is not a folder"),
                (["--out", out, "--problems", os.path.join(tmp, "none.json")], "--problems"),
                (["--budget-s", "60"], "the following arguments are required: --out"),
            ]
            for argv, want in cases:
                r = run_script(*argv)
                self.assertEqual(r.returncode, 2, (argv, r.stderr))
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, (argv, r.stderr))
                self.assertIn(want, r.stderr, argv)
                self.assertTrue(r.stderr.startswith("autotune_first_use: "), r.stderr)
                self.assertFalse(os.path.exists(out), argv)  # nothing written before the arguments hold

    def test_defaults(self):
        a = args()
        self.assertEqual((a.budget_s, a.reps, a.offset, a.subset, a.store_dir, a.fault_check),
                         (60.0, 10, 0, None, None, False))


class Rows(unittest.TestCase):
    def test_columns_hold_the_issues_in_order(self):
        self.assertEqual(af.COLUMNS[0], "bucket")
        at = [af.COLUMNS.index(c) for c in af.ISSUE_COLUMNS]
        self.assertEqual(at, sorted(at))
        self.assertEqual(len(set(af.COLUMNS)), len(af.COLUMNS))

    def test_row_ratio_and_bar(self):
        b = args("--subset", "1").buckets[0]
        tuned = {"tune_s": 52.34, "first_call_s": 61.0, "faulted": 0}
        timed = {"second_source": "user/user", "second_first_call_s": 2.5, "second_tuned": "no",
                 "fwd": {"autotuned_tflops": 500.0, "table_tflops": 510.0, "autotuned_pick": "fa3_wgmma A=1",
                         "table_pick": "fa3_wgmma A=2", "table_source": "device"}}
        row = af.make_row(b, "fwd", 60.0, tuned, timed)
        self.assertEqual(list(row), af.COLUMNS)
        self.assertEqual((row["budget_s"], row["tune_s"], row["ratio"], row["second_tuned"]), ("60", "52.3", "0.980", "no"))
        self.assertTrue(af.meets_bar(row))
        self.assertFalse(af.meets_bar(dict(row, ratio="0.969")))
        self.assertFalse(af.meets_bar(dict(row, tune_s="60.1")))
        empty = af.make_row(b, "bwd", 60.0, tuned, {"note": "timing: RuntimeError: x"})  # the direction not timed
        self.assertEqual((empty["ratio"], empty["autotuned_tflops"], empty["note"]), ("", "", "timing: RuntimeError: x"))
        self.assertFalse(af.meets_bar(empty))

    def test_tflops_counts_the_backward(self):
        shape = {"batch": 4, "heads": 16, "seq_q": 4096, "seq_k": 4096, "head_dim": 128, "dtype": "bf16",
                 "causal": True}
        fwd = 4.0 * 4 * 16 * 4096 * 4096 * 128 / 2
        self.assertAlmostEqual(af.tflops(shape, "fwd", 1.0), fwd / 1e-3 / 1e12)
        self.assertAlmostEqual(af.tflops(shape, "bwd", 1.0), 2.5 * fwd / 1e-3 / 1e12)


class Children(unittest.TestCase):
    def test_environment(self):
        saved = dict(os.environ)
        try:
            os.environ["FLASHTUNE_DB"] = "/somewhere/results.db"
            os.environ.pop("FLASHTUNE_CACHE_DIR", None)
            env = af.child_env("/tmp/store", 45.0)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.assertEqual((env["FLASHTUNE_TABLES"], env["FLASHTUNE_AUTOTUNE"], env["FLASHTUNE_AUTOTUNE_BUDGET"]),
                         ("off", "1", "45"))
        self.assertEqual(env["XDG_CACHE_HOME"], "/tmp/store")
        self.assertNotIn("FLASHTUNE_DB", env)
        self.assertEqual(env["FLASHTUNE_CACHE_DIR"], "/tmp/store/kernel-cache")
        self.assertIn(os.path.join(SRC, "python"), env["PYTHONPATH"].split(":"))

    def test_fault_cli_runs_the_fault_family_once_then_the_real_cli(self):
        with tempfile.TemporaryDirectory() as tmp:
            real = os.path.join(tmp, "real")
            with open(real, "w") as fh:  # records its arguments
                fh.write(f"#!/bin/sh\necho \"$@\" >> {tmp}/calls\n")
            os.chmod(real, 0o700)
            wrapper, db = af.fault_cli(tmp, real)
            for argv in (["devices", "--store"], ["tune", "space.json", "p.json"], ["tune", "space.json", "p.json"]):
                subprocess.run([wrapper, *argv], check=True)
            with open(os.path.join(tmp, "calls")) as fh:
                calls = fh.read().splitlines()
            self.assertEqual(calls[0], "devices --store")
            self.assertIn("fault_space.json", calls[1])
            self.assertIn(f"--db {db}", calls[1])
            self.assertEqual(calls[2:], ["tune space.json p.json"] * 2)  # the fault sweep once, before the first tune
            with open(os.path.join(tmp, "fault_space.json")) as fh:
                self.assertIn('"family": "fault"', fh.read())


if __name__ == "__main__":
    unittest.main()
