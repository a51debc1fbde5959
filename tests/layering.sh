#!/usr/bin/env bash
# The layout's rule (docs/architecture.md, "Folders and libraries"): no arrow runs back up. core/ includes
# from none of results/, worker/, tuner/, runtime/; results/ from none of worker/, tuner/, runtime/;
# worker/ from none of results/, tuner/, runtime/; runtime/ from neither worker/ nor tuner/; templates/
# (the kernels, host-included traits) from none of them; tuner/process/ from no other part of the tuner.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail=0
check() {  # check <folder> <folders it must not include from...>
  local dir=$1 up hits
  shift
  for up in "$@"; do
    hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<]$up/" "$dir" \
             --include='*.cpp' --include='*.hpp' --include='*.h' --include='*.cuh' --include='*.cu')
    if [[ -n $hits ]]; then
      echo "FAIL: $dir/ includes from $up/:"
      echo "$hits"
      fail=1
    fi
  done
}
check core results worker tuner runtime
check results worker tuner runtime
check worker results tuner runtime
check runtime worker tuner
check templates core results worker tuner runtime
# Inside tuner/: process/ (starting children) is used by sweep/, experiments/ and cli/ and uses none of them.
check tuner/process tuner/space tuner/search tuner/sweep tuner/interop tuner/experiments tuner/cli
[[ $fail -eq 0 ]] && echo "layering: no include runs back up"
exit $fail
