// Ahead-of-time kernels (CMake option FLASHTUNE_AOT_ARCHS): which variants a build compiles, and the
// table of embedded cubins the runtime reads before its disk cache and NVRTC.
//
// Kernels are keyed by Compiler::variant_hash, the JIT path's own key (template sources, NVRTC options
// and version, arch, name expressions): a lookup can only find the cubin NVRTC makes for exactly that
// variant on that arch, never one built for another arch or with other options.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/compile.hpp"
#include "lookup.hpp"

namespace flashtune::rt {

// One embedded kernel. Variants pruned at build time (limits, spills) are not in the table: the runtime
// treats them as the JIT path does (NVRTC's verdict, then the family's default).
struct AotKernel {
  const char* hash;     // Compiler::variant_hash (or copy_kernel_hash)
  const char* names;    // lowered kernel names in launch order, '\n'-separated
  size_t offset, size;  // the cubin's bytes in the blob
};

struct AotTable {
  const AotKernel* kernels = nullptr;  // sorted by hash
  size_t count = 0;
  const unsigned char* blob = nullptr;
};

// The library's table: generated at build time (flashtune-aot-gen), or empty (aot_none.cpp).
AotTable aot_table();
// The entry for `hash`, or nullptr: the caller goes on to the disk cache and NVRTC.
const AotKernel* aot_find(const AotTable&, const std::string& hash);

// ---- build time ----------------------------------------------------------------------------------
// An entry of FLASHTUNE_AOT_ARCHS: "80" -> sm_80; "90a" -> sm_90 with the Hopper-only families (built
// for sm_90a, as the JIT path builds them on an sm_90 device); "90" -> sm_90 without them. The arch is
// the device's, as the runtime sees it. Throws UsageError for anything the runtime cannot run.
struct AotArch {
  std::string arch;     // "sm_90"
  bool hopper = false;  // Hopper-only families included
};
AotArch parse_aot_arch(const std::string& entry);

// Which queries to consider (empty: all); the build uses no filter, tests a small one.
struct AotFilter {
  std::vector<std::string> families;
  std::vector<int> head_dims;
  std::vector<DType> dtypes;
  std::vector<int> causal;  // 0, 1
};

struct AotPlan {
  std::vector<Variant> variants;     // distinct, in a stable order
  std::vector<std::string> skipped;  // one line each: a variant the runtime may pick that is not built, and why
};

// Every variant lookup.cpp's choose() can pick on `a` from the tables (no $FLASHTUNE_DB): for each
// direction, dtype, head dim and mask, dense, packed or paged (the families' packed and paged forms, the
// latter at page sizes standing for every page size), each device table of the arch and an untabled device,
// and each sequence bucket of the tables, the chosen family's config and that family's fallback (the default,
// or for a paged call the default's nearest config reading its pages: what runs when a config is rejected or
// does not compile).
AotPlan aot_variants(const TableSet&, const AotArch&, const AotFilter& = {});

}  // namespace flashtune::rt
