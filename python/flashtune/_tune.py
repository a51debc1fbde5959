"""flashtune.tune(shapes, ...) (this module is flashtune._tune): tune the kernel families that serve these shapes on this GPU into the user's store,
which the runtime (flashtune.torch.attention, the C API) then reads with no environment variable.

    import flashtune
    picks = flashtune.tune([(4, 16, 4096, 128), (1, 32, 16384, 128)], dtype="bf16", causal=True, budget="5m")

It runs the CLI the package carries (`python -m flashtune tune`, one process per family and direction, each
starting its worker process: a candidate that faults takes down the worker, never this process) with the
family's committed space (configs/spaces/<family>.json) on problems written from `shapes`, the strategy and an
equal share of what is left of the budget each, into $XDG_CACHE_HOME/flashtune/<gpu-slug>.db (else
~/.cache/flashtune/<gpu-slug>.db; `python -m flashtune devices --store` prints it). Every attempt is stored as it
is made: an interrupted tune keeps what it measured, and tuning again continues from it.
"""
import csv
import io
import json
import math
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time

from ._cli import cli_path, data_dir
from ._lib import FlashtuneError, NoGpuError, one_line

__all__ = ["tune"]

DIRECTIONS = ("fwd", "bwd")
STRATEGIES = ("halving", "guided", "random", "exhaustive")
_DTYPES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
           "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
           "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16"}
_LIMITS = {"batch": 1 << 20, "heads": 1 << 16, "heads_k": 1 << 16, "seq_q": 1 << 20, "seq_k": 1 << 20,
           "head_dim": 1024}
_SHAPE_KEYS = ("batch", "heads", "seq", "seq_q", "seq_k", "head_dim", "heads_k")
MAX_SHAPES = 256
MAX_BUDGET_S = 30 * 86400
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def _fail(msg):
    raise ValueError(one_line(f"flashtune.tune: {msg}"))


def _show(x, limit=60):
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- arguments ---------------------------------------------------------------------------------
def _int_field(value, name, where):
    if isinstance(value, bool) or not isinstance(value, int):
        if hasattr(value, "__index__") and not isinstance(value, bool):  # numpy integers
            value = value.__index__()
        else:
            _fail(f"{where}: {name} must be an integer, got {_show(value)}")
    if not 1 <= value <= _LIMITS[name]:
        _fail(f"{where}: {name} must be in 1..{_LIMITS[name]}, got {value}")
    return value


def _shape(s, i):
    """One shape: (batch, heads, seq, head_dim), (batch, heads, seq_q, seq_k, head_dim) or a dict of batch, heads,
    seq or seq_q and seq_k, head_dim and optionally heads_k (grouped-query heads)."""
    where = f"shapes[{i}]"
    if isinstance(s, dict):
        unknown = [k for k in s if k not in _SHAPE_KEYS]
        if unknown:
            _fail(f"{where}: unknown key {_show(unknown[0])} (keys: {', '.join(_SHAPE_KEYS)})")
        if "seq" in s and ("seq_q" in s or "seq_k" in s):
            _fail(f"{where}: give seq, or seq_q and seq_k, not both")
        d = dict(s)
        if "seq" in d:
            d["seq_q"] = d["seq_k"] = d.pop("seq")
        for k in ("batch", "heads", "seq_q", "seq_k", "head_dim"):
            if k not in d:
                _fail(f"{where}: missing {k if k not in ('seq_q', 'seq_k') else 'seq (or seq_q and seq_k)'}")
    elif isinstance(s, (tuple, list)):
        if len(s) == 4:
            d = dict(zip(("batch", "heads", "seq_q", "head_dim"), s))
            d["seq_k"] = d["seq_q"]
        elif len(s) == 5:
            d = dict(zip(("batch", "heads", "seq_q", "seq_k", "head_dim"), s))
        else:
            _fail(f"{where}: a shape is (batch, heads, seq, head_dim) or (batch, heads, seq_q, seq_k, head_dim), "
                  f"got {len(s)} numbers")
    else:
        _fail(f"{where}: a shape is a tuple (batch, heads, seq, head_dim) or a dict, got {type(s).__name__}")
    out = {k: _int_field(d[k], k, where) for k in ("batch", "heads", "seq_q", "seq_k", "head_dim")}
    if d.get("heads_k") is not None:
        hk = _int_field(d["heads_k"], "heads_k", where)
        if out["heads"] % hk:
            _fail(f"{where}: heads_k ({hk}) must divide heads ({out['heads']})")
        if hk != out["heads"]:
            out["heads_k"] = hk
    return out


def _shapes(shapes):
    if isinstance(shapes, (str, bytes)) or shapes is None:
        _fail(f"shapes must be a list of shapes such as [(4, 16, 4096, 128)], got {_show(shapes)}")
    if isinstance(shapes, dict) or (isinstance(shapes, (tuple, list)) and shapes and all(
            isinstance(x, int) and not isinstance(x, bool) for x in shapes)):
        shapes = [shapes]  # one shape
    try:
        shapes = list(shapes)
    except TypeError:
        _fail(f"shapes must be a list of shapes, got {type(shapes).__name__}")
    if not shapes:
        _fail("shapes is empty")
    if len(shapes) > MAX_SHAPES:
        _fail(f"at most {MAX_SHAPES} shapes, got {len(shapes)}")
    out = []
    for i, s in enumerate(shapes):
        d = _shape(s, i)
        if d not in out:
            out.append(d)
    return out


def _dtype(dtype):
    key = dtype if isinstance(dtype, str) else str(dtype)  # torch.bfloat16 without importing torch
    if key not in _DTYPES:
        _fail(f"dtype must be one of fp32, fp16, bf16 (or the torch dtypes), got {_show(dtype)}")
    return _DTYPES[key]


def _causal(causal):
    if isinstance(causal, bool):
        return [causal]
    if isinstance(causal, (tuple, list)) and causal and all(isinstance(c, bool) for c in causal):
        return sorted(set(causal))
    _fail(f"causal must be True, False or both as (False, True), got {_show(causal)}")


def _direction(direction):
    if direction == "both":
        return list(DIRECTIONS)
    if isinstance(direction, str) and direction in DIRECTIONS:
        return [direction]
    if isinstance(direction, (tuple, list)) and direction and all(
            isinstance(x, str) and x in DIRECTIONS for x in direction):
        return [x for x in DIRECTIONS if x in direction]
    _fail(f"direction must be 'fwd', 'bwd' or 'both', got {_show(direction)}")


def parse_budget(budget):
    """Seconds from a duration such as "90s", "5m", "1h30m" or a number of seconds (the CLI's --time-budget)."""
    if isinstance(budget, bool):
        _fail(f"budget must be a duration such as '5m', '90s', '1h30m' or seconds, got {_show(budget)}")
    if isinstance(budget, (int, float)):
        seconds = float(budget)
    elif isinstance(budget, str):
        m = _DURATION.match(budget.strip()) if len(budget) <= 32 else None
        if m and any(m.groups()):
            h, mi, s = (float(x) if x else 0.0 for x in m.groups())
            seconds = h * 3600 + mi * 60 + s
        elif re.fullmatch(r"\d+(?:\.\d+)?", budget.strip() if len(budget) <= 32 else "x"):
            seconds = float(budget)
        else:
            _fail(f"budget must be a duration such as '5m', '90s', '1h30m' or seconds, got {_show(budget)}")
    else:
        _fail(f"budget must be a duration such as '5m', '90s', '1h30m' or seconds, got {_show(budget)}")
    if not math.isfinite(seconds) or seconds < 1 or seconds > MAX_BUDGET_S:
        _fail(f"budget must be between 1 s and 30 days, got {_show(budget)}")
    return seconds


def _strategy(strategy):
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        _fail(f"strategy must be one of {', '.join(STRATEGIES)}, got {_show(strategy)}")
    return strategy


def _device(device):
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device <= 64:
        _fail(f"device must be a CUDA device index 0..64, got {_show(device)}")
    return device


def _flag(value, name):
    if not isinstance(value, bool):
        _fail(f"{name} must be True or False, got {_show(value)}")
    return value


def problems(shapes, dtype="bf16", causal=False, direction="fwd"):
    """The problems flashtune.tune measures, as the CLI's problem files hold them (checked like tune's arguments)."""
    out = []
    for dr in _direction(direction):
        for s in _shapes(shapes):
            for c in _causal(causal):
                p = dict(s, dtype=_dtype(dtype), causal=c, direction=dr)
                out.append(p)
    return out


# --- the plan: which families, spaces and problems --------------------------------------------
def serves(family, problem, arch):
    """Whether the runtime could run `family` on this dense problem on `arch` (runtime/src/lookup.cpp's
    candidate_families for a dense, non-deterministic call)."""
    f = family
    return (not f.get("test_only") and f["direction"] == problem["direction"] and problem["dtype"] in f["dtypes"]
            and problem["head_dim"] in f["head_dims"] and (not f.get("hopper_only") or arch == "sm_90")
            and ("heads_k" not in problem or f.get("gqa")) and (not f.get("max_seq_q") or problem["seq_q"] <= f["max_seq_q"]))


def plan(problem_list, families, arch, spaces_dir):
    """[(family, direction, space file, problems)] for the problems: every family that serves a problem and whose
    committed space (<spaces_dir>/<family>.json) holds its head dim, dtype and mask. A problem no family serves is a
    ValueError."""
    steps = {}
    for p in problem_list:
        served = False
        for f in families:
            if not serves(f, p, arch):
                continue
            name = f["name"]
            if not re.fullmatch(r"[a-z0-9_]{1,64}", name):  # a file name below: the registry's names only
                continue
            space_file = os.path.join(spaces_dir, name + ".json")
            try:
                with open(space_file, encoding="utf-8") as fh:
                    space = json.load(fh)
            except (OSError, ValueError):
                continue
            if (p["head_dim"] not in space.get("head_dims", []) or p["dtype"] not in space.get("dtypes", [])
                    or p["causal"] not in space.get("causal", [False, True])):
                continue
            served = True
            steps.setdefault((name, p["direction"]), (space_file, []))[1].append(p)
        if not served:
            what = (f"{p['dtype']} {'forward' if p['direction'] == 'fwd' else 'backward'} d={p['head_dim']}"
                    f"{' causal' if p['causal'] else ''}{' with heads_k' if 'heads_k' in p else ''}"
                    f"{' Sq=' + str(p['seq_q']) if p['seq_q'] != p['seq_k'] else ''}")
            _fail(f"no kernel family runs {what} on {arch}")
    return [(name, dr, space_file, ps) for (name, dr), (space_file, ps) in steps.items()]


# --- the user's store ----------------------------------------------------------------------------
def _check_store(path):
    """Creates the store's folder (mode 0700) and checks what the runtime checks before reading it: the folder is
    this user's and not writable by others, the store (when it exists) a regular file of this user's that group and
    others cannot write. One-line FlashtuneError otherwise: a store the runtime would not read is not filled."""
    if not path or not os.path.isabs(path):
        raise FlashtuneError(one_line(f"flashtune.tune: no user's store path ({path!r}): set HOME or XDG_CACHE_HOME"))
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError as e:
        raise FlashtuneError(one_line(f"flashtune.tune: cannot create the store's folder {folder}: {e.strerror}"))
    if st.st_uid != os.geteuid():
        raise FlashtuneError(one_line(f"flashtune.tune: the store's folder {folder} belongs to another user"))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise FlashtuneError(one_line(f"flashtune.tune: the store's folder {folder} is writable by others "
                                      f"(chmod go-w it, or set XDG_CACHE_HOME to a folder of yours)"))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise FlashtuneError(one_line(f"flashtune.tune: {path} is not a regular file of yours that only you can "
                                      f"write: the runtime would not read it; remove it or make it so"))


def _private(path):
    """The store and its -wal/-shm mode 0600 (SQLite creates them under the umask; a group-writable store is one
    the runtime refuses)."""
    for p in (path, path + "-wal", path + "-shm"):
        try:
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.chmod(p, 0o600)
        except OSError:
            pass


# --- running the CLI -----------------------------------------------------------------------------
def _run(args, what):
    """The CLI's stdout; its one-line error as ValueError (exit 2: bad input) or FlashtuneError."""
    r = subprocess.run(args, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        last = last[len("flashtune: "):] if last.startswith("flashtune: ") else last
        raise (ValueError if r.returncode == 2 else FlashtuneError)(one_line(f"flashtune.tune: {what}: {last}"))
    return r.stdout


def _duration(s):
    s = max(0, int(s + 0.5))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


_PROGRESS = re.compile(r"\[(\d+)/(\d+)\]\s+\d+%\s+elapsed \S+\s+eta ([0-9hms]+)")


def _seconds(text):
    total = 0
    for v, u in re.findall(r"(\d+)([hms])", text):
        total += int(v) * {"h": 3600, "m": 60, "s": 1}[u]
    return total


class _Progress:
    """One status line on stderr: the step, its candidates, the time so far and the ETA of the whole tune (this
    step's from the CLI's progress, never past its share, then the later steps' shares). Redrawn on a terminal,
    a line every 15 s in a log."""

    def __init__(self, enabled, budget_s):
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.last = 0.0
        self.lock = threading.Lock()
        self.step = ""
        self.done = self.total = 0
        self.step_end = self.later_s = 0.0

    def begin(self, label, share_s, later_s):
        with self.lock:
            self.step, self.done, self.total = label, 0, 0
            now = time.monotonic()
            self.step_end, self.later_s = now + share_s, later_s
        self.draw(force=True)

    def cli_line(self, line):
        m = _PROGRESS.search(line)
        if not m:
            return False
        with self.lock:
            self.done, self.total = int(m.group(1)), int(m.group(2))
            self.step_end = min(self.step_end, time.monotonic() + _seconds(m.group(3)))
        self.draw()
        return True

    def text(self):
        now = time.monotonic()
        eta = max(0.0, self.step_end - now) + self.later_s
        eta = min(eta, max(0.0, self.budget_s - (now - self.start)))
        count = f" [{self.done}/{self.total}]" if self.total else ""
        return f"flashtune.tune {self.step}{count}  elapsed {_duration(now - self.start)}  eta {_duration(eta)}"

    def draw(self, force=False):
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < (0.5 if self.tty else 15.0):
            return
        self.last = now
        with self.lock:
            text = self.text()
        sys.stderr.write(("\r\033[K" + text) if self.tty else text + "\n")
        sys.stderr.flush()

    def say(self, line):
        if self.enabled:
            sys.stderr.write(("\r\033[K" if self.tty else "") + line + "\n")
            sys.stderr.flush()
            self.last = 0.0

    def finish(self):
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _tune_step(args, progress):
    """Runs one `flashtune tune`, feeding its progress lines to `progress`; its last error line if it failed."""
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", bufsize=1)
    lines = []

    def read_stderr():
        for line in proc.stderr:
            line = line.rstrip("\n").split("\r")[-1]
            if not line or progress.cli_line(line):
                continue
            lines.append(line)
            if line.startswith("flashtune: "):
                continue  # the error: raised below
            progress.say(line)

    stdout = []
    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)]
    for t in readers:
        t.start()
    try:
        while proc.poll() is None:
            progress.draw()
            time.sleep(0.5)
    except BaseException:  # KeyboardInterrupt: stop the sweep (what it measured is stored), then raise
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    for t in readers:
        t.join(timeout=5)
    return proc.returncode, "".join(stdout).strip(), lines


def _picks(cli, store, device_name, problem_list):
    """The store's best valid config per problem asked for (across families): a list of dicts."""
    text = _run([cli, "best", "--db", store, "--csv"], "reading the picks")
    best = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row["device"] != device_name or row.get("varlen") or row.get("paged"):
            continue
        key = (row["direction"], int(row["batch"]), int(row["heads"]), int(row["heads_k"]), int(row["seq_q"]),
               int(row["seq_k"]), int(row["head_dim"]), row["dtype"], row["causal"] == "1")
        if key not in best or float(row["tflops"]) > best[key]["tflops"]:
            best[key] = {"family": row["family"], "config": row["config"], "tflops": float(row["tflops"]),
                         "ms": float(row["ms_median"])}
    out = []
    for p in problem_list:
        key = (p["direction"], p["batch"], p["heads"], p.get("heads_k", p["heads"]), p["seq_q"], p["seq_k"],
               p["head_dim"], p["dtype"], p["causal"])
        pick = best.get(key, {"family": None, "config": None, "tflops": None, "ms": None})
        out.append(dict(p, **pick))
    return out


def tune(shapes, dtype="bf16", causal=False, budget="5m", strategy="halving", direction="fwd", device=0,
         progress=True):
    """Tunes the kernel families that serve `shapes` on CUDA device `device` into the user's store and returns the
    picks: one dict per (shape, mask, direction) with batch, heads, seq_q, seq_k, head_dim, dtype, causal, direction
    (heads_k for grouped-query shapes) and the store's best family, config, tflops and ms (None where nothing valid
    was measured).

    shapes: (batch, heads, seq, head_dim), (batch, heads, seq_q, seq_k, head_dim) or dicts of those keys (with
    heads_k for grouped-query heads), or a list of them. dtype: "bf16", "fp16", "fp32" or the torch dtype.
    causal: True, False or (False, True). budget: the whole tune's wall time, "5m", "90s", "1h30m" or seconds; each
    (family, direction) gets an equal share of what is left as it starts. strategy: "halving" (every candidate
    briefly, the best quarter longer, the best 3 fully), "guided", "random" or "exhaustive". direction: "fwd",
    "bwd" or "both". progress: a status line with the ETA on stderr.

    Arguments are checked before anything runs (ValueError, one line); no GPU is NoGpuError. The runtime reads the
    store from the next call on (within a second in this process), first, before the committed tables."""
    problem_list = problems(shapes, dtype, causal, direction)
    budget_s = parse_budget(budget)
    strategy = _strategy(strategy)
    device = _device(device)
    progress = _flag(progress, "progress")
    cli = cli_path()
    spaces_dir = os.path.join(data_dir(), "configs", "spaces")

    r = subprocess.run([cli, "devices", "--device", str(device), "--json"], capture_output=True, text=True,
                       errors="replace", stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        why = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or ["no answer"])[-1]
        raise NoGpuError(one_line(f"flashtune.tune: {why}"))
    dev = json.loads(r.stdout)
    families = json.loads(_run([cli, "families", "--json"], "listing the families"))
    steps = plan(problem_list, families, dev["arch"], spaces_dir)
    store = dev["store"]
    _check_store(store)

    status = _Progress(progress, budget_s)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flashtune-tune-") as tmp:
        files = []
        for i, (name, dr, space_file, ps) in enumerate(steps):
            path = os.path.join(tmp, f"problems_{i}.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump({"description": f"flashtune.tune: {name} {dr}", "problems": [
                    {k: v for k, v in p.items()} for p in ps]}, fh)
            _run([cli, "problems", path], f"the shapes for {name}")  # the CLI's own checks, before any tuning
            files.append(path)
        status.say(f"flashtune.tune: {len(problem_list)} problems, {len(steps)} families x directions on "
                   f"{dev['name']} ({dev['arch']}), budget {_duration(budget_s)}, into {store}")
        try:
            for i, ((name, dr, space_file, ps), path) in enumerate(zip(steps, files)):
                left = budget_s - (time.monotonic() - start)
                share = left / (len(steps) - i)
                if share < 1:
                    status.say(f"flashtune.tune: {name} {dr} skipped: the budget is spent")
                    continue
                status.begin(f"[{i + 1}/{len(steps)}] {name} {dr}", share, left - share)
                args = [cli, "tune", space_file, path, "--db", store, "--device", str(device), "--strategy", strategy,
                        "--time-budget", f"{max(1, int(share))}s"]
                rc, out, lines = _tune_step(args, status)
                _private(store)
                if rc != 0:
                    last = next((ln for ln in reversed(lines) if ln.startswith("flashtune: ")),
                                lines[-1] if lines else f"exit status {rc}")
                    last = last[len("flashtune: "):] if last.startswith("flashtune: ") else last
                    raise (ValueError if rc == 2 else FlashtuneError)(
                        one_line(f"flashtune.tune: {name} {dr}: {last}"))
                if out:
                    status.say(out.splitlines()[-1])
        finally:
            status.finish()
            _private(store)
    return _picks(cli, store, dev["name"], problem_list)
