#!/usr/bin/env python3
"""One median (issue 35): every median a report prints lies within its own p20-p80, and the report's
percentile is the harness's (core/timing.hpp; the same values as test_strategy.cpp's Timing test).

usage: report_medians.py [DIR ...]   (default: every reports/<gpu>/ with a REPORT.md in the source tree)
Checks each DIR's REPORT.md (the best-config table's "median ms | p20-p80 ms" cells) and best.csv
(ms_median within ms_p20..ms_p80 wherever a spread is given). Exit 1 with every offending line."""
import csv
import glob
import os
import re
import sys

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "reports"))
from make_report import percentile  # noqa: E402

CELL = re.compile(r"\| (\d+(?:\.\d+)?) \| (\d+(?:\.\d+)?)-(\d+(?:\.\d+)?) \|")


def check(d):
    fail, n = [], 0
    report = os.path.join(d, "REPORT.md")
    for i, line in enumerate(open(report), 1):
        for m in CELL.finditer(line):
            med, lo, hi = map(float, m.groups())
            n += 1
            if not lo <= med <= hi:
                fail.append(f"{report}:{i}: median {med} outside its p20-p80 {lo}-{hi}")
    best = os.path.join(d, "best.csv")
    if os.path.exists(best):
        for i, r in enumerate(csv.DictReader(open(best)), 2):
            med, lo, hi = (float(r[k] or 0) for k in ("ms_median", "ms_p20", "ms_p80"))
            n += 1
            if (lo or hi) and not lo <= med <= hi:
                fail.append(f"{best}:{i}: ms_median {med} outside ms_p20-ms_p80 {lo}-{hi}")
    return fail, n


def main():
    fail = []
    # The definition: linear between the nearest ranks; an even count's median is the two middles' mean.
    for values, q, want in (([4, 1, 3, 2], 0.5, 2.5), ([9.4, 9.5, 9.75], 0.2, 9.44), ([9.4, 9.5, 9.75], 0.8, 9.65),
                            ([3.0], 0.2, 3.0), ([], 0.5, 0.0)):
        if abs(percentile(values, q) - want) > 1e-12:
            fail.append(f"percentile({values}, {q}) = {percentile(values, q)}, want {want}")
    dirs = sys.argv[1:] or sorted(os.path.dirname(p) for p in glob.glob(os.path.join(SRC, "reports", "*", "REPORT.md")))
    if not dirs:
        fail.append("no REPORT.md to check")
    for d in dirs:
        f, n = check(d)
        fail += f
        if not n:
            fail.append(f"{d}: no median with a p20-p80 found (the table's format changed?)")
        print(f"report_medians: {os.path.relpath(d, SRC) if d.startswith(SRC) else os.path.basename(d)}: {n} medians checked")
    if fail:
        print("FAIL:\n" + "\n".join(fail[:50]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
