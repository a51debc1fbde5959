// A covering sample of a space: a few variants whose compile still exercises what the whole space
// would, so CI compiles tens of variants per space instead of thousands (the full compile runs on
// the GPU machine). Enumerating needs no NVRTC: only the cheap pruning (Compiler::prune_before_compile).
#pragma once
#include <string>
#include <vector>

#include "core/compile.hpp"
#include "tuner/space/space.hpp"

namespace flashtune {

struct SampleOptions {
  // Also cover every (tunable value, head dim) pair among the variants that reach NVRTC: the tile
  // shapes meet every head dim once (most static_asserts and spills depend on the pair).
  bool value_head_dim_pairs = true;
};

struct SampledVariant {
  Variant variant;
  std::string prune_reason;         // Compiler::prune_before_compile: "" when it reaches NVRTC
  std::vector<std::string> covers;  // what it was picked for: "BLOCK_M=64", "d=96", "BLOCK_N=64@d=256", "pruned: ..."
};

// Greedy set cover over the variants (deterministic: ties go to the earlier variant in the given
// order). What is covered, for the compiler's target:
//  - every value of every tunable, every head dim, dtype and mask: by a variant that reaches NVRTC
//    where one exists, else by a pruned one (a Hopper-only family on sm_80: all pruned); and again
//    in the packed variable-length form (Variant::varlen) or the paged form (Variant::paged) where the space
//    lists it;
//  - with value_head_dim_pairs, every (tunable value, head dim) pair among variants that reach NVRTC;
//  - every distinct reason of the cheap pruning: the target's instruction set, each message of the
//    family's check, shared memory over the target's limit (numbers do not make reasons distinct).
// Pruning that needs the compiled code (spills, the register file) cannot be enumerated here.
std::vector<SampledVariant> covering_sample(const std::vector<Variant>& variants, const Compiler& compiler,
                                            const SampleOptions& options = {});
std::vector<SampledVariant> covering_sample(const Space& space, const Compiler& compiler,
                                            const SampleOptions& options = {});

// A pruning reason with its numbers replaced by '#': "shared memory # B exceeds the sm_# limit of # B".
std::string reason_kind(const std::string& reason);

// The family's default config at every head dim, mask and dtype: the fallback of emitted headers,
// which has to compile (without spills) wherever the family runs; for a family that runs packed
// variable-length batches (Family::varlen), its packed form as well (what `run` takes without --params),
// once per head dim and mask; likewise the paged form of a family that reads paged caches (Family::paged).
std::vector<Variant> default_variants(const Family& family);

}  // namespace flashtune
