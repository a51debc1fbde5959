#!/usr/bin/env bash
# Installs this build into a temporary prefix and builds examples/cmake_consumer against it with
# find_package(flashtune), twice:
#   1. as on a machine without SQLite3's development files (find_package(SQLite3) disabled): the
#      package loads flashtune::attention without it (neither its targets file nor the library's
#      NEEDED entries name SQLite), the attention-only program builds (its link line names no SQLite)
#      and runs, the tuner program is left out; asking for COMPONENTS tuner there fails with SQLite3
#      named;
#   2. with SQLite3 found where this build found it (FT_SQLITE3_*): the tuner program too.
# EXPECT=any (label unit): the one-line "no GPU:" answer where there is none, else every check
# passing; EXPECT=gpu (label gpu): every check passing.
# Env: BUILD (this build tree), SRC (the source tree), EXPECT, FT_SQLITE3_INCLUDE_DIR/LIBRARY.
set -euo pipefail
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ft-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in include/flashtune/attention.h include/flashtune/attention.hpp include/flashtune/configs/generated/dispatch.hpp \
         include/flashtune/templates/tuned_config.h include/flashtune/worker/validate.hpp \
         lib/cmake/flashtune/flashtuneConfig.cmake lib/cmake/flashtune/flashtuneConfigVersion.cmake \
         lib/cmake/flashtune/flashtuneAttentionTargets.cmake lib/cmake/flashtune/flashtuneTunerTargets.cmake \
         lib/cmake/flashtune/flashtuneReferenceTargets.cmake bin/flashtune bin/flashtune-worker; do
  [[ -e "$tmp/prefix/$f" ]] || fail "not installed: $f"
done
ls "$tmp/prefix"/lib*/libflashtune_attention.so* >/dev/null || fail "libflashtune_attention.so not installed"
if grep -qi sqlite "$tmp/prefix"/lib*/cmake/flashtune/flashtuneAttentionTargets*.cmake; then
  fail "flashtune::attention's targets name SQLite"
fi
# The library itself needs no SQLite either ($FLASHTUNE_DB loads it with dlopen).
if command -v readelf >/dev/null && readelf -d "$tmp/prefix"/lib*/libflashtune_attention.so | grep -qi 'NEEDED.*sqlite'; then
  fail "libflashtune_attention.so needs libsqlite3"
fi

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
export FLASHTUNE_CACHE_DIR="$tmp/cache"
# Runs a built program: the one-line no-GPU answer (EXPECT=any), else exit 0 and `passes` PASS lines.
run() {  # run <program> <passes>
  local rc=0 out
  out=$("$1" 2>&1) || rc=$?
  echo "$out"
  if [[ "${EXPECT:-any}" != gpu ]] && grep -q '^no GPU: ' <<<"$out"; then
    [[ $rc == 0 ]] || fail "$1: no GPU, but exit $rc"
    [[ $(grep -c '^no GPU: ' <<<"$out") == 1 ]] || fail "$1: more than one no-GPU line"
    return 0
  fi
  [[ $rc == 0 ]] || fail "$1: exit $rc"
  [[ $(grep -c '^PASS ' <<<"$out") == "$2" ]] || fail "$1: expected $2 PASS line(s)"
}

# 1. No SQLite3 to be found.
cmake -S "$SRC/examples/cmake_consumer" -B "$tmp/attention" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON >"$tmp/configure1.log" 2>&1 ||
  { cat "$tmp/configure1.log"; fail "configure without SQLite3"; }
grep -q "flashtune::tuner not loaded (SQLite3 not found)" "$tmp/configure1.log" ||
  { cat "$tmp/configure1.log"; fail "no note that the tuner was left out"; }
cmake --build "$tmp/attention" >"$tmp/build1.log" 2>&1 || { cat "$tmp/build1.log"; fail "build without SQLite3"; }
[[ -x "$tmp/attention/attention_only" && ! -e "$tmp/attention/consumer" ]] ||
  fail "without SQLite3: expected attention_only alone"
if grep -rqi sqlite "$tmp/attention"/build.ninja "$tmp/attention"/CMakeFiles/attention_only.dir/link.txt 2>/dev/null; then
  fail "the attention-only program's build names SQLite"
fi
run "$tmp/attention/attention_only" 1

mkdir -p "$tmp/needs_tuner"
cat >"$tmp/needs_tuner/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.24)
project(needs_tuner LANGUAGES CXX)
find_package(flashtune REQUIRED COMPONENTS tuner)
CMAKE
if cmake -S "$tmp/needs_tuner" -B "$tmp/needs_tuner/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
     -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON >"$tmp/configure2.log" 2>&1; then
  fail "COMPONENTS tuner configured without SQLite3"
fi
grep -q SQLite3 "$tmp/configure2.log" || { cat "$tmp/configure2.log"; fail "COMPONENTS tuner: SQLite3 not named"; }

# 2. SQLite3 where this build found it: the tuner program as well.
cmake -S "$SRC/examples/cmake_consumer" -B "$tmp/tuner" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" -DSQLite3_INCLUDE_DIR="${FT_SQLITE3_INCLUDE_DIR:-}" \
      -DSQLite3_LIBRARY="${FT_SQLITE3_LIBRARY:-}" >"$tmp/configure3.log" 2>&1 || { cat "$tmp/configure3.log"; fail "configure"; }
cmake --build "$tmp/tuner" >"$tmp/build3.log" 2>&1 || { cat "$tmp/build3.log"; fail "build"; }
run "$tmp/tuner/consumer" 2
echo "built against the installed package: attention_only without SQLite3, consumer with the tuner"
