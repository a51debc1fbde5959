#!/usr/bin/env python3
"""Instruction mix of profiled kernels, from Nsight Compute's source page (`ncu --import R --page source --csv
--print-source sass`, gzipped): per kernel, the executed instructions in all and per opcode class, and each
class's share of the warp-stall samples. Used to compare fa3_wgmma_bwd's dK/dV kernel with the FA3-class
kernel at the same shape (scripts/device_run.sh fa3-bwd profile).

usage: sass_mix.py LABEL=FILE.sass.csv.gz ... [--out mix.csv]
"""
import argparse
import collections
import csv
import gzip
import re
import sys

# opcode -> class: what the instruction is for in an attention backward
CLASSES = [
    ("tensor", r"^HGMMA|^WARPGROUP"),
    ("exp", r"^MUFU"),
    ("fp32", r"^F(FMA|MUL|ADD|SEL|MNMX)"),
    ("convert", r"^F2FP|^F2F"),
    ("uniform", r"^U"),
    ("to_uniform", r"^R2UR"),
    ("int_logic", r"^(LOP3|PLOP3|SHF|IMAD|IADD3|VIADD|LEA|ISETP|IABS|SEL|PRMT|MOV|I2F|F2I)"),
    ("shared_ld", r"^LD(S|SM)"),
    ("shared_st", r"^ST(S|SM)"),
    ("shuffle", r"^SHFL"),
    ("sync", r"^(BAR|SYNCS|MEMBAR|FENCE|NANOSLEEP|YIELD|WARPSYNC|BSSY|BSYNC)"),
    ("branch", r"^(BRA|EXIT|RET|CALL)"),
]


def opclass(op):
    for name, pat in CLASSES:
        if re.match(pat, op):
            return name
    return "other"


def load(path):
    with gzip.open(path, "rt") as f:
        r = csv.reader(f)
        next(r)  # the kernel's name
        hdr = next(r)
        ix = {h: i for i, h in enumerate(hdr)}
        for row in r:
            if len(row) < len(hdr):
                continue
            src = row[ix["Source"]].strip()
            op = re.sub(r"^@!?U?P\w+\s+", "", src).split(" ")[0]
            yield op, int(row[ix["Instructions Executed"]] or 0), int(row[ix["Warp Stall Sampling (All Samples)"]] or 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="LABEL=FILE.sass.csv.gz")
    ap.add_argument("--out", help="CSV: label, class, instructions, share, stall_share")
    a = ap.parse_args()
    rows = []
    for spec in a.inputs:
        label, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"sass_mix: expected LABEL=FILE, got {spec!r}")
        inst, stall = collections.Counter(), collections.Counter()
        for op, n, s in load(path):
            inst[opclass(op)] += n
            stall[opclass(op)] += s
        ti, ts = sum(inst.values()), max(1, sum(stall.values()))
        print(f"{label}: {ti:,} instructions executed")
        for cls, n in inst.most_common():
            print(f"  {cls:11s} {n:13,d} {100 * n / ti:5.1f}%  stalls {100 * stall[cls] / ts:5.1f}%")
            rows.append([label, cls, n, f"{n / ti:.4f}", f"{stall[cls] / ts:.4f}"])
        rows.append([label, "all", ti, "1.0000", "1.0000"])
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["label", "class", "instructions", "share", "stall_share"])
            w.writerows(rows)


if __name__ == "__main__":
    main()
