#!/usr/bin/env python3
"""Build REPORT.md, its CSVs and PNG plots from stored data alone (no GPU): the SQLite results of
the sweeps (opened read-only) and the comparison CSVs the device runs wrote beside the store.

usage: make_report.py --db PATH [--out DIR] [--default FAMILY:K=V,... ...]
       make_report.py DIR            (the same as --db DIR/results.db --out DIR)
(`flashtune report --db PATH` runs it with every family's default configuration.)
REPORT.md names files relative to the output folder only, so regenerating it elsewhere changes nothing.
"""
import csv
import math
import os
import re
import sqlite3
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False  # stored names are text: "$x$" is not math
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiments_report  # noqa: E402

# Family defaults, the fixed configurations a tuner has to beat: passed in by `flashtune report`
# from the family descriptors (tuner/family.cpp), so they are written down once.
DEFAULTS = {}


def params(config):
    try:
        return dict((k, int(v)) for k, v in (kv.split("=") for kv in config.split(",")))
    except ValueError:
        return {}


def ok(r):
    """A valid row with figures that can be drawn (a NULL or zero TFLOP/s is left out)."""
    return r["status"] == "ok" and r["tflops"] > 0 and r["ms_median"] > 0


def inputs_of(r):
    return r.get("inputs") or "normal"  # stores before schema 4 hold generated normal inputs only


def problem_label(r):
    s = f"d{r['head_dim']} S{r['seq_q']}" if r["seq_q"] == r["seq_k"] else f"d{r['head_dim']} Sq{r['seq_q']} Sk{r['seq_k']}"
    s += (" causal" if r["causal"] else "") + f" {r['dtype']}"
    if r.get("varlen"):  # a packed variable-length batch (schema 7): B sequences, the longest S
        s += f" varlen B{r['batch']} {r['varlen']}"
    return s + ("" if inputs_of(r) == "normal" else f" inputs {inputs_of(r)}")


def load(db):
    con = experiments_report.connect_ro(db)
    con.row_factory = sqlite3.Row
    rows = [experiments_report.clean_numbers(dict(r)) for r in con.execute("select * from results")]
    con.close()
    # Family and dtype name plot files: rows whose names are not plain identifiers are left out.
    safe = [r for r in rows if isinstance(r["family"], str) and re.fullmatch(r"[a-z0-9_]{1,64}", r["family"])
            and isinstance(r["dtype"], str) and re.fullmatch(r"[a-z0-9]{1,16}", r["dtype"])
            and isinstance(r["config"], str)]
    if len(safe) != len(rows):
        print(f"make_report: left out {len(rows) - len(safe)} rows whose family, dtype or config is not plain text",
              file=sys.stderr)
    return safe


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def md_table(rows, fields, headers=None):
    headers = headers or fields
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(experiments_report.md_text(r[f]) for f in fields) + " |")
    return "\n".join(out)


def best_per_problem(rows):
    best = {}
    for r in rows:
        if not ok(r):
            continue
        key = (r["device_name"], r["family"], r["batch"], r["heads"], r["seq_q"], r["seq_k"], r["head_dim"],
               r["dtype"], r["causal"], inputs_of(r), r.get("varlen") or "")
        if key not in best or r["tflops"] > best[key]["tflops"]:
            best[key] = r
    return sorted(best.values(), key=lambda r: (r["family"], r["dtype"], r["head_dim"], r["causal"], r["seq_q"]))


def landscape(rows, out_dir, report):
    """TFLOP/s over (BLOCK_M, BLOCK_N), best over the other tunables, per family and head dim,
    non-causal, at the largest sequence length swept."""
    groups = defaultdict(list)
    for r in rows:
        if ok(r) and not r["causal"] and {"BLOCK_M", "BLOCK_N"} <= params(r["config"]).keys() and not r.get("varlen"):
            groups[(r["family"], r["dtype"], r["head_dim"])].append(r)
    pngs = []
    for (family, dtype, d), rs in sorted(groups.items()):
        smax = max(r["seq_q"] for r in rs)
        grid = defaultdict(float)
        for r in rs:
            if r["seq_q"] == smax:
                p = params(r["config"])
                grid[(p["BLOCK_M"], p["BLOCK_N"])] = max(grid[(p["BLOCK_M"], p["BLOCK_N"])], r["tflops"])
        ms = sorted({m for m, _ in grid})
        ns = sorted({n for _, n in grid})
        data = [[grid.get((m, n), float("nan")) for n in ns] for m in ms]
        fig, ax = plt.subplots(figsize=(4.8, 3.6))
        im = ax.imshow(data, cmap="viridis", origin="lower")
        ax.set_xticks(range(len(ns)), [str(n) for n in ns])
        ax.set_yticks(range(len(ms)), [str(m) for m in ms])
        ax.set_xlabel("BLOCK_N (keys per tile)")
        ax.set_ylabel("BLOCK_M (queries per tile)")
        for i, row in enumerate(data):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="center",
                            color="white" if v < 0.6 * max(x for x in sum(data, []) if not math.isnan(x)) else "black")
        fig.colorbar(im, ax=ax, label="TFLOP/s (best over other tunables)")
        ax.set_title(f"{family} {dtype} d={d}, S={smax}, non-causal")
        fig.tight_layout()
        name = f"landscape_{family}_{dtype}_d{d}.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        pngs.append(name)
    if pngs:
        report.append("## Tuning landscape\n\nTFLOP/s over (BLOCK_M, BLOCK_N), best over the other tunables, "
                      "non-causal, largest sequence swept. Empty cells: pruned or not in the space.\n")
        report += [f"![{p}]({p})" for p in pngs]
        report.append("")
    return pngs


def tuned_vs_default(rows, out_dir, report):
    by_problem = defaultdict(dict)
    for r in rows:
        if ok(r):
            by_problem[(r["family"], r["batch"], r["heads"], r["seq_q"], r["seq_k"], r["head_dim"], r["dtype"],
                        r["causal"], inputs_of(r), r.get("varlen") or "")][r["config"]] = r
    out = []
    for key, cfgs in sorted(by_problem.items()):
        family = key[0]
        default = cfgs.get(DEFAULTS.get(family, ""))
        best = max(cfgs.values(), key=lambda r: r["tflops"])
        if default is None:
            continue
        out.append(dict(family=family, problem=problem_label(best), batch=best["batch"], heads=best["heads"],
                        tuned_config=best["config"], tuned_tflops=f"{best['tflops']:.1f}",
                        default_config=default["config"], default_tflops=f"{default['tflops']:.1f}",
                        speedup=f"{best['tflops'] / default['tflops']:.2f}"))
    if not out:
        return
    write_csv(os.path.join(out_dir, "tuned_vs_default.csv"), out, list(out[0].keys()))
    report.append("## Tuned config vs the family default\n")
    report.append(md_table(out, ["family", "problem", "tuned_config", "tuned_tflops", "default_config",
                                 "default_tflops", "speedup"],
                           ["family", "problem", "tuned", "TFLOP/s", "default", "TFLOP/s", "speedup"]))
    for family in sorted({r["family"] for r in out}):
        rows = [r for r in out if r["family"] == family]
        fig, ax = plt.subplots(figsize=(7, 0.9 + 0.32 * len(rows)))
        ax.barh(range(len(rows)), [float(r["speedup"]) for r in rows], color="tab:green")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [r["problem"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("tuned / default TFLOP/s (1 = no gain)")
        ax.set_title(f"{family}: tuned vs default {DEFAULTS[family]}", fontsize=9)
        fig.tight_layout()
        name = f"tuned_vs_default_{family}.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        report.append(f"\n![{name}]({name})")
    report.append("")


def comparison_plot(csv_path, out_dir, report, title, ours, baselines):
    rows = list(csv.DictReader(open(csv_path)))
    if not rows:
        return
    labels = [f"d{r['head_dim']} S{r.get('seq', r.get('seq_q'))}{' c' if r['causal'] in ('1', 'True') else ''}"
              for r in rows]
    series = [(name, col) for name, col in [ours] + baselines if col in rows[0]]
    fig, ax = plt.subplots(figsize=(min(14, max(6, 0.45 * len(rows) * len(series) / 2)), 5))
    width = 0.8 / len(series)
    for i, (name, col) in enumerate(series):
        ax.bar([x + i * width for x in range(len(rows))], [float(r[col] or 0) for r in rows], width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (FA convention, causal counts half)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    name = os.path.splitext(os.path.basename(csv_path))[0] + ".png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    report.append(f"## {title}\n\nFrom `{os.path.basename(csv_path)}` (one device run, one GPU).\n")
    report.append(md_table(rows, list(rows[0].keys())))
    report.append(f"\n![{name}]({name})\n")


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", nargs="?", help="DIR: the same as --db DIR/results.db --out DIR")
    ap.add_argument("--db", help="the store (opened read-only)")
    ap.add_argument("--out", help="where REPORT.md, CSVs and plots go (default: the store's folder)")
    ap.add_argument("--default", action="append", default=[], help="FAMILY:K=V,... (repeatable)")
    a = ap.parse_args()
    if bool(a.folder) == bool(a.db):
        ap.error("give a folder or --db")
    db = a.db or os.path.join(a.folder, "results.db")
    out_dir = a.out or a.folder or os.path.dirname(db) or "."
    src_dir = os.path.dirname(db) or "."  # the comparison CSVs live beside the store
    os.makedirs(out_dir, exist_ok=True)
    for d in a.default:
        family, config = d.split(":", 1)
        DEFAULTS[family] = config
    rows = load(db)
    devices = sorted({str(r["device_name"]) for r in rows})
    # Names relative to the output folder only: no machine path enters a tracked file.
    db_name = os.path.relpath(os.path.abspath(db), os.path.abspath(out_dir))
    report = [f"# flashtune report: {', '.join(map(experiments_report.md_text, devices))}\n",
              f"Regenerated by `flashtune report` from `{db_name}` ({len(rows)} stored attempts) "
              "and the CSVs beside it. Do not edit by hand.\n"]
    status = defaultdict(lambda: defaultdict(int))
    for r in rows:
        status[r["family"]][r["status"]] += 1
    all_status = sorted({s for f in status.values() for s in f})
    srows = [dict(family=f, **{s: status[f].get(s, 0) for s in all_status}) for f in sorted(status)]
    report.append("## Every attempt by status\n")
    report.append(md_table(srows, ["family"] + all_status))
    report.append("")

    best = best_per_problem(rows)
    for r in best:
        r["problem"] = problem_label(r)
        r["tflops_s"] = f"{r['tflops']:.1f}"
        r["ms"] = f"{r['ms_median']:.3f}"
        r["spread"] = f"{r['ms_p20']:.3f}-{r['ms_p80']:.3f}"
        r["err"] = f"{r['max_abs']:.1e}"
    write_csv(os.path.join(out_dir, "best.csv"), best,
              ["device_name", "family", "batch", "heads", "seq_q", "seq_k", "head_dim", "dtype", "causal", "config",
               "ms_median", "ms_p20", "ms_p80", "tflops", "gbps", "max_abs", "max_rel", "mse"])
    report.append("## Best valid config per problem\n")
    report.append(md_table(best, ["family", "problem", "batch", "heads", "config", "ms", "spread", "tflops_s", "err"],
                           ["family", "problem", "B", "H", "config", "median ms", "p20-p80 ms", "TFLOP/s",
                            "max abs err"]))
    report.append("")

    simt = os.path.join(src_dir, "fa2_simt_vs_sdpa.csv")
    if os.path.exists(simt):
        comparison_plot(simt, out_dir, report, "fa2_simt (fp32, CUDA cores) vs torch SDPA efficient (fp32)",
                        ("fa2_simt tuned", "tflops"), [("torch SDPA efficient", "torch_sdpa_efficient_tflops")])
    bwd32 = os.path.join(src_dir, "bwd_vs_sdpa_fp32.csv")
    if os.path.exists(bwd32):
        comparison_plot(bwd32, out_dir, report, "fa2_simt_bwd (fp32 backward) vs torch SDPA efficient backward",
                        ("fa2_simt_bwd tuned", "tflops"), [("torch SDPA efficient", "torch_sdpa_efficient_tflops")])
    for name, title in (
            ("bwd_vs_sdpa.csv",
             "bf16 backward, best of fa2_wgmma_bwd and fa2_mma_bwd (tuned_family), vs torch SDPA flash and cuDNN"),
            ("bwd_vs_sdpa_d256.csv",
             "bf16 backward at d = 256, re-measured after a kernel change, vs torch SDPA flash and cuDNN")):
        bwd = os.path.join(src_dir, name)
        if os.path.exists(bwd):
            comparison_plot(bwd, out_dir, report, title, ("ours tuned", "tuned_tflops"),
                            [("torch flash (FA2)", "torch_flash_tflops"), ("torch cuDNN", "torch_cudnn_tflops")])
    fwd = os.path.join(src_dir, "fwd_vs_sdpa.csv")
    if os.path.exists(fwd):
        comparison_plot(fwd, out_dir, report, "fa2_mma (bf16, tensor cores) vs torch SDPA flash and cuDNN",
                        ("fa2_mma tuned", "tuned_tflops"),
                        [("fa2_mma with FA2's fixed tiles", "fixed_tflops"), ("torch flash (FA2)", "torch_flash_tflops"),
                         ("torch cuDNN", "torch_cudnn_tflops")])
    for name, family in (("bwd_error_vs_torch.csv", "fa2_mma_bwd"), ("bwd_error_vs_torch_wgmma.csv", "fa2_wgmma_bwd")):
        err = os.path.join(src_dir, name)
        if not os.path.exists(err):
            continue
        erows = list(csv.DictReader(open(err)))
        worst = max(float(r["ratio"]) for r in erows) if erows else 0
        report.append(f"## Backward error on identical inputs: {family} vs torch SDPA flash\n\n"
                      f"`experiments/bwd_error_vs_torch.py` (`{name}`): the same q, k, v, dO files through `flashtune run "
                      "--inputs` and torch flash; relative L2 of dQ, dK, dV against float64 (the harness's reference and an "
                      f"independent torch float64 one agree). {sum(r['pass'] == '1' for r in erows)} of {len(erows)} "
                      f"gradients within 1.2x of torch flash; worst ratio {worst:.3f}.\n")
        report.append(md_table(erows, ["dtype", "seq", "head_dim", "causal", "gradient", "ours_harness_rel_l2",
                                       "torch_flash_rel_l2", "ratio"],
                               ["dtype", "S", "d", "causal", "gradient", "ours rel L2", "torch flash rel L2",
                                "ours / torch"]))
        report.append("")
    multi = os.path.join(src_dir, "multi_gpu_sweep.csv")
    if os.path.exists(multi):
        m = {r["metric"]: r["value"] for r in csv.DictReader(open(multi))}
        report.append("## One sweep over two GPUs of one host\n\n"
                      "`scripts/device_run.sh multi-gpu` (`experiments/multi_gpu_sweep.py`): the same exhaustive sweep "
                      "with `--devices 1`, then `--devices 0,1`, both from one compile cache, so the wall times are the "
                      f"GPU work. Speedup {m.get('speedup_2gpu_vs_1gpu')} (bar 1.8); same best configs: "
                      f"{m.get('same_best_configs')}; rows lost or doubled: {m.get('rows_lost_or_duplicated')}; "
                      f"fault sweep with a crash on one GPU complete: {m.get('fault_sweep_complete')}.\n")
        report.append(md_table([{"metric": k, "value": v} for k, v in m.items()], ["metric", "value"], ["metric", "value"]))
        report.append("")
    tuned_vs_default(rows, out_dir, report)
    landscape_part = []
    landscape_pngs = landscape(rows, out_dir, landscape_part)
    experiments_report.add_sections(db, out_dir, report, landscape_pngs)
    report += landscape_part
    with open(os.path.join(out_dir, "REPORT.md"), "w") as f:
        f.write("\n".join(report) + "\n")
    print(f"wrote {os.path.join(out_dir, 'REPORT.md')}")


if __name__ == "__main__":
    main()
