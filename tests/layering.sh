#!/usr/bin/env bash
# The layout's rule (docs/architecture.md, "Folders and libraries"): no arrow runs back up. core/ includes
# from none of results/, worker/, tuner/, runtime/; results/ from none of worker/, tuner/, runtime/;
# worker/ from none of results/, tuner/, runtime/; runtime/ from neither worker/ nor tuner/; templates/
# (the kernels, host-included traits) from none of them; process/ (starting children) from none of them either.
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
# process/ sits under everything that starts a child (the tuner, the tests), so it uses nothing of ours.
check process core results worker tuner runtime templates
[[ $fail -eq 0 ]] && echo "layering: no include runs back up"
exit $fail
