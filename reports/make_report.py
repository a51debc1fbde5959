#!/usr/bin/env python3
"""Build REPORT.md, its CSVs and PNG plots from stored data alone (no GPU): the SQLite results of
the sweeps (opened read-only) and the comparison CSVs the device runs wrote beside the store.

usage: make_report.py --db PATH [--out DIR] [--default FAMILY:K=V,... ...]
       make_report.py DIR            (the same as --db DIR/results.db --out DIR)
(`flashtune report --db PATH` runs it with every family's default configuration.)
REPORT.md names files relative to the output folder only, so regenerating it elsewhere changes nothing.
"""
import csv
import glob
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
import matplotlib.lines  # noqa: E402,F401
import matplotlib.ticker  # noqa: E402,F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiments_report  # noqa: E402
from experiments_report import fit_title, savefig  # noqa: E402

# Family defaults, the fixed configurations a tuner has to beat: passed in by `flashtune report`
# from the family descriptors (core/families/<family>.cpp), so they are written down once.
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
    for r in safe:
        one_median(r)
    return safe


def percentile(values, q):
    """The one median and spread (core/timing.hpp's timing::percentile, the worker's): percentile q of one set
    of samples, linear between the two nearest ranks (numpy's and torch.quantile's default)."""
    v = sorted(values)
    if not v:
        return 0.0
    pos = min(max(q, 0.0), 1.0) * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def one_median(r):
    """One median everywhere: percentile 0.5 of one set of timed repeats, beside the p20 and p80 of the same
    repeats (core/timing.hpp). A row the sweep re-timed in interleaved rounds (detail.retime) stores the pooled
    repeats' median, p20 and p80 (retime.pooled); one re-timed before that ("rounds" only) stored the median
    of its round medians beside the last round's p20/p80, two sets of samples: the report takes the median,
    p20 and p80 of the round medians (the samples it has, the same for all three) and scales TFLOP/s and
    GB/s to that median. A median still outside its p20-p80 has its spread left out."""
    d = experiments_report.json_object(r.get("detail"))
    retime = d.get("retime") if isinstance(d.get("retime"), dict) else {}
    rounds = [x for x in retime.get("rounds") or [] if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]
    if r["ms_median"] > 0 and rounds and "pooled" not in retime:
        m = percentile(rounds, 0.5)
        r["tflops"] *= r["ms_median"] / m
        r["gbps"] *= r["ms_median"] / m
        r["ms_median"], r["ms_p20"], r["ms_p80"] = m, percentile(rounds, 0.2), percentile(rounds, 0.8)
        r["samples"] = "round medians"
    experiments_report.spread_ok(r)
    return r


def bandwidth_bound(r):
    """Decode (a few query rows per head) reads K and V once and does little math: its figure is GB/s."""
    return "decode" in r["family"] or r["seq_q"] <= 16


def copy_peaks(db, src_dir):
    """device name -> device-to-device copy GB/s, measured on that device: the experiments' probes (the latest
    run) and any CSV beside the store with device and copy_gbps columns (their median)."""
    peaks, seen = {}, defaultdict(list)
    for run, _ in experiments_report.load(db):
        if run["probes"].get("copy_gbps"):
            peaks[str(run["device_name"])] = run["probes"]["copy_gbps"]
    for path in sorted(glob.glob(os.path.join(glob.escape(src_dir), "*.csv"))):
        for r in read_csv(path):
            try:
                v = float(r.get("copy_gbps") or 0)
            except ValueError:
                continue
            if v > 0 and r.get("device"):
                seen[r["device"]].append(v)
                COPY[(r["device"],) + csv_key(r)] = v  # a copy of this problem's bytes, measured beside it
    for dev, vs in seen.items():
        peaks.setdefault(dev, sorted(vs)[len(vs) // 2])
    return peaks


COPY = {}  # device name -> copy GB/s (copy_peaks)


def throughput(r, tflops=None, gbps=None):
    """TFLOP/s, or for a bandwidth-bound row GB/s and the % of the same device's copy."""
    tflops = r["tflops"] if tflops is None else tflops
    gbps = r["gbps"] if gbps is None else gbps
    if not bandwidth_bound(r) or not gbps:
        return f"{tflops:.1f} TFLOP/s"
    copy = COPY.get((str(r["device_name"]), r.get("direction") or "fwd", r["batch"], r["heads"], r["seq_q"],
                     r["seq_k"], r["head_dim"], r["dtype"], int(r["causal"]), r.get("heads_k") or r["heads"]),
                    COPY.get(str(r["device_name"])))
    return f"{gbps:.0f} GB/s" + (f" ({100 * gbps / copy:.0f}% of copy)" if copy else "")


def read_csv(path):
    try:
        with open(path, newline="") as f:  # a short row's missing cells read "", a long row's extra ones dropped
            return [{k: v or "" for k, v in r.items() if k is not None} for r in csv.DictReader(f)]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def gpu_of(rows):
    return ", ".join(sorted({experiments_report.plain(r["device_name"]) for r in rows})) or "unknown GPU"


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
        fit_title(ax, f"{gpu_of([r for r in rs if r['seq_q'] == smax])}: {family} {dtype} d={d}, S={smax}, "
                  "non-causal")
        pngs.append(savefig(fig, out_dir, f"landscape_{family}_{dtype}_d{d}.png"))
    if pngs:
        report.append("## Tuning landscape\n\nTFLOP/s over (BLOCK_M, BLOCK_N), best over the other tunables, "
                      "non-causal, largest sequence swept. Empty cells: pruned or not in the space.\n")
        report += [f"![{p}]({p})" for p in pngs]
        report.append("")
    return pngs


def tuned_vs_default(rows, out_dir, report):
    """Per problem, the best config against the family default on the same device; a bandwidth-bound family
    (decode) in GB/s and % of the device's copy; whiskers from both rows' p20-p80."""
    by_problem = defaultdict(dict)
    for r in rows:
        if ok(r):
            by_problem[(r["family"], str(r["device_name"]), r["batch"], r["heads"], r["seq_q"], r["seq_k"],
                        r["head_dim"], r["dtype"], r["causal"], inputs_of(r), r.get("varlen") or "",
                        r.get("heads_k") or r["heads"])][r["config"]] = r
    out = []
    for key, cfgs in sorted(by_problem.items()):
        family = key[0]
        default = cfgs.get(DEFAULTS.get(family, ""))
        best = max(cfgs.values(), key=lambda r: r["tflops"])
        if default is None:
            continue
        hk = best.get("heads_k") or best["heads"]
        lo = hi = ""
        if best["ms_p20"] and default["ms_p20"]:
            lo, hi = f"{default['ms_p20'] / best['ms_p80']:.3f}", f"{default['ms_p80'] / best['ms_p20']:.3f}"
        out.append(dict(family=family, device=best["device_name"],
                        problem=re.sub(r" varlen B\d+ .*", f" varlen max{best['seq_q']}", problem_label(best)) +
                        f" B{best['batch']} H{best['heads']}" + (f"/{hk}" if hk != best["heads"] else ""), batch=best["batch"], heads=best["heads"],
                        tuned_config=best["config"], tuned_tflops=f"{best['tflops']:.1f}",
                        default_config=default["config"], default_tflops=f"{default['tflops']:.1f}",
                        speedup=f"{best['tflops'] / default['tflops']:.2f}", speedup_p20=lo, speedup_p80=hi,
                        tuned_gbps=f"{best['gbps']:.1f}", default_gbps=f"{default['gbps']:.1f}",
                        tuned=throughput(best), default=throughput(default), bandwidth_bound=bandwidth_bound(best)))
    if not out:
        return
    write_csv(os.path.join(out_dir, "tuned_vs_default.csv"), out,
              [k for k in out[0] if k not in ("tuned", "default", "bandwidth_bound")])
    report.append("## Tuned config vs the family default\n")
    report.append("Speedup = default / tuned median time on the same device (the same ratio in TFLOP/s or GB/s); "
                  "its p20-p80: default p20 / tuned p80 to default p80 / tuned p20. Bandwidth-bound rows (decode) "
                  "are in GB/s and % of the device's copy.\n")
    report.append(md_table(out, ["family", "device", "problem", "tuned_config", "tuned", "default_config", "default",
                                 "speedup", "speedup_p20", "speedup_p80"],
                           ["family", "GPU", "problem", "tuned", "throughput", "default", "throughput", "speedup",
                            "p20", "p80"]))
    for family in sorted({r["family"] for r in out}):
        rows = [r for r in out if r["family"] == family]
        gbps = all(r["bandwidth_bound"] for r in rows)
        gpus = sorted({experiments_report.plain(r["device"]) for r in rows})
        fig, ax = plt.subplots(figsize=(9, 1.4 + 0.3 * len(rows)))
        x = [float(r["speedup"]) for r in rows]
        err = [[max(0.0, v - float(r["speedup_p20"] or v)) for v, r in zip(x, rows)],
               [max(0.0, float(r["speedup_p80"] or v) - v) for v, r in zip(x, rows)]]
        ax.barh(range(len(rows)), x, color="tab:green", xerr=err, error_kw=dict(lw=0.7, capsize=2))
        ax.axvline(1.0, color="black", lw=0.8)
        labels = [(f"{experiments_report.plain(r['device'], 24)}: " if len(gpus) > 1 else "") + r["problem"]
                  for r in rows]
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        if gbps:  # each bar names its GB/s and % of copy
            for i, r in enumerate(rows):
                ax.text(0.02, i, f"{r['tuned']}", va="center", fontsize=7, color="white",
                        transform=ax.get_yaxis_transform())
        ax.invert_yaxis()
        ax.set_xlabel(f"tuned / default {'GB/s' if gbps else 'TFLOP/s'} (1 = no gain)")
        fit_title(ax, f"{', '.join(gpus)}: {family}, tuned vs default {DEFAULTS[family]} (whiskers p20-p80)")
        name = savefig(fig, out_dir, f"tuned_vs_default_{family}.png")
        report.append(f"\n![{name}]({name})")
    report.append("")


# Peer columns of the comparison CSVs -> the impl name their own timing CSVs (sdpa_*.csv) carry.
PEERS = {"torch_flash": "torch_sdpa_flash", "flash": "torch_sdpa_flash", "torch_cudnn": "torch_sdpa_cudnn",
         "cudnn": "torch_sdpa_cudnn", "torch_sdpa_efficient": "torch_sdpa_efficient",
         "torch_efficient": "torch_sdpa_efficient", "torch_math": "torch_sdpa_math", "fa4": "fa4"}
SPREADS = {}  # (impl or config, shape...) -> the row whose p20-p80 gives a CSV figure its spread


def csv_key(r, direction="fwd"):
    """A comparison CSV row's problem, as the store and the peers' timing CSVs key it."""
    def i(k, *alt):
        for c in (k,) + alt:
            try:
                return int(float(r[c]))
            except (KeyError, TypeError, ValueError):
                pass
        return None
    seq = i("seq", "seq_q")
    heads = i("heads", "heads_q")
    return (r.get("direction") or direction, i("batch"), heads, seq, i("seq_k") or seq, i("head_dim"),
            r.get("dtype") or "", int(r.get("causal") in ("1", "True", "true")), i("heads_k") or heads)


def load_spreads(rows, src_dir):
    for r in rows:  # ours, from the store (the latest row of a config on a problem)
        if ok(r) and not r.get("varlen") and r["ms_p20"]:
            SPREADS[(r["config"], r.get("direction") or "fwd", r["batch"], r["heads"], r["seq_q"], r["seq_k"],
                     r["head_dim"], r["dtype"], r["causal"], r.get("heads_k") or r["heads"])] = r
    for path in sorted(glob.glob(os.path.join(glob.escape(src_dir), "*.csv"))):
        for r in read_csv(path):  # the peers' own timing CSVs: impl, ms_median, ms_p20, ms_p80
            if r.get("impl") and r.get("status", "ok") == "ok":
                try:
                    t = dict(ms_median=float(r["ms_median"]), ms_p20=float(r["ms_p20"]), ms_p80=float(r["ms_p80"]))
                except (KeyError, TypeError, ValueError):
                    continue
                if experiments_report.spread_ok(t):
                    SPREADS[(r["impl"],) + csv_key(r)] = t


def spread_of(name, r, direction):
    """(low, high) factors of a throughput measured at the median, from the matching row's p20-p80, or None."""
    if "lengths" in r or "varlen" in r and r.get("varlen"):
        return None
    t = SPREADS.get((name,) + csv_key(r, direction))
    return (t["ms_median"] / t["ms_p80"], t["ms_median"] / t["ms_p20"]) if t else None


def point_label(r, direction=""):
    k = csv_key(r, direction or "fwd")
    hk = f"/{k[8]}" if k[8] != k[2] else ""
    seq = f"S{k[3]}" if k[3] == k[4] else f"Sq{k[3]} Sk{k[4]}"
    if "lengths" in r:
        seq = f"varlen max{r.get('max_len', '')}"
        k = k[:1] + (r.get("sequences", ""),) + k[2:]
    return (f"{direction} " if direction else "") + f"d{k[5]} {seq} B{k[1]} H{k[2]}{hk}" + (" causal" if k[7] else "")


def comparison_plot(csv_path, out_dir, report, title, ours, baselines, gpu):
    rows = read_csv(csv_path)
    if not rows:
        return
    direction = "bwd" if "bwd" in os.path.basename(csv_path) else "fwd"
    labels = [point_label(r) for r in rows]
    series = [(name, col) for name, col in [ours] + baselines if col in rows[0]]
    fig, ax = plt.subplots(figsize=(min(16, max(8, 0.3 * len(rows) * len(series))), 5.5))
    width = 0.8 / len(series)
    for i, (name, col) in enumerate(series):
        ys, lo, hi = [], [], []
        for r in rows:
            y = float(r.get(col) or 0)
            cfg = r.get("tuned_config") or r.get("config") or ""
            f = spread_of(cfg if col == ours[1] else PEERS.get(col[:-len("_tflops")], ""), r, direction) or (1, 1)
            ys.append(y)
            lo.append(y - y * f[0])
            hi.append(y * f[1] - y)
        ax.bar([x + i * width for x in range(len(rows))], ys, width, label=name, yerr=[lo, hi],
               error_kw=dict(lw=0.6, capsize=1))
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (FA convention, causal counts half)")
    fit_title(ax, f"{gpu}: {title}; whiskers p20-p80 where measured")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    name = savefig(fig, out_dir, os.path.splitext(os.path.basename(csv_path))[0] + ".png")
    report.append(f"## {title}\n\nFrom `{os.path.basename(csv_path)}` (one device run, one GPU: {gpu}).\n")
    report.append(md_table(rows, list(rows[0].keys())))
    report.append(f"\n![{name}]({name})\n")


# Peers by one name each (the CSVs name torch's flash backend "flash" or "torch_flash", and so on).
PEER_NAMES = {"torch_flash": "torch SDPA flash", "flash": "torch SDPA flash", "torch_cudnn": "cuDNN (torch SDPA)",
              "cudnn": "cuDNN (torch SDPA)", "torch_sdpa_efficient": "torch SDPA efficient",
              "torch_efficient": "torch SDPA efficient", "torch_math": "torch SDPA math", "fa4": "FlashAttention-4"}
PEER_COLORS = {"FlashAttention-4": "#1f77b4", "cuDNN (torch SDPA)": "#9467bd", "torch SDPA flash": "#ff7f0e",
               "torch SDPA efficient": "#2ca02c", "torch SDPA math": "#7f7f7f"}


def family_of_config(config):
    """The family whose default configuration has the same tunables as `config` (a CSV without a family
    column), or ""."""
    keys = set(params(config))
    found = [f for f, d in sorted(DEFAULTS.items()) if keys and set(params(d)) == keys]
    return found[0] if len(found) == 1 else ""


def peer_points(src_dir, store_gpu):
    """Every (GPU, source, point, peer, ratio, low, high) of the comparison CSVs beside the store: ours / peer
    throughput (> 1: ours faster), low-high from both sides' p20-p80 where their rows are found."""
    pts = []
    paths = sorted(set(glob.glob(os.path.join(glob.escape(src_dir), "*_vs_peers.csv")) +
                       glob.glob(os.path.join(glob.escape(src_dir), "*_vs_sdpa*.csv"))))
    for path in paths:
        rows = read_csv(path)
        if not rows:
            continue
        cols = rows[0].keys()
        unit = "gbps" if "tuned_gbps" in cols else "tflops"
        ours = f"tuned_{unit}" if f"tuned_{unit}" in cols else unit
        peers = [c for c in cols if c.endswith("_" + unit) and c[:-len(unit) - 1] in PEERS]
        if ours not in cols or not peers:
            continue
        source = os.path.splitext(os.path.basename(path))[0]
        direction = "bwd" if "bwd" in source else "fwd"
        for r in rows:
            if r.get("tuned_status", "ok") != "ok":
                continue
            try:
                o = float(r[ours] or 0)
            except ValueError:
                continue
            fo = spread_of(r.get("tuned_config") or r.get("config") or "", r, direction)
            family = r.get("tuned_family") or r.get("family") or family_of_config(r.get("tuned_config") or "")
            for c in peers:
                try:
                    p = float(r[c] or 0)
                except ValueError:
                    continue
                if o <= 0 or p <= 0:
                    continue
                fp = spread_of(PEERS[c[:-len(unit) - 1]], r, direction)
                lo = o * (fo[0] if fo else 1) / (p * (fp[1] if fp else 1))
                hi = o * (fo[1] if fo else 1) / (p * (fp[0] if fp else 1))
                pts.append(dict(gpu=experiments_report.plain(r.get("device") or store_gpu), source=source,
                                family=experiments_report.plain(family, 32),
                                point=point_label(r), direction=r.get("direction") or direction,
                                peer=PEER_NAMES[c[:-len(unit) - 1]], unit="GB/s" if unit == "gbps" else "TFLOP/s",
                                ratio=o / p, low=lo, high=hi, spread=bool(fo and fp)))
    return pts


def ratio_ticks(ax, lo, hi):
    """Plain tick labels on a log ratio axis, from a fixed ladder, at least 3 of them within [lo, hi]."""
    ladder = [0.1, 0.2, 0.25, 0.5, 0.67, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 10, 20, 50, 100, 200]
    lo, hi = min(lo, 0.95), max(hi, 1.05)
    ax.set_ylim(lo / 1.08, hi * 1.08)
    ticks = [t for t in ladder if lo / 1.08 <= t <= hi * 1.08]
    if len(ticks) < 3:  # a narrow range: a finer ladder
        ticks = [t for t in (0.8, 0.85, 0.9, 0.95, 1, 1.05, 1.1, 1.15, 1.2, 1.25) if lo / 1.08 <= t <= hi * 1.08]
    while len(ticks) > 7:  # every other one, keeping 1
        ticks = [t for i, t in enumerate(ticks) if t == 1 or i % 2 == ticks.index(1) % 2]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def summary(src_dir, store_gpu, out_dir, report):
    """One figure per GPU: a panel per comparison CSV, ours / each peer per point (log), whiskers from both
    sides' p20-p80 where the rows are found (hollow marker: no spread stored); a table of the same per source."""
    pts = peer_points(src_dir, store_gpu)
    if not pts:
        return
    report.append("## Summary: ours vs each peer\n\nOurs / peer throughput per point (> 1: ours faster), from "
                  "the comparison CSVs beside the store (TFLOP/s, or GB/s for decode); whiskers span ours p20-p80 "
                  "against the peer's where both rows are found (the store, the peers' timing CSVs), a hollow marker "
                  "where one side's spread is not stored. Each CSV is one device run; a later run of the same points "
                  "(fwd_hopper after fwd_fa3_sample) supersedes the earlier one.\n")
    srows = []
    groups = defaultdict(list)
    for p in pts:
        groups[(p["gpu"], p["source"], p["peer"])].append(p)
    for (gpu, source, peer), ps in sorted(groups.items()):
        rs = sorted(p["ratio"] for p in ps)
        srows.append(dict(gpu=gpu, source=source, peer=peer, points=len(ps), faster=sum(x > 1 for x in rs),
                          geomean=f"{math.exp(sum(map(math.log, rs)) / len(rs)):.3f}", min=f"{rs[0]:.3f}",
                          max=f"{rs[-1]:.3f}", spread=sum(p["spread"] for p in ps)))
    report.append(md_table(srows, ["gpu", "source", "peer", "points", "faster", "geomean", "min", "max", "spread"],
                           ["GPU", "source", "peer", "points", "ours faster", "geomean ours/peer", "min", "max",
                            "with p20-p80"]))
    used = set()
    for gpu in sorted({p["gpu"] for p in pts}):
        gp = [p for p in pts if p["gpu"] == gpu]
        sources = list(dict.fromkeys(p["source"] for p in gp))
        ncol = 2 if len(sources) > 1 else 1
        nrow = (len(sources) + ncol - 1) // ncol
        fig, axes = plt.subplots(nrow, ncol, figsize=(7.5 * ncol, 3.3 * nrow + 1.0), squeeze=False)
        peers_seen = []
        for ax, source in zip(axes.flat, sources):
            sp = [p for p in gp if p["source"] == source]
            if len({p["direction"] for p in sp}) > 1:  # a CSV of both directions: each label names its own
                sp = [dict(p, point=f"{p['direction']} {p['point']}") for p in sp]
            points = list(dict.fromkeys(p["point"] for p in sp))
            peers = list(dict.fromkeys(p["peer"] for p in sp))
            for j, peer in enumerate(peers):
                peers_seen += [peer] if peer not in peers_seen else []
                off = (j - (len(peers) - 1) / 2) * min(0.22, 0.8 / len(peers))
                for spread in (True, False):
                    ps = [p for p in sp if p["peer"] == peer and p["spread"] == spread]
                    if not ps:
                        continue
                    xs = [points.index(p["point"]) + off for p in ps]
                    ys = [p["ratio"] for p in ps]
                    c = PEER_COLORS.get(peer)
                    ax.errorbar(xs, ys, yerr=[[max(0.0, y - p["low"]) for y, p in zip(ys, ps)],
                                              [max(0.0, p["high"] - y) for y, p in zip(ys, ps)]],
                                fmt="o", ms=3.5, lw=0.8, capsize=1.5, color=c, mfc=c if spread else "white")
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_yscale("log")
            ratio_ticks(ax, min(p["low"] for p in sp), max(p["high"] for p in sp))
            ax.set_xticks(range(len(points)), points, rotation=55, ha="right", fontsize=6)
            ax.set_xlim(-0.6, len(points) - 0.4)
            ax.set_ylabel("ours / peer (log)", fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(axis="y", alpha=0.3)
            fams = ", ".join(sorted({p["family"] for p in sp if p["family"]}))
            fit_title(ax, f"{gpu}: {source} ({fams}; {sp[0]['unit']})", fontsize=8)
        for ax in list(axes.flat)[len(sources):]:
            ax.axis("off")
        handles = [matplotlib.lines.Line2D([], [], marker="o", ls="none", color=PEER_COLORS.get(p), label=f"vs {p}")
                   for p in peers_seen]
        handles.append(matplotlib.lines.Line2D([], [], marker="o", ls="none", color="black", mfc="white",
                                               label="hollow: a side's p20-p80 not stored"))
        fig.suptitle(f"{gpu}: ours / peer throughput per point (> 1: ours faster; whiskers p20-p80)", fontsize=11)
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
        fig.summary_legend = True
        slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")[:64] or "gpu"
        while slug in used:
            slug += "_"
        used.add(slug)
        name = savefig(fig, out_dir, f"summary_{slug}.png")
        report.append(f"\n![{name}]({name})")
    report.append("")


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
    gpu = gpu_of(rows)
    COPY.update(copy_peaks(db, src_dir))
    load_spreads(rows, src_dir)
    report.append("Timing: one median everywhere (core/timing.hpp): percentile 0.5 of one set of timed repeats (CUDA "
                  "events, an L2 flush before each), beside the p20 and p80 of the same repeats, so a median always "
                  "lies within its p20-p80. A row the sweep re-timed in interleaved rounds pools the repeats of all "
                  "its rounds; one an older sweep re-timed (the median of its round medians stored beside the last "
                  "round's p20/p80) is shown with the median, p20 and p80 of its round medians (\"samples\": round "
                  "medians), its TFLOP/s and GB/s at that median. Bandwidth-bound rows (decode) are in GB/s and % of "
                  "the device's copy.\n")
    summary(src_dir, gpu, out_dir, report)
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
        r["tflops_s"] = throughput(r)
        r["ms"] = f"{r['ms_median']:.3f}"
        r["spread"] = f"{r['ms_p20']:.3f}-{r['ms_p80']:.3f}" if r["ms_p20"] else "-"
        r["samples"] = r.get("samples") or "repeats"
        r["err"] = f"{r['max_abs']:.1e}"
    write_csv(os.path.join(out_dir, "best.csv"), best,
              ["device_name", "family", "batch", "heads", "seq_q", "seq_k", "head_dim", "dtype", "causal", "config",
               "ms_median", "ms_p20", "ms_p80", "tflops", "gbps", "max_abs", "max_rel", "mse"])
    report.append("## Best valid config per problem\n")
    report.append(md_table(best, ["family", "problem", "batch", "heads", "config", "ms", "spread", "samples", "tflops_s",
                                  "err"],
                           ["family", "problem", "B", "H", "config", "median ms", "p20-p80 ms", "samples", "throughput",
                            "max abs err"]))
    report.append("")

    simt = os.path.join(src_dir, "fa2_simt_vs_sdpa.csv")
    if os.path.exists(simt):
        comparison_plot(simt, out_dir, report, "fa2_simt (fp32, CUDA cores) vs torch SDPA efficient (fp32)",
                        ("fa2_simt tuned", "tflops"), [("torch SDPA efficient", "torch_sdpa_efficient_tflops")], gpu)
    bwd32 = os.path.join(src_dir, "bwd_vs_sdpa_fp32.csv")
    if os.path.exists(bwd32):
        comparison_plot(bwd32, out_dir, report, "fa2_simt_bwd (fp32 backward) vs torch SDPA efficient backward",
                        ("fa2_simt_bwd tuned", "tflops"), [("torch SDPA efficient", "torch_sdpa_efficient_tflops")], gpu)
    for name, title in (
            ("bwd_vs_sdpa.csv",
             "bf16 backward, best of fa2_wgmma_bwd and fa2_mma_bwd (tuned_family), vs torch SDPA flash and cuDNN"),
            ("bwd_vs_sdpa_d256.csv",
             "bf16 backward at d = 256, re-measured after a kernel change, vs torch SDPA flash and cuDNN")):
        bwd = os.path.join(src_dir, name)
        if os.path.exists(bwd):
            comparison_plot(bwd, out_dir, report, title, ("ours tuned", "tuned_tflops"),
                            [("torch flash (FA2)", "torch_flash_tflops"), ("torch cuDNN", "torch_cudnn_tflops")], gpu)
    fwd = os.path.join(src_dir, "fwd_vs_sdpa.csv")
    if os.path.exists(fwd):
        comparison_plot(fwd, out_dir, report, "fa2_mma (bf16, tensor cores) vs torch SDPA flash and cuDNN",
                        ("fa2_mma tuned", "tuned_tflops"),
                        [("fa2_mma with FA2's fixed tiles", "fixed_tflops"), ("torch flash (FA2)", "torch_flash_tflops"),
                         ("torch cuDNN", "torch_cudnn_tflops")], gpu)
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
        four = (f" Four GPUs (`--devices 0,1,2,3`): speedup {m['speedup_4gpu_vs_1gpu']} (bar 3.5); rows lost or "
                f"doubled: {m.get('rows_lost_or_duplicated_4gpu')}." if "speedup_4gpu_vs_1gpu" in m else "")
        report.append("## One sweep over several GPUs of one host\n\n"
                      "`scripts/device_run.sh multi-gpu` (`experiments/multi_gpu_sweep.py`): the same exhaustive sweep "
                      "with `--devices 1`, then `--devices 0,1`, all from one compile cache, so the wall times are the "
                      f"GPU work. Speedup {m.get('speedup_2gpu_vs_1gpu')} (bar 1.85); same best configs: "
                      f"{m.get('same_best_configs')}; rows lost or doubled: {m.get('rows_lost_or_duplicated')}; "
                      f"fault sweep with a crash on one GPU complete: {m.get('fault_sweep_complete')}.{four}\n")
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
