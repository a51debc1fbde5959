#!/usr/bin/env bash
# The Python package builds from this source tree into a wheel with its standard backend, offline
# (pip wheel --no-build-isolation: scikit-build-core comes from the environment, scripts/setup.sh), installs
# into a fresh venv, and works there without a GPU and without torch, outside the source tree:
# flashtune.device_available() answers in one line.
#
# python_package.sh            the wheel `pip wheel .` makes: the runtime library alone, built in pip's temporary
#                              folder with neither SQLite3 nor nlohmann_json looked for (CMake is told to fail any
#                              find_package of them): nothing is written into the source tree; the library has no
#                              RPATH/RUNPATH, needs only the C and C++ libraries (NVRTC, the driver and SQLite are
#                              dlopen'ed), and names no folder of this build (the source tree, the build folder,
#                              this toolkit's path apart from the /usr/local/cuda the search tries anyway);
#                              `python -m flashtune` says in one line that this wheel has no CLI.
# python_package.sh tools      FLASHTUNE_PYTHON_TOOLS=ON: the wheel also carries the CLI and its worker
#                              (flashtune/bin/) with the spaces, problem sets and report scripts they read
#                              (flashtune/data/), and `python -m flashtune` (and the `flashtune` script) runs the CLI:
#                              --help, `tune --help`, `problems` on a shipped problem set, `devices` starting the
#                              installed worker (no GPU here: one line saying so).
set -euo pipefail
mode=${1:-runtime}
[[ $mode == runtime || $mode == tools ]] || { echo "usage: python_package.sh [tools]" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ft-pypkg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
touch "$tmp/marker"
sleep 1  # file times have a second's grain on some file systems
settings=()
if [[ $mode == tools ]]; then
  settings=(--config-settings=build-dir="$tmp/build" --config-settings=cmake.define.FLASHTUNE_PYTHON_TOOLS=ON)
else
  # As on a machine without their development packages: any find_package of them fails the build.
  settings=(--config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON
            --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON)
fi
python3 -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$tmp/wheel" "${settings[@]}" "$SRC" \
  >"$tmp/pip.log" 2>&1 || { tail -40 "$tmp/pip.log"; exit 1; }
echo "wheel ($mode) built in $((SECONDS - start)) s: $(cd "$tmp/wheel" && ls)"
whl=$(ls "$tmp/wheel"/flashtune-*.whl)
# Out of the source tree: nothing new there but what tests write into their build folder and Python's caches.
new=$(find "$SRC" -newer "$tmp/marker" -not -path "$SRC/.git/*" -not -path "$SRC/build*" -not -name '__pycache__' \
        -not -path '*/__pycache__/*' -not -name '*.pyc' -print | head -5)
[[ -z $new ]] || { echo "FAIL: the wheel build wrote into the source tree: $new"; exit 1; }

mkdir "$tmp/unzipped"
python3 -m zipfile -e "$whl" "$tmp/unzipped"
[[ -f $tmp/unzipped/flashtune/libflashtune_attention.so ]] || { echo "FAIL: the wheel has no runtime library"; exit 1; }
if [[ $mode == runtime ]]; then
  [[ ! -e $tmp/unzipped/flashtune/bin ]] || { echo "FAIL: a wheel without its tools carries bin/"; exit 1; }
  # Every shared object of the wheel: no RPATH or RUNPATH, only the C and C++ libraries (and torch's, for the
  # extension where one was built), no path of this build machine.
  while IFS= read -r so; do
    dyn=$(readelf -d "$so")
    if grep -qE 'RPATH|RUNPATH' <<<"$dyn"; then echo "FAIL: $so keeps a search path: $(grep -E 'RPATH|RUNPATH' <<<"$dyn")"; exit 1; fi
    needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn" | grep -vE '^(libstdc\+\+\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libc\.so\.6|ld-linux-x86-64\.so\.2|libdl\.so\.2|libpthread\.so\.0)$' |
               grep -vE '^lib(c10|c10_cuda|torch_cpu|torch|torch_cuda)\.so$' || true)
    [[ -z $needed ]] || { echo "FAIL: $so needs $(echo $needed)"; exit 1; }
    for path in "$SRC" "$tmp" "${BUILD:-/nonexistent-build}"; do
      if strings -n 6 "$so" | grep -qF "$path"; then echo "FAIL: $so names '$path'"; exit 1; fi
    done
    # pip's temporary build folder (tempfile's /tmp/tmpXXXXXXXX), wherever TMPDIR points
    if strings -n 6 "$so" | grep -qE "${TMPDIR:-/tmp}/tmp[A-Za-z0-9_]{6,}"; then echo "FAIL: $so names a build folder"; exit 1; fi
  done < <(find "$tmp/unzipped" -name '*.so*' -type f)
  echo "wheel: $(cd "$tmp/unzipped" && find . -type f | sort | tr '\n' ' ')"
fi

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --no-deps "$whl" >"$tmp/pip.log" 2>&1 ||
  { tail -40 "$tmp/pip.log"; exit 1; }
py=$tmp/venv/bin/python
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
pkg=$site/flashtune
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

if [[ $mode == runtime ]]; then
  rc=0
  run "$py" -m flashtune --help >"$tmp/out" 2>"$tmp/err" || rc=$?
  [[ $rc == 2 && $(wc -l <"$tmp/err") == 1 ]] && grep -q "FLASHTUNE_PYTHON_TOOLS=ON" "$tmp/err" ||
    { echo "FAIL: python -m flashtune without a CLI (exit $rc): $(cat "$tmp/err")"; exit 1; }
  echo "python_package (runtime): $((SECONDS - start)) s"
  exit 0
fi

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
echo "python_package (tools): $((SECONDS - start)) s"
