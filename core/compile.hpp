// NVRTC stage: a variant (family, config, head_dim, causal, dtype, varlen, paged) becomes a cubin for one
// arch, with its resource usage, or a pruned/compile_error record with the reason.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/family.hpp"
#include "core/kernel_record.hpp"

namespace flashtune {

struct Variant {
  const Family* family = nullptr;
  Config config;
  int head_dim = 0;
  bool causal = false;
  DType dtype = DType::fp32;
  // The packed variable-length form of the family's kernels (Family::varlen), for varlen problems.
  bool varlen = false;
  // The paged K/V cache form (Family::paged), for paged problems.
  bool paged = false;
  // The score modifications compiled in (Family::mods: kModWindow, kModSoftcap, kModAlibi), for problems that have them.
  unsigned mods = 0;
  // The paged form's pool layout (paged only; nhd: Family::paged_nhd's token-major form), for problems whose
  // Paged::layout it is.
  PageLayout page_layout = PageLayout::hnd;
  // The predicate of a variant with kModMask (its wrapper is compiled before the template, its type the traits'
  // fifth argument); null otherwise.
  std::shared_ptr<const MaskPredicate> mask;
  bool operator==(const Variant& o) const {
    return family == o.family && config == o.config && head_dim == o.head_dim && causal == o.causal &&
           dtype == o.dtype && varlen == o.varlen && paged == o.paged && mods == o.mods && page_layout == o.page_layout &&
           (mask == o.mask || (mask && o.mask && *mask == *o.mask));
  }
  // Family::name_expressions of the variant (its mask's type where it has one).
  std::vector<std::string> name_expressions() const;
};

// The variant of a family's config for a problem: its head dim, mask, dtype, form (packed, paged and the pages'
// layout), modifications and mask_mod predicate.
Variant variant_for(const Family&, const Config&, const Problem&);

// What the target can hold, for pruning without a GPU.
struct ArchLimits {
  int max_smem_per_block = 0;  // opt-in maximum, bytes
  int registers_per_sm = 65536;
  int max_threads = 1024;
};
ArchLimits arch_limits(const std::string& arch);  // "sm_80", "sm_90"; throws UsageError for unknown
std::string nvrtc_version();

class Compiler {
 public:
  explicit Compiler(std::string arch);
  const std::string& arch() const { return arch_; }
  // NVRTC options for a family: its target is arch(), or arch() + "a" for a family that uses
  // arch-specific instructions (Family::hopper_only: sm_90a).
  std::string options_string(const Family& f) const;
  // Hash of everything that determines the variant's code.
  std::string variant_hash(const Variant&) const;
  // Why the variant is pruned without compiling it (the target's instruction set, the family's check,
  // shared memory over the target's limit), or "" when it goes to NVRTC. No NVRTC call: cheap.
  std::string prune_before_compile(const Variant&) const;
  // Prunes by constraints and limits, compiles, parses resources; never throws for a bad variant.
  KernelRecord compile(const Variant&) const;
  // All variants, cached where a cache (the results store) is given, on all CPU cores. progress after each.
  std::vector<KernelRecord> compile_all(const std::vector<Variant>&, KernelCache*,
                                        const std::function<void(size_t done, size_t total)>& progress = {}) const;

 private:
  std::vector<std::string> options(const Family& f) const;
  std::string target(const Family& f) const;
  std::string arch_;
  std::string source_hash_;  // of every embedded template
};

// "ptxas info : Used 64 registers ..." -> Resources (the worst of every entry function in the log)
Resources parse_ptxas_log(const std::string& log);
// The same per entry function, by its lowered (mangled) name ("Compiling entry function '<name>'").
std::map<std::string, Resources> parse_ptxas_entries(const std::string& log);

}  // namespace flashtune
