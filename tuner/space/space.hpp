// Spaces (what to sweep) and problem sets (what to sweep it on), read from JSON files.
// Every value is checked against the family's domain before it reaches a name expression,
// so a space file can never inject source.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/compile.hpp"
#include "core/family.hpp"

namespace flashtune {

struct Space {
  const Family* family = nullptr;
  std::vector<std::vector<int>> values;  // per Family::params entry
  std::vector<int> head_dims;
  std::vector<bool> causal;
  std::vector<DType> dtypes;
  // The kernels' forms to compile: dense (false) and packed variable-length (true, a Family::varlen family
  // only). Default {false}. Only compile-check, the covering sample and the NVRTC tests read it: tune
  // takes the form each problem needs (variants_for).
  std::vector<bool> varlen{false};
  // Likewise the paged K/V cache form (true, a Family::paged family only). Default {false}.
  std::vector<bool> paged{false};
  // The paged form's pool layouts, as space files' "page_layouts": ["hnd", "nhd"] (nhd: a Family::paged_nhd
  // family only). Default {hnd}. Like paged, for compile-check, the sample and the NVRTC tests: tune takes the
  // layout each paged problem has (variants_for).
  std::vector<PageLayout> page_layouts{PageLayout::hnd};
  // The score modifications to compile (Family::mods bits; 0: plain), as space files' "mods": ["none",
  // "window", "softcap", "alibi", "window+softcap", ...: names joined by '+']. Default {0}. Like varlen, for compile-check, the sample and the
  // NVRTC tests: tune takes the modifications each problem has (variants_for).
  std::vector<unsigned> mods{0};
  // The predicate of the "mask" modification (kModMask), as space files' "mask_mod": {"predicate": "...",
  // "tensors": ["doc", ...]} (names only: compiling needs no values). Required where mods hold "mask".
  std::shared_ptr<const MaskPredicate> mask;

  // The kernel forms listed: dense, packed, paged (never both), the paged form in each of page_layouts.
  struct Form {
    bool packed = false, paged = false;
    PageLayout layout = PageLayout::hnd;
  };
  std::vector<Form> forms() const;
  unsigned long long size() const;        // variants() would hold this many (saturating), without building them
  std::vector<Config> configs() const;    // the cartesian product of values
  std::vector<Variant> variants() const;  // configs x head_dims x causal x dtypes x (varlen or paged forms) x mods
};

// The variants of the space that some problem needs (matching d, causal, dtype; the packed form,
// Variant::varlen, for a varlen problem; the paged form, Variant::paged, for a paged one).
std::vector<Variant> variants_for(const Space&, const std::vector<Problem>&);

// Spaces over this many variants are refused unless allowed (`--allow-large-space`): each variant is an NVRTC
// compile of seconds, so 20000 is already a day of compiling; the largest committed space has 6912.
inline constexpr unsigned long long kMaxSpaceVariants = 20000;

// Every value list is deduplicated (first order kept) and the size checked before any variant is built.
Space space_from_json(const nlohmann::json&, bool allow_large = false);  // throws UsageError naming the problem
Space load_space(const std::string& path, bool allow_large = false);

// {"problems": [ {...}, ... ]} and/or {"grid": {"tokens":16384, "hidden":2048, "seq":[...],
// "head_dim":[...], "causal":[...], "dtype":[...]}} (B = tokens/S, H = hidden/d).
std::vector<Problem> problems_from_json(const nlohmann::json&);
std::vector<Problem> load_problems(const std::string& path);

// JSON read by the CLI is bounded: files of at most 16 MiB, nesting of at most 64 levels (checked
// before parsing); every failure is one UsageError line with the document quoted only briefly.
inline constexpr size_t kMaxJsonBytes = 16u << 20;
inline constexpr int kMaxJsonDepth = 64;
nlohmann::json read_json_file(const std::string& path);  // a regular file; one-line UsageError on failure
// UsageError naming `what`; a larger bound for data files (flashtune import) than for definitions.
nlohmann::json parse_json_bounded(std::string_view text, const std::string& what, size_t max_bytes = kMaxJsonBytes);
std::string read_bounded_file(const std::string& path, size_t max_bytes);  // a regular file's bytes
std::string brief_json(const nlohmann::json&);  // at most 60 characters of the dump, for messages
// An integer checked against [lo, hi] in its full range before converting; UsageError naming `what`.
int json_int(const nlohmann::json&, const std::string& what, long long lo, long long hi);

}  // namespace flashtune
