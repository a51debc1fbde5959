#include "core/family.hpp"

#include <algorithm>
#include <cerrno>

#include "core/families/families.hpp"
#include "core/util.hpp"

namespace flashtune {

namespace {

// The registry, in the order families() lists it (tests and listings depend on it); each descriptor is
// its own file, core/families/<name>.cpp.
std::vector<Family> make_families() {
  std::vector<Family> fs;
  fs.push_back(make_naive());
  fs.push_back(make_fa1_simt());
  fs.push_back(make_fa2_simt());
  fs.push_back(make_fa2_simt_bwd());
  fs.push_back(make_fa2_mma());
  fs.push_back(make_fa2_mma_bwd());
  fs.push_back(make_fa2_wgmma_bwd());
  fs.push_back(make_fa3_wgmma());
  fs.push_back(make_fa3_wgmma_bwd());
  fs.push_back(make_decode_splitkv());
  fs.push_back(make_fault());
  return fs;
}

}  // namespace

std::string tensor_map_error(const TensorMapSpec& m, const Problem& p) {
  if (m.tensor != "q" && m.tensor != "k" && m.tensor != "v" && m.tensor != "o" && m.tensor != "do")
    return "tensor map of unknown tensor '" + brief(m.tensor) + "' (q, k, v, o or do)";
  if (dtype_bytes(p.dtype) != 2) return "tensor maps need a 16-bit dtype";
  if (m.swizzle_bytes != 32 && m.swizzle_bytes != 64 && m.swizzle_bytes != 128)
    return "tensor map swizzle must be 32, 64 or 128 bytes";
  if (m.box_rows < 1 || m.box_rows > 256) return "tensor map box rows must be in 1..256";
  if (m.box_cols < 8 || m.box_cols * 2 % 16 != 0 || m.box_cols * 2 > m.swizzle_bytes)
    return "tensor map box columns must be a multiple of 8 whose bytes fit the swizzle";
  // Rows are then whole boxes: a multiple of 16 bytes, as TMA's strides must be.
  if (p.head_dim % m.box_cols != 0) return "tensor map box columns must divide the head dim";
  return "";
}

const std::vector<Family>& families() {
  static const std::vector<Family> fs = make_families();
  return fs;
}

const Family* family_named(const std::string& name) {
  for (const auto& f : families())
    if (f.name == name) return &f;
  return nullptr;
}

const Family& find_family(const std::string& name) {
  if (const Family* f = family_named(name)) return *f;
  std::string known;
  for (const auto& f : families())
    if (!f.test_only) known += (known.empty() ? "" : ", ") + f.name;
  throw UsageError("unknown family '" + brief(name) + "' (known: " + known + ")");
}

unsigned problem_mods(const Problem& p) {
  return (p.windowed() ? kModWindow : 0u) | (p.softcapped() ? kModSoftcap : 0u) | (p.alibi ? kModAlibi : 0u) |
         (p.mask_mod.enabled() ? kModMask : 0u);
}

static const std::pair<unsigned, const char*> kModNames[] = {
    {kModWindow, "window"}, {kModSoftcap, "softcap"}, {kModAlibi, "alibi"}, {kModMask, "mask"}};

std::string mods_string(unsigned m) {
  std::string out;
  for (const auto& [bit, name] : kModNames)
    if (m & bit) out += (out.empty() ? "" : "+") + std::string(name);
  return out;
}

bool mods_from_string(const std::string& s, unsigned& mods) {
  mods = 0;
  if (s == "none") return true;
  size_t at = 0;
  while (true) {
    const size_t plus = s.find('+', at);
    const std::string part = s.substr(at, plus == std::string::npos ? std::string::npos : plus - at);
    unsigned bit = 0;
    for (const auto& [b, name] : kModNames)
      if (part == name) bit = b;
    if (!bit || (mods & bit)) return false;
    mods |= bit;
    if (plus == std::string::npos) return true;
    at = plus + 1;
  }
}

std::string Family::shape_reason(const Problem& p) const {
  if (p.windowed() && !(mods & kModWindow)) return "does not support sliding windows (window)";
  if (p.softcapped() && !(mods & kModSoftcap)) return "does not support logit softcapping (softcap)";
  if (p.alibi && !(mods & kModAlibi)) return "does not support ALiBi (alibi)";
  if (p.mask_mod.enabled() && !(mods & kModMask)) return "does not support a mask predicate (mask_mod)";
  if (!has_mods(problem_mods(p), p.head_dim))
    return "has " + mods_string(problem_mods(p)) + " up to head_dim " + std::to_string(mods_max_head_dim) +
           ", not " + std::to_string(p.head_dim);
  if (p.heads_k > 0 && !gqa) return "does not support grouped-query attention (heads_k)";
  if (p.varlen.enabled() && !varlen) return "does not support packed variable-length batches";
  if (p.paged.enabled() && !paged) return "does not read paged K/V caches";
  if (p.paged.enabled() && p.paged.layout == PageLayout::nhd && !paged_nhd) return "does not read token-major (nhd) paged K/V caches";
  if (max_seq_q > 0 && p.seq_q > max_seq_q)
    return "serves Sq <= " + std::to_string(max_seq_q) + " (decoding), not Sq " + std::to_string(p.seq_q);
  return "";
}

const char* Family::mods_check(const Config& c, unsigned m) const {
  if (c.size() != params.size()) return nullptr;  // check() says what is wrong with such a config
  for (const ModsRefusal& r : mods_refused)
    if ((m & r.mods) && r.refuses(c[r.param])) return r.why;
  return nullptr;
}

Config Family::mods_fallback(const Config& c, unsigned m) const {
  Config out = c;
  if (c.size() == params.size())
    for (const ModsRefusal& r : mods_refused)
      if ((m & r.mods) && r.refuses(out[r.param])) out[r.param] = r.fallback;
  return out;
}

std::string Family::config_string(const Config& c) const {
  std::string s;
  for (size_t i = 0; i < params.size() && i < c.size(); ++i)
    s += (i ? "," : "") + params[i].name + "=" + std::to_string(c[i]);
  return s;
}

Config Family::parse_config(const std::string& kv) const {
  Config c = default_config;
  std::vector<bool> seen(params.size(), false);
  for (const auto& item : split(kv, ',')) {
    auto parts = split(item, '=');
    if (parts.size() != 2) throw UsageError("parameter '" + brief(item) + "' is not K=V");
    const std::string key = trim(parts[0]), val = trim(parts[1]);
    auto it = std::find_if(params.begin(), params.end(), [&](const ParamSpec& p) { return p.name == key; });
    if (it == params.end()) throw UsageError("family " + name + " has no parameter '" + brief(key) + "'");
    size_t i = (size_t)(it - params.begin());
    if (seen[i]) throw UsageError("parameter " + key + " is given twice");
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(val.c_str(), &end, 10);
    if (val.empty() || *end || errno == ERANGE)
      throw UsageError("parameter " + key + " must be an integer, got '" + brief(val) + "'");
    // The whole value is compared, before any narrowing: 4294967360 is not 64.
    if (std::find(it->domain.begin(), it->domain.end(), v) == it->domain.end())
      throw UsageError("parameter " + key + " = " + brief(val) + " is outside its domain");
    c[i] = (int)v;
    seen[i] = true;
  }
  return c;
}

}  // namespace flashtune
