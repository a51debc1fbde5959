#!/usr/bin/env bash
# The Python package builds from this source tree into a wheel with its standard backend, offline
# (pip wheel --no-build-isolation: scikit-build-core comes from the environment, scripts/setup.sh), installs
# into a fresh venv, and works there without a GPU and without torch, outside the source tree:
# flashtune.device_available() answers in one line; the wheel carries the CLI and its worker
# (flashtune/bin/) with the spaces, problem sets and report scripts they read (flashtune/data/), and
# `python -m flashtune` (and the `flashtune` script) runs the CLI: --help, `tune --help`, `problems` on a
# shipped problem set, `devices` starting the installed worker (no GPU here: one line saying so).
set -euo pipefail
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ft-pypkg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
python3 -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$tmp/wheel" \
  --config-settings=build-dir="$tmp/build" "$SRC" >"$tmp/pip.log" 2>&1 || { tail -40 "$tmp/pip.log"; exit 1; }
echo "wheel built in $((SECONDS - start)) s: $(cd "$tmp/wheel" && ls)"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --no-deps "$tmp/wheel"/flashtune-*.whl >"$tmp/pip.log" 2>&1 ||
  { tail -40 "$tmp/pip.log"; exit 1; }
py=$tmp/venv/bin/python
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
pkg=$site/flashtune
for f in libflashtune_attention.so bin/flashtune bin/flashtune-worker data/configs/spaces/fa2_mma.json \
         data/configs/problems/smoke.json data/reports/make_report.py data/reports/experiments_report.py \
         data/experiments/baselines.py __main__.py _tune.py; do
  [[ -f $pkg/$f ]] || { echo "FAIL: the wheel has no flashtune/$f"; exit 1; }
done
[[ -x $pkg/bin/flashtune && -x $pkg/bin/flashtune-worker ]] || { echo "FAIL: bin/ not executable"; exit 1; }
# Every library the CLI and the worker need resolves, but the driver's (libcuda.so.1: none on a machine without one).
for b in flashtune flashtune-worker; do
  if ldd "$pkg/bin/$b" | grep "not found" | grep -v "libcuda.so.1"; then echo "FAIL: bin/$b misses a library"; exit 1; fi
done
cd "$tmp"  # not the source tree: the installed package must be the one imported
env -u PYTHONPATH -u FLASHTUNE_CLI -u FLASHTUNE_LIBRARY "$py" - "$site" <<'PY'
import sys
import flashtune
assert flashtune.__file__.startswith(sys.argv[1]), flashtune.__file__
ok, why = flashtune.device_available()
assert "torch" not in sys.modules, "import flashtune must not import torch"
assert ok or (why and "\n" not in why), repr(why)
print("installed package imports:", flashtune.__file__, "device_available:", (ok, why))
PY
run() { env -u PYTHONPATH -u FLASHTUNE_CLI -u FLASHTUNE_LIBRARY "$@"; }
run "$py" -m flashtune --help | grep -q "usage: flashtune <command>" || { echo "FAIL: python -m flashtune --help"; exit 1; }
run "$py" -m flashtune tune --help | grep -q "usage: flashtune tune" || { echo "FAIL: python -m flashtune tune --help"; exit 1; }
run "$tmp/venv/bin/flashtune" best --help | grep -q "usage: flashtune best" || { echo "FAIL: the flashtune script"; exit 1; }
run "$py" -m flashtune problems "$pkg/data/configs/problems/smoke.json" | grep -q "FLOP" ||
  { echo "FAIL: python -m flashtune problems on the shipped smoke set"; exit 1; }
rc=0
out=$(run "$py" -m flashtune devices 2>&1) || rc=$?
echo "python -m flashtune devices (exit $rc): $out"
if [[ $rc == 0 ]]; then
  echo "a GPU: $out"
else
  [[ $rc == 1 && $out == "no GPU found: "* && $out != *"cannot start worker"* ]] ||
    { echo "FAIL: the installed CLI did not start its worker"; exit 1; }
  [[ $out != *"worker died"* || $out == *"$pkg/bin/flashtune-worker"* ]] ||
    { echo "FAIL: not the installed worker"; exit 1; }
fi
run "$py" -m flashtune no-such-verb 2>"$tmp/err" && { echo "FAIL: an unknown verb passed"; exit 1; }
[[ $(wc -l <"$tmp/err") == 1 ]] || { echo "FAIL: more than one line: $(cat "$tmp/err")"; exit 1; }
echo "python_package: $((SECONDS - start)) s"
