#!/usr/bin/env bash
# The Python package builds from this source tree with its standard backend, offline
# (pip install --no-build-isolation: scikit-build-core comes from the environment, scripts/setup.sh),
# and imports without a GPU and without torch: flashtune.device_available() answers in one line.
set -euo pipefail
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ft-pypkg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -m pip install -q --no-build-isolation --no-deps --no-index --target "$tmp/site" \
  --config-settings=build-dir="$tmp/build" "$SRC" >"$tmp/pip.log" 2>&1 || { tail -40 "$tmp/pip.log"; exit 1; }
ls "$tmp/site/flashtune/libflashtune_attention.so" >/dev/null
cd "$tmp"  # not the source tree: the installed package must be the one imported
PYTHONPATH="$tmp/site" python3 - "$tmp/site" <<'PY'
import sys
import flashtune
assert flashtune.__file__.startswith(sys.argv[1]), flashtune.__file__
ok, why = flashtune.device_available()
assert "torch" not in sys.modules, "import flashtune must not import torch"
assert ok or (why and "\n" not in why), repr(why)
print("installed package imports:", flashtune.__file__, "device_available:", (ok, why))
PY
