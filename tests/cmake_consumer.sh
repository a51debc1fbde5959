#!/usr/bin/env bash
# Installs this build into a temporary prefix, builds examples/cmake_consumer against it with
# find_package(flashtune), and runs it. EXPECT=any (label unit): the one-line "no GPU:" answer where
# there is none, else every check passing; EXPECT=gpu (label gpu): every check passing.
# Env: BUILD (this build tree), SRC (the source tree), EXPECT.
set -euo pipefail
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ft-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in include/flashtune/attention.h include/flashtune/attention.hpp include/flashtune/configs/generated/dispatch.hpp \
         include/flashtune/templates/tuned_config.h include/flashtune/tuner/validate.hpp \
         lib/cmake/flashtune/flashtuneConfig.cmake lib/cmake/flashtune/flashtuneConfigVersion.cmake bin/flashtune \
         bin/flashtune-worker; do
  [[ -e "$tmp/prefix/$f" ]] || fail "not installed: $f"
done
ls "$tmp/prefix"/lib*/libflashtune_attention.so* >/dev/null || fail "libflashtune_attention.so not installed"

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$SRC/examples/cmake_consumer" -B "$tmp/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" -DSQLite3_INCLUDE_DIR="${FT_SQLITE3_INCLUDE_DIR:-}" \
      -DSQLite3_LIBRARY="${FT_SQLITE3_LIBRARY:-}" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure"; }
cmake --build "$tmp/build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build"; }

export FLASHTUNE_CACHE_DIR="$tmp/cache"
rc=0
out=$("$tmp/build/consumer" 2>&1) || rc=$?
echo "$out"
if [[ "${EXPECT:-any}" != gpu ]] && grep -q '^no GPU: ' <<<"$out"; then
  [[ $rc == 0 ]] || fail "no GPU, but exit $rc"
  [[ $(grep -c '^no GPU: ' <<<"$out") == 1 ]] || fail "more than one no-GPU line"
  echo "consumer built against the installed package; no GPU here"
  exit 0
fi
[[ $rc == 0 ]] || fail "consumer exit $rc"
[[ $(grep -c '^PASS ' <<<"$out") == 2 ]] || fail "expected two PASS lines"
