"""Experiment sections of REPORT.md: the latest run of each experiment in results.db
(`flashtune experiment experiments/<name>.json`), one CSV per experiment with the derived
metrics, and its plots. Imported by make_report.py; needs no GPU.

Derived per row, from rows and probes of the same run only:
  pct_matmul_peak  TFLOP/s / the cuBLAS GEMM TFLOP/s measured for the row's dtype (fp32: no TF32)
  pct_copy_peak    GB/s (the problem's minimum bytes) / the device-to-device copy GB/s
  speedup_vs_cpu   PyTorch CPU (fp32) median / this median, same shape and direction
  speedup_vs_torch_flash  torch SDPA flash median / this median, same problem (half precision only)
"""
import csv
import json
import math
import os
import pathlib
import re
import sqlite3
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIELDS = ["impl", "family", "config", "direction", "dtype", "batch", "heads", "seq_q", "seq_k", "head_dim", "causal",
          "status", "error", "ms_median", "ms_p20", "ms_p80", "reps", "tflops", "gbps", "pct_matmul_peak",
          "pct_copy_peak", "speedup_vs_cpu", "speedup_vs_torch_flash", "max_abs", "mean_abs", "mse", "max_rel",
          "peak_mib", "device"]
PEAK_KEY = {"fp32": "matmul_fp32_tflops", "bf16": "matmul_bf16_tflops", "fp16": "matmul_fp16_tflops"}
# One colour per implementation across every plot.
COLORS = {"naive": "#7f7f7f", "fa1_simt": "#bcbd22", "fa2_simt": "#1f77b4", "fa2_mma": "#d62728",
          "fa2_simt_bwd": "#1f77b4", "fa2_mma_bwd": "#d62728", "cublas_unfused": "#8c564b", "torch_math": "#e377c2",
          "torch_efficient": "#2ca02c", "torch_flash": "#ff7f0e", "torch_cudnn": "#9467bd", "torch_cpu": "#17becf",
          "triton": "#000000"}


def color(impl):
    return COLORS.get(impl.split(":")[0], None)


def connect_ro(db):
    """The store opened read-only: a report never writes to it (no WAL switch, no schema change). A store
    whose -wal is missing or empty holds everything in its file: opened immutable (as `flashtune` does), so
    a read-only folder works and no -wal/-shm is left beside it."""
    with open(db, "rb") as f:
        wal_mode = f.read(20)[18:20] == b"\x02\x02"
    wal = db + "-wal"
    quiet = not os.path.lexists(wal) and wal_mode or os.path.lexists(wal) and os.path.getsize(wal) == 0
    return sqlite3.connect(pathlib.Path(db).absolute().as_uri() + ("?immutable=1" if quiet else "?mode=ro"), uri=True)


def md_text(value):
    """A stored string as Markdown text: one line, no HTML, no table cell break, no heading or link syntax."""
    s = "".join(c if c.isprintable() else " " for c in str(value))
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for c in "\\`[]|":  # code spans, links and images, table cells
        s = s.replace(c, "\\" + c)
    return "\\" + s if s.startswith(("#", "-", "+", ">", "=")) else s  # never a heading or a list


def plain(value, limit=80):
    """A stored string as plot text: printable characters only, at most `limit` of them."""
    return "".join(c if c.isprintable() else " " for c in str(value))[:limit]


NUMBERS = ("ms_median", "ms_p20", "ms_p80", "tflops", "gbps", "max_abs", "max_rel", "mse", "mean_abs", "peak_bytes")


def clean_numbers(r):
    """NULL, text or non-finite figures read as 0 (a row of another tool's making must not end the report)."""
    for k in NUMBERS:
        if k in r:
            try:
                v = float(r[k])
            except (TypeError, ValueError):
                v = 0.0
            r[k] = v if math.isfinite(v) else 0.0
    return r


def json_object(text):
    try:
        v = json.loads(text or "{}")
    except (ValueError, TypeError):
        return {}
    return v if isinstance(v, dict) else {}


def load(db):
    """[(run, rows)] for the latest run of each experiment, in the order experiments were first run."""
    con = connect_ro(db)
    con.row_factory = sqlite3.Row
    if not con.execute("select 1 from sqlite_master where type='table' and name='experiment_runs'").fetchone():
        return []
    latest = {}
    for r in con.execute("select * from experiment_runs order by id"):
        if isinstance(r["experiment"], str) and re.fullmatch(r"[a-z0-9_]{1,64}", r["experiment"]):  # file names
            latest[r["experiment"]] = dict(r)
    out = []
    for run in sorted(latest.values(), key=lambda r: r["id"]):
        rows = [clean_numbers(dict(x)) for x in con.execute("select * from experiment_rows where run_id=? order by id",
                                                            (run["id"],))]
        run["probes"] = {k: v for k, v in json_object(run["probes"]).items()
                         if isinstance(v, (int, float)) and math.isfinite(v)}
        run["spec"] = json_object(run["spec"])
        out.append((run, rows))
    con.close()
    return out


def shape_key(r):
    return (r["direction"], r["batch"], r["heads"], r["seq_q"], r["seq_k"], r["head_dim"], r["causal"])


def shape_label(r):
    s = f"S{r['seq_q']}" if r["seq_q"] == r["seq_k"] else f"Sq{r['seq_q']} Sk{r['seq_k']}"
    return f"B{r['batch']} H{r['heads']} {s} d{r['head_dim']}" + (" causal" if r["causal"] else "")


def derive(run, rows):
    """Adds the derived metrics (see the module docstring) to every row, in place."""
    probes = run["probes"]
    cpu = {shape_key(r): r for r in rows if r["impl"] == "torch_cpu" and r["status"] == "ok"}
    flash = {(shape_key(r), r["dtype"]): r for r in rows if r["impl"] == "torch_flash" and r["status"] == "ok"}
    for r in rows:
        ok = r["status"] == "ok" and r["ms_median"] > 0
        peak = probes.get(PEAK_KEY.get(r["dtype"], ""), 0)
        r["pct_matmul_peak"] = f"{100 * r['tflops'] / peak:.1f}" if ok and peak else ""
        copy = probes.get("copy_gbps", 0)
        r["pct_copy_peak"] = f"{100 * r['gbps'] / copy:.1f}" if ok and copy else ""
        c = cpu.get(shape_key(r))
        r["speedup_vs_cpu"] = f"{c['ms_median'] / r['ms_median']:.1f}" if ok and c and r["impl"] != "torch_cpu" else ""
        f = flash.get((shape_key(r), r["dtype"]))
        r["speedup_vs_torch_flash"] = f"{f['ms_median'] / r['ms_median']:.3f}" if ok and f else ""
        r["peak_mib"] = f"{r['peak_bytes'] / 2**20:.1f}" if r["peak_bytes"] else ""
    return rows


def pivot_table(rows, value, label="TFLOP/s"):
    """Markdown: one line per (dtype, shape), one column per implementation; non-ok cells show the status."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cells, order = {}, []
    for r in rows:
        k = (r["dtype"], shape_label(r))
        if k not in cells:
            cells[k] = {}
            order.append(k)
        cells[k][r["impl"]] = value(r) if r["status"] == "ok" else r["status"]
    out = [f"| dtype | problem | " + " | ".join(map(md_text, impls)) + " |", "|---|---|" + "---|" * len(impls),
           *[f"| {md_text(k[0])} | {k[1]} | " + " | ".join(md_text(cells[k].get(i, "")) for i in impls) + " |"
             for k in order]]
    return f"{label}; a cell that is not a number is the row's status.\n\n" + "\n".join(out)


def spread_ok(r):
    """One median everywhere: the harness's, percentile 0.5 of the timed repeats, which always lies within the
    same repeats' p20-p80. A row whose stored median is outside its own p20-p80 (another definition) has its
    spread left out (0) rather than printed beside a median it does not belong to."""
    med, lo, hi = r.get("ms_median", 0), r.get("ms_p20", 0), r.get("ms_p80", 0)
    if not (med > 0 and 0 < lo <= med <= hi):
        r["ms_p20"] = r["ms_p80"] = 0.0
        return False
    return True


def throughput_err(value, r):
    """(below, above) of a throughput `value` measured with row r's median time, from r's p20-p80 time spread."""
    if not spread_ok(dict(r)) or not value:
        return 0.0, 0.0
    return value - value * r["ms_median"] / r["ms_p80"], value * r["ms_median"] / r["ms_p20"] - value


def fit_title(ax, text, fontsize=9):
    """A title wrapped to its axes' width, so that none is cut off (savefig checks it, after tight_layout)."""
    ax.fit_title_text = str(text)
    width_in = ax.figure.get_figwidth() * ax.get_position().width
    chars = max(24, int(width_in * 72 / (0.6 * fontsize)))
    ax.set_title("\n".join(wrap_text(str(text), chars)), fontsize=fontsize)


def wrap_text(text, chars):
    """Lines of at most `chars`, broken after a space or a comma (a config's K=V list breaks between its
    fields), a longer token cut."""
    lines, cur = [], ""
    for tok in re.split(r"(?<=[ ,])", text):
        while len(tok) > chars:
            if cur:
                lines.append(cur.rstrip())
                cur = ""
            lines.append(tok[:chars])
            tok = tok[chars:]
        if len(cur) + len(tok.rstrip()) > chars and cur:
            lines.append(cur.rstrip())
            cur = ""
        cur += tok
    if cur.strip():
        lines.append(cur.rstrip())
    return lines


def plain_log_ticks(axis):
    """Log-axis tick labels as plain numbers (math text is off: stored names are not TeX)."""
    from matplotlib.ticker import FuncFormatter
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def savefig(fig, out_dir, name):
    """Saves a laid-out figure; its titles ride in the PNG's Title text, and a title, label or legend that
    falls outside the image is reported on stderr ("cut off"), which the report test treats as a failure."""
    # A figure legend below the axes (the summary) keeps a strip at the bottom; a suptitle one at the top.
    rect = (0, 0.05 if getattr(fig, "summary_legend", False) else 0, 1, 1)
    fig.tight_layout(rect=rect)
    for ax in fig.axes:  # wrapped again to the axes' width after layout, and laid out again
        if getattr(ax, "fit_title_text", None):
            fit_title(ax, ax.fit_title_text, ax.title.get_fontsize())
    fig.tight_layout(rect=rect)
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    for ax in fig.axes:
        e = ax.get_tightbbox(renderer)
        if e is not None and (e.x0 < box.x0 - 2 or e.x1 > box.x1 + 2 or e.y0 < box.y0 - 2 or e.y1 > box.y1 + 2):
            print(f"make_report: {name}: a title, label or legend is cut off", file=sys.stderr)
    for t in [fig._suptitle] + fig.legends if fig._suptitle else fig.legends:
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 2 or e.x1 > box.x1 + 2 or e.y0 < box.y0 - 2 or e.y1 > box.y1 + 2:
            print(f"make_report: {name}: a title, label or legend is cut off", file=sys.stderr)
    titles = ([fig._suptitle.get_text()] if fig._suptitle else []) + \
        [ax.get_title().replace("\n", " ") for ax in fig.axes if ax.get_title()]
    fig.savefig(os.path.join(out_dir, name), dpi=110, metadata={"Title": " | ".join(titles)})
    plt.close(fig)
    return name


def bars(rows, out_dir, name, title, ylabel, value, log=True, gpu=""):
    """Grouped bars: x = shape, one bar per implementation, one panel per dtype; whiskers: p20-p80."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(13, 4.2 * len(dtypes)), squeeze=False)
    for ax, dt in zip(axes[:, 0], dtypes):
        rs = [r for r in rows if r["dtype"] == dt]
        shapes = list(dict.fromkeys(shape_label(r) for r in rs))
        impls = list(dict.fromkeys(r["impl"] for r in rs if r["status"] == "ok"))  # no empty legend entries
        w = 0.85 / max(1, len(impls))
        for i, impl in enumerate(impls):
            got = {shape_label(r): (value(r), r) for r in rs if r["impl"] == impl and r["status"] == "ok"}
            xs = [x + i * w for x, s in enumerate(shapes) if s in got]
            ys = [got[s][0] for s in shapes if s in got]
            errs = [throughput_err(got[s][0], got[s][1]) for s in shapes if s in got]
            ax.bar(xs, ys, w, label=impl, color=color(impl), yerr=[[e[0] for e in errs], [e[1] for e in errs]],
                   error_kw=dict(lw=0.6, capsize=1))
        ax.set_xticks([x + 0.425 - w / 2 for x in range(len(shapes))], shapes, rotation=30, ha="right", fontsize=8)
        if log:
            ax.set_yscale("log")
            plain_log_ticks(ax.yaxis)
        ax.set_ylabel(ylabel)
        fit_title(ax, f"{gpu}: {title} ({dt}); whiskers p20-p80", fontsize=10)
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return savefig(fig, out_dir, name)


def lines(rows, out_dir, name, title, xkey, xlabel, panels, logx=True, hline=None, gpu="", band=None):
    """Lines over xkey, one per implementation; panels = [(ylabel, value fn, log y)], a row per dtype;
    band(r) -> (low, high) shades the first panel's p20-p80 where rows have it.
    Points whose row is oom/skipped are marked at the bottom of the first panel with their status."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(len(dtypes), len(panels), figsize=(6.2 * len(panels), 4.3 * len(dtypes)), squeeze=False)
    for row_axes, dt in zip(axes, dtypes):
        rs = [r for r in rows if r["dtype"] == dt]
        impls = list(dict.fromkeys(r["impl"] for r in rs))
        for ax, (ylabel, value, logy) in zip(row_axes, panels):
            for impl in impls:
                pts = sorted((r[xkey], value(r)) for r in rs if r["impl"] == impl and r["status"] == "ok" and value(r))
                if pts:
                    line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                                    color=color(impl))
                    bs = sorted((r[xkey],) + band(r) for r in rs if band and ax is row_axes[0] and r["impl"] == impl
                                and r["status"] == "ok" and value(r) and spread_ok(dict(r)))
                    if bs:
                        ax.fill_between([b[0] for b in bs], [b[1] for b in bs], [b[2] for b in bs], alpha=0.2,
                                        color=line.get_color(), lw=0)
                fails = sorted(r[xkey] for r in rs if r["impl"] == impl and r["status"] in ("oom", "skipped"))
                if fails and ax is row_axes[0] and pts:
                    ax.plot(fails, [pts[-1][1]] * len(fails), marker="x", ls="none", color=color(impl))
            if hline and ax is row_axes[-1]:
                ax.axhline(hline[0], color="red", lw=0.8, ls="--", label=hline[1])
            if logx:
                ax.set_xscale("log", base=2)
                plain_log_ticks(ax.xaxis)
            if logy:
                ax.set_yscale("log")
                plain_log_ticks(ax.yaxis)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            fit_title(ax, f"{gpu}: {title} ({dt})" + ("; band p20-p80" if band and ax is row_axes[0] else ""),
                      fontsize=10)
            ax.grid(alpha=0.3, which="both")
        row_axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return savefig(fig, out_dir, name)


def num(s):
    return float(s) if s not in ("", None) else 0.0


def section(run, rows, out_dir, report, landscape_pngs):
    name = run["experiment"]
    if not rows:
        report.append(f"## Experiment: {md_text(run['title'])}\n\nRun {run['id']} stored no rows.\n")
        return
    spec = run["spec"]
    gpu = plain(run["device_name"])
    for r in rows:
        spread_ok(r)
    derive(run, rows)
    csv_name = f"exp_{name}.csv"
    with open(os.path.join(out_dir, csv_name), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    probes = run["probes"]
    status = defaultdict(int)
    for r in rows:
        status[r["status"]] += 1
    report.append(f"## Experiment: {md_text(run['title'])}\n")
    if spec.get("description"):
        report.append(md_text(spec["description"]) + "\n")
    report.append(f"`flashtune experiment experiments/{name}.json`, run {run['id']} on {md_text(run['device_name'])}, "
                  f"{md_text(run['created'])}: {len(rows)} rows (" + ", ".join(f"{n} {s}" for s, n in sorted(status.items())) +
                  f"). Every row: [`{csv_name}`]({csv_name}).")
    peaks = [(k, v) for k, v in sorted(probes.items()) if k.endswith(("_tflops", "_gbps"))]
    if peaks:
        report.append("Peaks measured in the same call: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.0f}" for k, v in peaks) + ".\n")
    report.append("Timing: CUDA events after a warm-up, an L2 flush before each repeat, median (p20/p80 in the CSV). "
                  "Our kernels and cuBLAS are timed around their launches; the Python baselines around the framework "
                  "call (SDPA, autograd.grad, the Triton launch), which includes the framework's launch overhead: on "
                  "the smallest shapes (tens of microseconds) that overhead dominates their time, so ratios there "
                  "say more about dispatch than about kernels.\n")
    pngs = []
    tflops = lambda r: r["tflops"]  # noqa: E731
    if run["spec"].get("plot") in ("compare", "backward"):
        what = "backward" if spec.get("plot") == "backward" else "forward"
        pngs.append(bars(rows, out_dir, f"exp_{name}.png", f"{what} TFLOP/s by implementation", "TFLOP/s (log)", tflops,
                         gpu=gpu))
        pngs.append(bars(rows, out_dir, f"exp_{name}_pct_peak.png", "% of the measured GEMM peak",
                         "% of cuBLAS GEMM TFLOP/s (log)", lambda r: num(r["pct_matmul_peak"]), gpu=gpu))
        report.append(pivot_table(rows, lambda r: f"{r['tflops']:.2f}"))
        report.append("\n" + pivot_table(rows, lambda r: f"{r['max_abs']:.1e}", "max abs error vs float64"))
        report.append("\n" + pivot_table(rows, lambda r: r["speedup_vs_cpu"], "speedup vs PyTorch CPU (fp32)"))
    elif spec.get("plot") == "scaling":
        pngs.append(lines(rows, out_dir, f"exp_{name}.png", "sequence scaling", "seq_q", "sequence length S (log2)",
                          [("median ms (log)", lambda r: r["ms_median"], True),
                           ("peak device memory, MiB (log)", lambda r: num(r["peak_mib"]), True)],
                          hline=(probes["memory_bytes"] / 2**20, "GPU memory") if probes.get("memory_bytes") else None,
                          gpu=gpu, band=lambda r: (r["ms_p20"], r["ms_p80"])))
        report.append("x: out of memory or skipped (drawn at that implementation's last measured time).\n")
        report.append(pivot_table(rows, lambda r: f"{r['ms_median']:.3f}", "median ms"))
        report.append("\n" + pivot_table(rows, lambda r: r["peak_mib"], "peak device memory, MiB"))
    elif spec.get("plot") == "head_dim":
        pngs.append(lines(rows, out_dir, f"exp_{name}.png", "head-dim sweep", "head_dim", "head dim d",
                          [("TFLOP/s", tflops, False),
                           ("% of the measured GEMM peak", lambda r: num(r["pct_matmul_peak"]), False)], logx=False,
                          gpu=gpu, band=lambda r: (r["tflops"] * r["ms_median"] / r["ms_p80"],
                                                   r["tflops"] * r["ms_median"] / r["ms_p20"])))
        report.append(pivot_table(rows, lambda r: f"{r['tflops']:.1f}"))
    elif spec.get("plot") == "tuned_vs_default":
        pngs.append(tuned_vs_default_plot(rows, out_dir, f"exp_{name}.png", gpu))
        report.append(pivot_table(rows, lambda r: f"{r['tflops']:.1f}"))
    elif spec.get("plot") == "landscape":
        report.append("The sweep's heat maps are in the tuning-landscape section: " +
                      ", ".join(f"[{p}]({p})" for p in landscape_pngs) + ".")
    report += [f"\n![{p}]({p})" for p in pngs]
    report.append("")


def tuned_vs_default_plot(rows, out_dir, name, gpu=""):
    """tuned / default TFLOP/s per problem, one bar group per family; whiskers from both rows' p20-p80."""
    by = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok" and r["ms_median"] > 0:
            by[(r["impl"].split(":")[0], r["dtype"], shape_label(r))][r["impl"].endswith(":default")] = r
    pts = [(k, v[True]["ms_median"] / v[False]["ms_median"], v) for k, v in by.items() if False in v and True in v]
    err = [[0, 0] if not (v[True]["ms_p20"] and v[False]["ms_p20"]) else
           [x - v[True]["ms_p20"] / v[False]["ms_p80"], v[True]["ms_p80"] / v[False]["ms_p20"] - x] for _, x, v in pts]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.28 * max(1, len(pts))))
    ax.barh(range(len(pts)), [p[1] for p in pts], color=[color(p[0][0]) for p in pts],
            xerr=[[max(0, e[0]) for e in err], [max(0, e[1]) for e in err]], error_kw=dict(lw=0.6, capsize=1))
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(pts)), [f"{k[0]} {k[1]} {k[2]}" for k, _, _ in pts], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("tuned / default TFLOP/s (same run; 1 = no gain)")
    fit_title(ax, f"{gpu}: tuned config vs the family default; whiskers p20-p80")
    return savefig(fig, out_dir, name)


def add_sections(db, out_dir, report, landscape_pngs):
    for run, rows in load(db):
        section(run, rows, out_dir, report, landscape_pngs)
