#include "tuner/space/sample.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

namespace flashtune {

std::string reason_kind(const std::string& reason) {
  std::string out;
  for (size_t i = 0; i < reason.size();) {
    if (std::isdigit((unsigned char)reason[i])) {
      out += '#';
      while (i < reason.size() && std::isdigit((unsigned char)reason[i])) ++i;
    } else {
      out += reason[i++];
    }
  }
  return out;
}

std::vector<Variant> default_variants(const Family& f) {
  std::vector<Variant> vs;
  for (int d : f.head_dims)
    for (bool causal : {false, true})
      for (DType t : f.dtypes) vs.push_back(Variant{&f, f.default_config, d, causal, t, false});
  // The packed form once per head dim and mask, in the family's last dtype: fp16 and bf16 have the same
  // widths, so their registers and shared memory match (the dense form above shows that per family), and
  // compiling both doubled the slowest CI tests.
  if (f.varlen)
    for (int d : f.head_dims)
      for (bool causal : {false, true})
        vs.push_back(Variant{&f, f.default_config, d, causal, f.dtypes.back(), true});
  if (f.paged)  // likewise the paged form
    for (int d : f.head_dims)
      for (bool causal : {false, true})
        vs.push_back(Variant{&f, f.default_config, d, causal, f.dtypes.back(), false, true});
  if (f.paged_nhd)  // and its token-major pages, non-causal (the layout changes the loader only, not the mask)
    for (int d : f.head_dims)
      vs.push_back(Variant{&f, f.default_config, d, false, f.dtypes.back(), false, true, 0, PageLayout::nhd});
  // The score modifications (Family::mods), likewise in the last dtype: every head dim and mask with all of
  // them (the most registers), and each alone at one head dim per mask (their code apart).
  const unsigned score_mods = f.mods & ~kModMask;  // a mask_mod needs a predicate: below
  if (score_mods) {
    int widest = 0;  // the largest head dim with the modified forms (Family::mods_max_head_dim)
    for (int d : f.head_dims)
      if (f.has_mods(score_mods, d)) {
        widest = std::max(widest, d);
        for (bool causal : {false, true}) vs.push_back(Variant{&f, f.default_config, d, causal, f.dtypes.back(), false, false, score_mods});
      }
    for (unsigned m : {kModWindow, kModSoftcap, kModAlibi})
      if ((f.mods & m) && m != score_mods && widest > 0)
        for (bool causal : {false, true})
          vs.push_back(Variant{&f, f.default_config, widest, causal, f.dtypes.back(), false, false, m});
  }
  // A mask_mod (kModMask) with sample_mask_predicate (two tensors, b and h read: the most registers), every head
  // dim and mask with the softcap and ALiBi it combines with, and alone.
  if (f.mods & kModMask) {
    const auto pred = std::make_shared<const MaskPredicate>(sample_mask_predicate());
    const unsigned with = kModMask | (f.mods & (kModSoftcap | kModAlibi));
    std::vector<unsigned> sets{with};
    if (with != kModMask) sets.push_back(kModMask);
    for (int d : f.head_dims)
      if (f.has_mods(with, d))
        for (unsigned m : sets)
          for (bool causal : {false, true}) {
            vs.push_back(Variant{&f, f.default_config, d, causal, f.dtypes.back(), false, false, m});
            vs.back().mask = pred;
          }
  }
  return vs;
}

namespace {

// What a variant shows on its own: each tunable's value, its head dim, dtype and mask.
std::vector<std::string> single_features(const Variant& v) {
  std::vector<std::string> out;
  const Family& f = *v.family;
  for (size_t i = 0; i < f.params.size() && i < v.config.size(); ++i)
    out.push_back(f.params[i].name + "=" + std::to_string(v.config[i]));
  out.push_back("d=" + std::to_string(v.head_dim));
  out.push_back(std::string("dtype=") + to_string(v.dtype));
  out.push_back(std::string("causal=") + (v.causal ? "1" : "0"));
  // The packed variable-length form is another kernel: every value, head dim, dtype and mask once in it
  // too (its (value, head dim) pairs are the dense form's to cover: a few more compiles, not twice as many).
  if (v.varlen)
    for (auto& s : out) s = "varlen:" + s;
  if (v.paged)  // the paged form likewise, each layout its own kernel
    for (auto& s : out) s = (v.page_layout == PageLayout::nhd ? "paged-nhd:" : "paged:") + s;
  if (v.mods)  // and each set of score modifications
    for (auto& s : out) s = mods_string(v.mods) + ":" + s;
  return out;
}

}  // namespace

std::vector<SampledVariant> covering_sample(const std::vector<Variant>& variants, const Compiler& compiler,
                                            const SampleOptions& options) {
  const size_t n = variants.size();
  std::vector<std::string> reasons(n);
  std::set<std::string> reachable_singles;  // singles shown by some variant that reaches NVRTC
  for (size_t i = 0; i < n; ++i) {
    reasons[i] = compiler.prune_before_compile(variants[i]);
    if (reasons[i].empty())
      for (auto& s : single_features(variants[i])) reachable_singles.insert(s);
  }

  // Features as ids; each variant's list.
  std::map<std::string, int> ids;
  std::vector<std::string> names;
  auto id = [&](const std::string& s) {
    auto [it, fresh] = ids.emplace(s, (int)names.size());
    if (fresh) names.push_back(s);
    return it->second;
  };
  std::vector<std::vector<int>> features(n);
  for (size_t i = 0; i < n; ++i) {
    const Variant& v = variants[i];
    if (reasons[i].empty()) {
      for (auto& s : single_features(v)) features[i].push_back(id(s));
      if (options.value_head_dim_pairs) {
        const Family& f = *v.family;
        for (size_t p = 0; p < f.params.size() && p < v.config.size(); ++p)
          features[i].push_back(
              id(f.params[p].name + "=" + std::to_string(v.config[p]) + "@d=" + std::to_string(v.head_dim)));
      }
    } else {
      features[i].push_back(id("pruned: " + reason_kind(reasons[i])));
      for (auto& s : single_features(v))  // a value no compilable variant has is still shown once
        if (!reachable_singles.count(s)) features[i].push_back(id(s));
    }
  }

  std::vector<char> covered(names.size(), 0);
  std::vector<char> taken(n, 0);
  std::vector<SampledVariant> out;
  for (;;) {
    size_t best = n;
    int best_gain = 0;
    for (size_t i = 0; i < n; ++i) {
      if (taken[i]) continue;
      int gain = 0;
      for (int f : features[i]) gain += !covered[f];
      if (gain > best_gain) best_gain = gain, best = i;  // strict: ties keep the earliest
    }
    if (best == n) break;
    taken[best] = 1;
    SampledVariant s{variants[best], reasons[best], {}};
    for (int f : features[best])
      if (!covered[f]) {
        covered[f] = 1;
        s.covers.push_back(names[f]);
      }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<SampledVariant> covering_sample(const Space& space, const Compiler& compiler,
                                            const SampleOptions& options) {
  return covering_sample(space.variants(), compiler, options);
}

}  // namespace flashtune
