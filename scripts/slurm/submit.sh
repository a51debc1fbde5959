#!/usr/bin/env bash
# Tunes a space across a Slurm cluster: a job array of N shards (tune_shard.sbatch, one GPU each by
# default), then one job that merges the shard stores when every shard has succeeded
# (merge_shards.sbatch, --dependency=afterok). OUTDIR, the space and problem files and flashtune
# must be on a file system every node sees. sbatch's own variables choose the rest
# (SBATCH_PARTITION, SBATCH_TIMELIMIT, SBATCH_ACCOUNT, ...).
#
# usage: scripts/slurm/submit.sh [--shards N] [--gpus G] [--flashtune PATH] SPACE PROBLEMS OUTDIR [-- tune options]
#   --shards N      array tasks, 0..N-1 (default 4)
#   --gpus G        GPUs per task (--gres=gpu:G; default 1, 0 for a compile-only sweep)
#   --flashtune P   the flashtune binary (default: build/flashtune of this checkout)
# Prints the array's and the merge's job ids. Results: OUTDIR/all.db; logs: OUTDIR/shard_K.log, merge.log.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() { sed -n 's/^# \{0,1\}//; /^usage:/,/^Prints/p' "${BASH_SOURCE[0]}" >&2; exit "${1:-2}"; }
die() { echo "submit.sh: $*" >&2; exit 2; }
shards=4 gpus=1 ft=$here/../../build/flashtune
pos=()
while (($#)); do
  case $1 in
    --shards) shards=${2:?--shards needs a value}; shift 2 ;;
    --gpus) gpus=${2:?--gpus needs a value}; shift 2 ;;
    --flashtune) ft=${2:?--flashtune needs a value}; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage 0 ;;
    -*) die "unknown option $1" ;;
    *) pos+=("$1"); shift ;;
  esac
done
((${#pos[@]} == 3)) || usage
# Slurm's default MaxArraySize (1001) allows indices up to 1000.
[[ $shards =~ ^[0-9]+$ ]] && ((shards >= 1 && shards <= 1000)) || die "--shards must be an integer in 1..1000, got '$shards'"
[[ $gpus =~ ^[0-9]+$ ]] && ((gpus <= 16)) || die "--gpus must be an integer in 0..16, got '$gpus'"
[[ -x $ft ]] || die "flashtune binary '$ft' is not executable (build it, or --flashtune PATH)"
[[ -f ${pos[0]} ]] || die "space file '${pos[0]}' does not exist"
[[ -f ${pos[1]} ]] || die "problems file '${pos[1]}' does not exist"
mkdir -p "${pos[2]}"
# Absolute paths: the jobs start in their own working directories on other nodes.
ft=$(realpath "$ft") space=$(realpath "${pos[0]}") problems=$(realpath "${pos[1]}") out=$(realpath "${pos[2]}")
gres=()
((gpus > 0)) && gres=(--gres="gpu:$gpus")

array=$(sbatch --parsable --array="0-$((shards - 1))" "${gres[@]}" --output="$out/shard_%a.log" \
  "$here/tune_shard.sbatch" "$ft" "$space" "$problems" "$out" "$@")
array=${array%%;*}  # "id;cluster" on a federation
merge=$(sbatch --parsable --dependency="afterok:$array" --output="$out/merge.log" \
  "$here/merge_shards.sbatch" "$ft" "$out" "$shards")
merge=${merge%%;*}
echo "tune array $array ($shards shards), merge $merge -> $out/all.db"
