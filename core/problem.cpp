#include "core/problem.hpp"

// FLASHTUNE_NO_JSON (a wheel without the tuner, CMakeLists.txt): no problem files, keys or text, which the
// tuner reads and writes and the runtime never needs.
#ifndef FLASHTUNE_NO_JSON
#include <nlohmann/json.hpp>
#endif  // FLASHTUNE_NO_JSON

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sys/stat.h>

#include "core/kernel_record.hpp"
#include "core/util.hpp"

namespace flashtune {

const char* to_string(DType t) {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::fp32;
  if (s == "fp16") return DType::fp16;
  if (s == "bf16") return DType::bf16;
  throw UsageError("unknown dtype '" + s + "' (expected fp32, fp16 or bf16)");
}

std::string InputDist::str() const {
  if (kind == Kind::normal && scale == 1.0) return "normal";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s*%.6g", kind == Kind::normal ? "normal" : "heavy", scale);
  return buf;
}

InputDist make_input_dist(const std::string& kind, double scale) {
  InputDist d;
  if (kind == "normal") d.kind = InputDist::Kind::normal;
  else if (kind == "heavy") d.kind = InputDist::Kind::heavy;
  else throw UsageError("unknown input distribution '" + kind + "' (expected normal or heavy)");
  if (!std::isfinite(scale) || scale < 1e-3 || scale > 1e3)
    throw UsageError("input scale must be a number in [0.001, 1000], got " + std::to_string(scale));
  d.scale = scale;
  return d;
}

InputDist parse_input_dist(const std::string& s) {
  const auto star = s.find('*');
  if (star == std::string::npos) return make_input_dist(s, 1.0);
  const std::string num = s.substr(star + 1);
  char* end = nullptr;
  const double scale = std::strtod(num.c_str(), &end);
  if (num.empty() || *end) throw UsageError("input distribution '" + s + "' is not <normal|heavy>[*<scale>]");
  return make_input_dist(s.substr(0, star), scale);
}

int dtype_bytes(DType t) { return t == DType::fp32 ? 4 : 2; }

// Keys of all sequences: B*Sk, or the cache lengths' sum (paged), or the packed keys (varlen).
static double key_rows(const Problem& p) {
  if (p.varlen.enabled()) return (double)p.varlen.total_k();
  if (!p.paged.enabled() || p.paged.seq_lens_k.empty()) return (double)p.batch * p.seq_k;
  double sum = 0;
  for (int len : p.paged.seq_lens_k) sum += len;
  return sum;
}

int check_window_edge(long long v, const std::string& what) {
  if (v < -1 || v > (1ll << 30))
    throw UsageError(what + " must be -1 (unbounded) or a key count in 0..1073741824, got " + std::to_string(v));
  return (int)v;
}

double check_softcap(double c, const std::string& what) {
  if (!std::isfinite(c) || c < 0 || (c != 0 && (c < 1e-3 || c > 1e6))) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", c);
    throw UsageError(what + " must be 0 (off) or a number in [0.001, 1000000], got " + buf);
  }
  return c;
}

std::pair<long long, long long> Problem::visible_keys(long long i, long long sq, long long sk) const {
  const long long diag = i + sk - sq;  // the bottom-right aligned diagonal: causal's last key
  long long first = 0, end = sk;
  if (window_left >= 0) first = std::max(first, diag - window_left);
  if (causal) end = std::min(end, diag + 1);
  if (window_right >= 0) end = std::min(end, diag + window_right + 1);
  return {first, std::max(first, end)};
}

void Problem::canonicalize_mask() {
  if (!causal && window_right == 0) causal = true;  // (L, 0) is causal with a left edge
  if (causal) window_right = -1;                    // causal is the right edge
}

// Visible (query, key) pairs of one sequence under the window (and causal), exactly.
static double visible_pairs(const Problem& p, long long sq, long long sk) {
  double n = 0;
  for (long long i = 0; i < sq; ++i) {
    const auto [first, end] = p.visible_keys(i, sq, sk);
    n += (double)(end - first);
  }
  return n;
}

double Problem::flops() const {
  double pairs = (double)seq_q * key_rows(*this);  // (query, key) pairs per head
  if (varlen.enabled()) {
    pairs = 0;
    for (size_t b = 0; b < varlen.seq_lens_q.size(); ++b) pairs += (double)varlen.seq_lens_q[b] * varlen.seq_lens_k[b];
  }
  double f = 4.0 * heads * pairs * head_dim;
  if (causal) f /= 2;
  if (windowed()) {  // the pairs the mask leaves, per sequence (O(Sq) each)
    pairs = 0;
    if (varlen.enabled())
      for (size_t b = 0; b < varlen.seq_lens_q.size(); ++b)
        pairs += visible_pairs(*this, varlen.seq_lens_q[b], varlen.seq_lens_k[b]);
    else if (paged.enabled() && !paged.seq_lens_k.empty())
      for (int len : paged.seq_lens_k) pairs += visible_pairs(*this, seq_q, len);
    else
      pairs = (double)batch * visible_pairs(*this, seq_q, seq_k);
    f = 4.0 * heads * pairs * head_dim;
  }
  return direction == "bwd" ? 2.5 * f : f;
}

double Problem::bytes() const {
  double e = dtype_bytes(dtype);
  // Per query head: Q, O, dO, dQ and LSE; per kv head: K, V, dK, dV. Varlen: the packed tokens; paged: the
  // keys the sequences hold.
  const double rows_q = varlen.enabled() ? (double)varlen.total_q() : (double)batch * seq_q;
  const double rows_k = key_rows(*this);
  const double h = heads, hk = kv_heads();
  if (direction == "bwd")  // read Q, K, V, O, dO, LSE; write dQ, dK, dV
    return h * rows_q * (e * head_dim * 5.0 + 4.0) + hk * rows_k * e * head_dim * 4.0;
  return h * rows_q * (e * head_dim * 2.0 + 4.0) + hk * rows_k * e * head_dim * 2.0;
}

long long Problem::rows_q() const {
  return (long long)heads * (varlen.enabled() ? varlen.total_q() : (long long)batch * seq_q);
}

// ---------------------------------------------------------------------------------------------
// Packed variable-length batches

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

long long sum_of(const std::vector<int>& v) {
  long long s = 0;
  for (int x : v) s += x;
  return s;
}

std::vector<int> offsets_of(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int x : lens) cu.push_back(cu.back() + x);
  return cu;
}

#ifndef FLASHTUNE_NO_JSON
// An integer field of the varlen object in [lo, hi], checked in its full range before converting.
int varlen_int(const nlohmann::json& j, const char* key, long long lo, long long hi) {
  if (!j.contains(key)) throw UsageError(std::string("varlen needs '") + key + "'");
  const auto& v = j.at(key);
  const bool ok = v.is_number_unsigned()  ? v.get<unsigned long long>() <= (unsigned long long)hi && (long long)v.get<unsigned long long>() >= lo
                  : v.is_number_integer() ? v.get<long long>() >= lo && v.get<long long>() <= hi
                                          : false;
  if (!ok)
    throw UsageError(std::string("varlen '") + key + "' must be an integer in " + std::to_string(lo) + ".." +
                     std::to_string(hi) + ", got " + brief(v.dump(), 60));
  return (int)v.get<long long>();
}

// A list of lengths in 0..2^20, 1..kMaxVarlenSeqs of them; `what` names the object in messages ("varlen").
std::vector<int> varlen_list(const nlohmann::json& j, const char* key, const char* what = "varlen") {
  const auto& v = j.at(key);
  if (!v.is_array() || v.empty() || v.size() > (size_t)kMaxVarlenSeqs)
    throw UsageError(std::string(what) + " '" + key + "' must be an array of 1.." + std::to_string(kMaxVarlenSeqs) +
                     " lengths");
  std::vector<int> out;
  for (const auto& x : v) {
    const bool ok = (x.is_number_unsigned() && x.get<unsigned long long>() <= (1u << 20)) ||
                    (x.is_number_integer() && x.get<long long>() >= 0 && x.get<long long>() <= (1 << 20));
    if (!ok) throw UsageError(std::string(what) + " '" + key + "' holds " + brief(x.dump(), 40) + ", not a length in 0..1048576");
    out.push_back((int)x.get<long long>());
  }
  return out;
}

// A seed field: an integer in 0..2^53 (exact in a double, so every JSON reader keeps it).
unsigned long long seed_field(const nlohmann::json& s, const char* what) {
  if (!s.is_number_integer() || (!s.is_number_unsigned() && s.get<long long>() < 0) ||
      (s.is_number_unsigned() && s.get<unsigned long long>() > (1ull << 53)))
    throw UsageError(std::string(what) + " 'seed' must be an integer in 0..2^53, got " + brief(s.dump(), 40));
  return s.get<unsigned long long>();
}

// "[1,17,128]", or "[64 seqs #1a2b3c4d]" past 8 entries (the hash of the canonical text).
std::string short_list(const std::vector<int>& v, const std::string& key) {
  if (v.size() > 8) return "[" + std::to_string(v.size()) + " seqs #" + content_hash(key).substr(0, 8) + "]";
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}
#endif  // FLASHTUNE_NO_JSON

}  // namespace

long long Varlen::total_q() const { return sum_of(seq_lens_q); }
long long Varlen::total_k() const { return sum_of(seq_lens_k); }
std::vector<int> Varlen::cu_seqlens_q() const { return offsets_of(seq_lens_q); }
std::vector<int> Varlen::cu_seqlens_k() const { return offsets_of(seq_lens_k); }

#ifndef FLASHTUNE_NO_JSON
nlohmann::json Varlen::description() const {
  nlohmann::json j = nlohmann::json::object();
  if (lengths == "uniform") {
    j = {{"lengths", "uniform"}, {"min", min}, {"max", max}, {"total_tokens", total_tokens}, {"seed", seed}};
  } else if (lengths == "fixed") {
    j = {{"lengths", "fixed"}, {"length", max}, {"total_tokens", total_tokens}};
  } else if (lengths == "list") {
    j["seq_lens"] = seq_lens_q;
    if (seq_lens_k != seq_lens_q) j["seq_lens_k"] = seq_lens_k;
  }
  return j;
}

std::string Varlen::key() const { return enabled() ? description().dump() : std::string(); }

std::string Varlen::str() const {
  if (lengths == "uniform")
    return "uniform " + std::to_string(min) + "-" + std::to_string(max) + " x" + std::to_string(total_tokens) +
           " seed " + std::to_string(seed);
  if (lengths == "fixed") return "fixed " + std::to_string(max) + " x" + std::to_string(total_tokens);
  if (lengths != "list") return "";
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return "[" + s + "]";
  };
  const bool self = seq_lens_k == seq_lens_q;
  if (seq_lens_q.size() <= 8) return list(seq_lens_q) + (self ? "" : "/" + list(seq_lens_k));
  return "[" + std::to_string(seq_lens_q.size()) + " seqs, " + std::to_string(total_q()) + (self ? "" : "/" + std::to_string(total_k())) +
         " tokens #" + content_hash(key()).substr(0, 8) + "]";
}

Varlen varlen_from_json(const nlohmann::json& j) {
  if (!j.is_object())
    throw UsageError("problem field 'varlen' must be an object like {\"lengths\": \"uniform\", \"min\": 256, \"max\": 4096, "
                     "\"total_tokens\": 16384, \"seed\": 0} or {\"seq_lens\": [..]}");
  Varlen v;
  const bool list = j.contains("seq_lens");
  if (j.contains("lengths")) {
    if (!j["lengths"].is_string()) throw UsageError("varlen 'lengths' must be \"uniform\", \"fixed\" or \"list\"");
    v.lengths = j["lengths"].get<std::string>();
    if (v.lengths != "uniform" && v.lengths != "fixed" && v.lengths != "list")
      throw UsageError("varlen 'lengths' must be \"uniform\", \"fixed\" or \"list\", got " + brief(j["lengths"].dump(), 40));
  } else if (list) {
    v.lengths = "list";
  } else {
    throw UsageError("varlen needs 'lengths' (\"uniform\" or \"fixed\") or 'seq_lens'");
  }
  if ((v.lengths == "list") != list) throw UsageError("varlen 'seq_lens' goes with \"lengths\": \"list\" (or no 'lengths')");
  // Each kind's own fields, nothing else.
  const std::vector<std::string> allowed =
      v.lengths == "uniform" ? std::vector<std::string>{"lengths", "min", "max", "total_tokens", "seed"}
      : v.lengths == "fixed" ? std::vector<std::string>{"lengths", "length", "total_tokens"}
                             : std::vector<std::string>{"lengths", "seq_lens", "seq_lens_k"};
  for (auto& [key, _] : j.items())
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      throw UsageError("unknown varlen field '" + brief(key, 40) + "' for lengths \"" + v.lengths + "\"");

  constexpr int kMaxLen = 1 << 20;
  auto draw = [&](auto next_length) {  // lengths until total_tokens, the last one cut to fit
    long long sum = 0;
    while (sum < v.total_tokens) {
      if ((int)v.seq_lens_q.size() == kMaxVarlenSeqs)
        throw UsageError("varlen: more than " + std::to_string(kMaxVarlenSeqs) + " sequences to reach total_tokens " +
                         std::to_string(v.total_tokens));
      const int len = (int)std::min<long long>(next_length(v.seq_lens_q.size()), v.total_tokens - sum);
      v.seq_lens_q.push_back(len);
      sum += len;
    }
  };
  if (v.lengths == "uniform") {
    v.min = varlen_int(j, "min", 1, kMaxLen);
    v.max = varlen_int(j, "max", 1, kMaxLen);
    if (v.min > v.max) throw UsageError("varlen 'min' (" + std::to_string(v.min) + ") is above 'max' (" + std::to_string(v.max) + ")");
    v.total_tokens = varlen_int(j, "total_tokens", 1, kMaxVarlenTokens);
    if (j.contains("seed")) v.seed = seed_field(j["seed"], "varlen");
    const uint64_t span = (uint64_t)(v.max - v.min) + 1;
    // Length i: min + (the high 32 bits of splitmix64(seed, i)) * span / 2^32, the same on every machine.
    draw([&](size_t i) {
      const uint64_t x = splitmix64(splitmix64(v.seed) ^ (uint64_t)i) >> 32;
      return (long long)v.min + (long long)((x * span) >> 32);
    });
  } else if (v.lengths == "fixed") {
    v.max = v.min = varlen_int(j, "length", 1, kMaxLen);
    v.total_tokens = varlen_int(j, "total_tokens", 1, kMaxVarlenTokens);
    draw([&](size_t) { return (long long)v.max; });
    v.min = 0;  // "length" alone describes it (kept in max)
  } else {
    v.seq_lens_q = varlen_list(j, "seq_lens");
  }
  v.seq_lens_k = v.seq_lens_q;
  if (j.contains("seq_lens_k")) {
    v.seq_lens_k = varlen_list(j, "seq_lens_k");
    if (v.seq_lens_k.size() != v.seq_lens_q.size())
      throw UsageError("varlen 'seq_lens_k' has " + std::to_string(v.seq_lens_k.size()) + " lengths, 'seq_lens' " +
                       std::to_string(v.seq_lens_q.size()));
  }
  for (const auto& [total, name] : {std::pair{v.total_q(), "query"}, std::pair{v.total_k(), "key"}})
    if (total < 1 || total > kMaxVarlenTokens)
      throw UsageError(std::string("varlen: ") + name + " lengths sum to " + std::to_string(total) + ", not 1.." +
                       std::to_string(kMaxVarlenTokens));
  return v;
}
#endif  // FLASHTUNE_NO_JSON

// ---------------------------------------------------------------------------------------------
// Paged K/V caches

#ifndef FLASHTUNE_NO_JSON
nlohmann::json Paged::description() const {
  if (!enabled()) return nlohmann::json::object();
  nlohmann::json j = {{"page_size", page_size}, {"seed", seed}};
  if (!seq_lens_k.empty()) j["seq_lens_k"] = seq_lens_k;
  if (layout != PageLayout::hnd) j["layout"] = to_string(layout);
  return j;
}

std::string Paged::key() const { return enabled() ? description().dump() : std::string(); }

std::string Paged::str() const {
  if (!enabled()) return "";
  std::string s = "page " + std::to_string(page_size) + " seed " + std::to_string(seed);
  if (!seq_lens_k.empty()) s += " lens " + short_list(seq_lens_k, key());
  if (layout != PageLayout::hnd) s += std::string(" ") + to_string(layout);
  return s;
}

Paged paged_from_json(const nlohmann::json& j) {
  if (!j.is_object())
    throw UsageError("problem field 'paged' must be an object like {\"page_size\": 256, \"seed\": 0, \"seq_lens_k\": [..]}");
  for (auto& [key, _] : j.items())
    if (key != "page_size" && key != "seed" && key != "seq_lens_k" && key != "layout")
      throw UsageError("unknown paged field '" + brief(key, 40) + "'");
  Paged pg;
  if (!j.contains("page_size")) throw UsageError("paged needs 'page_size'");
  const auto& ps = j["page_size"];
  // The full range checked before converting (an unsigned 2^32 + 256 is not 256).
  const long long v = ps.is_number_unsigned()  ? (ps.get<unsigned long long>() <= (1u << 20) ? (long long)ps.get<unsigned long long>() : -1)
                      : ps.is_number_integer() ? ps.get<long long>()
                                               : -1;
  // Keys come in 16-row MMA tiles: a page of another size would cut one.
  if (v < 16 || v > (1 << 20) || v % 16)
    throw UsageError("paged 'page_size' must be a multiple of 16 in 16..1048576, got " + brief(ps.dump(), 40));
  pg.page_size = (int)v;
  if (j.contains("seed")) pg.seed = seed_field(j["seed"], "paged");
  if (j.contains("seq_lens_k")) pg.seq_lens_k = varlen_list(j, "seq_lens_k", "paged");
  if (j.contains("layout")) {
    const auto& l = j["layout"];
    const std::optional<PageLayout> layout = l.is_string() ? page_layout_from_string(l.get<std::string>()) : std::nullopt;
    if (!layout)
      throw UsageError("paged 'layout' must be \"hnd\" (pools [num_pages, Hk, page_size, d]) or \"nhd\" ([num_pages, "
                       "page_size, Hk, d]), got " + brief(l.dump(), 40));
    pg.layout = *layout;
  }
  return pg;
}
#endif  // FLASHTUNE_NO_JSON

const char* to_string(PageLayout l) { return l == PageLayout::nhd ? "nhd" : "hnd"; }
std::optional<PageLayout> page_layout_from_string(const std::string& s) {
  if (s == "hnd") return PageLayout::hnd;
  if (s == "nhd") return PageLayout::nhd;
  return std::nullopt;
}

PageTable page_table(const Paged& pg, int batch, int seq_k) {
  PageTable t;
  if (!pg.enabled()) return t;
  const int P = pg.page_size;
  t.max_pages = (seq_k + P - 1) / P;
  t.cache_seqlens.resize((size_t)batch);
  std::vector<int> first(batch + 1, 0);  // sequence b's logical pages are pool pages [first[b], first[b+1]) before the shuffle
  for (int b = 0; b < batch; ++b) {
    t.cache_seqlens[b] = pg.seq_len(b, seq_k);
    first[b + 1] = first[b] + (t.cache_seqlens[b] + P - 1) / P;
  }
  t.num_pages = first[batch];
  std::vector<int> perm(t.num_pages);
  for (int i = 0; i < t.num_pages; ++i) perm[i] = i;
  const uint64_t stream = splitmix64(pg.seed ^ 0x7061676564ull);  // "paged"
  for (int i = t.num_pages - 1; i > 0; --i)
    std::swap(perm[i], perm[splitmix64(stream + (uint64_t)i) % (uint64_t)(i + 1)]);
  bool identity = true;
  for (int i = 0; i < t.num_pages && identity; ++i) identity = perm[i] == i;
  if (identity && t.num_pages > 1) std::swap(perm[0], perm[1]);  // a physical order that is not the logical one
  t.table.assign((size_t)batch * t.max_pages, -1);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < first[b + 1] - first[b]; ++j) t.table[(size_t)b * t.max_pages + j] = perm[first[b] + j];
  return t;
}

int seq_bucket_of(int seq) {
  int b = 1;
  while (b < seq) b *= 2;
  return b;
}

int Problem::seq_bucket() const { return seq_bucket_of(seq_q > seq_k ? seq_q : seq_k); }

bool MaskMod::has_values() const {
  return std::all_of(values.begin(), values.end(), [](const auto& v) { return v != nullptr; }) &&
         values.size() == predicate.names.size();
}

#ifndef FLASHTUNE_NO_JSON
namespace {

std::string values_digest(const std::vector<int32_t>& v) {
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i)
    for (int b = 0; b < 4; ++b) bytes[4 * i + b] = (char)(((uint32_t)v[i] >> (8 * b)) & 0xff);  // little-endian
  return content_hash(bytes);
}

// One tensor's values from its source (MaskMod's comment), or only its digest ({"digest": ...}).
void mask_tensor_from_json(const std::string& name, const nlohmann::json& src, MaskMod& m) {
  const std::string what = "mask_mod tensor '" + name + "'";
  auto values = std::make_shared<std::vector<int32_t>>();
  if (src.is_string()) {
    const std::string path = src.get<std::string>();
    struct stat st {};
    if (path.empty() || stat(path.c_str(), &st) != 0) throw UsageError(what + ": file '" + brief(path) + "' does not exist");
    if (!S_ISREG(st.st_mode)) throw UsageError(what + ": '" + brief(path) + "' is not a regular file");
    if (st.st_size == 0 || st.st_size % 4 != 0 || st.st_size / 4 > kMaxMaskTensorValues)
      throw UsageError(what + ": '" + brief(path) + "' must hold 1.." + std::to_string(kMaxMaskTensorValues) +
                       " little-endian int32 values (its size " + std::to_string((long long)st.st_size) + " bytes)");
    std::ifstream f(path, std::ios::binary);
    std::string bytes((size_t)st.st_size, '\0');
    if (!f.read(bytes.data(), (std::streamsize)bytes.size())) throw UsageError(what + ": cannot read '" + brief(path) + "'");
    values->resize(bytes.size() / 4);
    for (size_t i = 0; i < values->size(); ++i) {
      uint32_t x = 0;
      for (int b = 0; b < 4; ++b) x |= (uint32_t)(unsigned char)bytes[4 * i + b] << (8 * b);
      (*values)[i] = (int32_t)x;
    }
  } else if (src.is_array()) {
    if (src.empty() || (long long)src.size() > kMaxMaskTensorInline)
      throw UsageError(what + " must hold 1.." + std::to_string(kMaxMaskTensorInline) + " values inline (a file takes more)");
    for (const auto& v : src) {
      const bool ok = v.is_number_integer() && !(v.is_number_unsigned() && v.get<unsigned long long>() > (unsigned long long)INT32_MAX) &&
                      v.get<long long>() >= INT32_MIN && v.get<long long>() <= INT32_MAX;
      if (!ok) throw UsageError(what + " must hold int32 values, got " + brief(v.dump(), 40));
      values->push_back((int32_t)v.get<long long>());
    }
  } else if (src.is_object() && src.size() == 1 && src.contains("segments")) {
    const auto& lens = src["segments"];
    if (!lens.is_array() || lens.empty()) throw UsageError(what + ": 'segments' must be a non-empty array of lengths");
    long long total = 0;
    for (const auto& v : lens) {
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<unsigned long long>() > (unsigned long long)kMaxMaskTensorValues) ||
          v.get<long long>() < 1 || (total += v.get<long long>()) > kMaxMaskTensorValues)
        throw UsageError(what + ": 'segments' must be lengths >= 1 summing to at most " + std::to_string(kMaxMaskTensorValues) +
                         ", got " + brief(v.dump(), 40));
    }
    values->reserve((size_t)total);
    int32_t id = 0;
    for (const auto& v : lens) values->insert(values->end(), (size_t)v.get<long long>(), id++);
  } else if (src.is_object() && src.size() == 1 && src.contains("digest")) {
    const auto& d = src["digest"];
    if (!d.is_string() || d.get<std::string>().size() != 32 ||
        d.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      throw UsageError(what + ": 'digest' must be 32 lower-case hex digits");
    m.digests.push_back(d.get<std::string>());
    m.sources.push_back(src.dump());
    m.values.push_back(nullptr);
    return;
  } else {
    throw UsageError(what + " must be a file path, a list of int32 values, {\"segments\": [..]} or {\"digest\": ..}, got " +
                     brief(src.dump(), 40));
  }
  m.digests.push_back(values_digest(*values));
  m.sources.push_back(src.dump());
  m.values.push_back(std::move(values));
}

}  // namespace

MaskMod mask_mod_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw UsageError("problem field 'mask_mod' must be {\"predicate\": \"...\", \"tensors\": {...}}");
  for (auto& [key, _] : j.items())
    if (key != "predicate" && key != "tensors") throw UsageError("unknown mask_mod field '" + brief(key, 40) + "'");
  if (!j.contains("predicate") || !j["predicate"].is_string())
    throw UsageError("mask_mod needs a string 'predicate' (the body of bool mask(int b, int h, int q_idx, int kv_idx))");
  const nlohmann::json tensors = j.value("tensors", nlohmann::json::object());
  if (!tensors.is_object()) throw UsageError("mask_mod 'tensors' must be an object {\"name\": values}");
  std::vector<std::string> names;
  for (auto& [name, _] : tensors.items()) names.push_back(name);
  MaskMod m;
  m.predicate = make_mask_predicate(j["predicate"].get<std::string>(), names);  // names checked and sorted
  for (const std::string& n : m.predicate.names) mask_tensor_from_json(n, tensors[n], m);
  return m;
}

nlohmann::json MaskMod::description() const {
  nlohmann::json t = nlohmann::json::object();
  for (size_t i = 0; i < predicate.names.size(); ++i)
    t[predicate.names[i]] = sources[i].empty() ? nlohmann::json{{"digest", digests[i]}} : nlohmann::json::parse(sources[i]);
  // The normalised body, in the form it was given (an expression without its added return).
  const std::string text = predicate.expression ? predicate.body.substr(8, predicate.body.size() - 10) : predicate.body;
  return {{"predicate", text}, {"tensors", t}};
}

std::string MaskMod::key() const {
  if (!enabled()) return "";
  nlohmann::json t = nlohmann::json::object();
  for (size_t i = 0; i < predicate.names.size(); ++i) t[predicate.names[i]] = nlohmann::json{{"digest", digests[i]}};
  const std::string text = predicate.expression ? predicate.body.substr(8, predicate.body.size() - 10) : predicate.body;
  return nlohmann::json{{"predicate", text}, {"tensors", t}}.dump();
}

std::string MaskMod::str() const {
  std::string names;
  for (const auto& n : predicate.names) names += (names.empty() ? "" : ",") + n;
  return "mask_mod " + predicate.hash() + "(" + names + ")";
}

std::string Problem::str() const {
  std::string s = "B" + std::to_string(batch) + " H" + std::to_string(heads) +
                  (heads_k > 0 ? "/" + std::to_string(heads_k) : std::string()) + " Sq" + std::to_string(seq_q) +
                  " Sk" + std::to_string(seq_k) + " d" + std::to_string(head_dim) + " " + to_string(dtype);
  if (causal) s += " causal";
  if (direction != "fwd") s += " " + direction;
  if (varlen.enabled()) s += " varlen " + varlen.str();
  if (paged.enabled()) s += " paged " + paged.str();
  if (windowed()) s += " window " + std::to_string(window_left) + "," + std::to_string(window_right);
  if (softcapped()) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " softcap %.9g", softcap);
    s += buf;
  }
  if (alibi) s += " alibi";
  if (mask_mod.enabled()) s += " " + mask_mod.str();
  if (!(inputs == InputDist{})) s += " inputs " + inputs.str();
  return s;
}

// "window": [left, right], each an integer -1..2^30.
static void window_from_json(const nlohmann::json& w, Problem& p) {
  if (!w.is_array() || w.size() != 2)
    throw UsageError("problem field 'window' must be [left, right] (-1: unbounded), got " + brief(w.dump(), 60));
  int* edges[] = {&p.window_left, &p.window_right};
  const char* names[] = {"problem field 'window' left", "problem field 'window' right"};
  for (int e = 0; e < 2; ++e) {
    const auto& v = w[(size_t)e];
    if (!v.is_number_integer())
      throw UsageError(std::string(names[e]) + " must be an integer, got " + brief(v.dump(), 40));
    // The full range checked before converting (an unsigned 2^64 - 1 is not -1).
    const long long x = v.is_number_unsigned() && v.get<unsigned long long>() > (1ull << 30) ? (1ll << 31) : v.get<long long>();
    *edges[e] = check_window_edge(x, names[e]);
  }
}

static int positive_int(const nlohmann::json& j, const char* key, int max) {
  if (!j.contains(key)) throw UsageError(std::string("problem is missing '") + key + "'");
  const auto& v = j.at(key);
  // The full range is checked before converting (an unsigned 2^32 + 64 is not 64).
  const bool ok = v.is_number_unsigned()  ? v.get<unsigned long long>() >= 1 && v.get<unsigned long long>() <= (unsigned)max
                  : v.is_number_integer() ? v.get<long long>() >= 1 && v.get<long long>() <= max
                                          : false;
  if (!ok)
    throw UsageError(std::string("problem field '") + key + "' must be an integer in 1.." + std::to_string(max) +
                     ", got " + brief(v.dump(), 60));
  return (int)v.get<long long>();
}

// {"distribution": "normal" | "heavy", "scale": X}, both optional.
InputDist input_dist_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw UsageError("problem field 'inputs' must be an object like {\"distribution\": \"heavy\", \"scale\": 5}");
  for (auto& [key, _] : j.items())
    if (key != "distribution" && key != "scale") throw UsageError("unknown inputs field '" + key + "'");
  std::string kind = "normal";
  double scale = 1.0;
  if (j.contains("distribution")) {
    if (!j["distribution"].is_string()) throw UsageError("inputs 'distribution' must be \"normal\" or \"heavy\"");
    kind = j["distribution"].get<std::string>();
  }
  if (j.contains("scale")) {
    if (!j["scale"].is_number()) throw UsageError("inputs 'scale' must be a number, got " + brief(j["scale"].dump(), 60));
    scale = j["scale"].get<double>();
  }
  return make_input_dist(kind, scale);
}

nlohmann::json to_json(const InputDist& d) {
  return {{"distribution", d.kind == InputDist::Kind::normal ? "normal" : "heavy"}, {"scale", d.scale}};
}

Problem problem_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw UsageError("a problem must be a JSON object, got " + brief(j.dump(), 60));
  for (auto& [key, _] : j.items())
    if (key != "batch" && key != "heads" && key != "seq_q" && key != "seq_k" && key != "seq" && key != "head_dim" &&
        key != "dtype" && key != "causal" && key != "direction" && key != "inputs" && key != "heads_k" &&
        key != "varlen" && key != "paged" && key != "window" && key != "softcap" &&
        key != "alibi" && key != "mask_mod")
      throw UsageError("unknown problem field '" + key + "'");
  Problem p;
  if (j.contains("paged")) {
    p.paged = paged_from_json(j["paged"]);
    if (j.contains("varlen")) throw UsageError("problem fields 'paged' and 'varlen' do not combine");
    if (const auto& lens = p.paged.seq_lens_k; !lens.empty()) {
      // The batch and the longest cache length come from the lengths; given as well (to_json writes them),
      // they must agree.
      const int derived[] = {(int)lens.size(), std::max(1, *std::max_element(lens.begin(), lens.end()))};
      const char* keys[] = {"batch", "seq_k"};
      for (int i = 0; i < 2; ++i)
        if (j.contains(keys[i]) && (!j[keys[i]].is_number_integer() || j[keys[i]].get<long long>() != derived[i]))
          throw UsageError(std::string("problem field '") + keys[i] + "' is " + brief(j[keys[i]].dump(), 20) +
                           ", but the paged seq_lens_k give " + std::to_string(derived[i]) + " (leave it out)");
      if (j.contains("seq")) throw UsageError("problem field 'seq' goes with dense problems; a paged one with lengths takes 'seq_q'");
      p.batch = derived[0];
      p.seq_k = derived[1];
    }
  }
  if (j.contains("varlen")) {
    // The sequences' count and longest lengths come from the description; given as well (to_json
    // writes them), they must agree.
    p.varlen = varlen_from_json(j["varlen"]);
    const auto& lq = p.varlen.seq_lens_q;
    const auto& lk = p.varlen.seq_lens_k;
    const int derived[] = {(int)lq.size(), *std::max_element(lq.begin(), lq.end()), *std::max_element(lk.begin(), lk.end())};
    const char* keys[] = {"batch", "seq_q", "seq_k"};
    for (int i = 0; i < 3; ++i)
      if (j.contains(keys[i]) && (!j[keys[i]].is_number_integer() || j[keys[i]].get<long long>() != derived[i]))
        throw UsageError(std::string("problem field '") + keys[i] + "' is " + brief(j[keys[i]].dump(), 20) +
                         ", but the varlen lengths give " + std::to_string(derived[i]) + " (leave it out)");
    if (j.contains("seq")) throw UsageError("problem field 'seq' goes with dense problems; a varlen one has its lengths");
  }
  const bool paged_lengths = !p.paged.seq_lens_k.empty();  // batch and seq_k set above
  if (!paged_lengths) p.batch = p.varlen.enabled() ? (int)p.varlen.seq_lens_q.size() : positive_int(j, "batch", 1 << 20);
  p.heads = positive_int(j, "heads", 1 << 16);
  if (j.contains("heads_k")) {
    p.heads_k = positive_int(j, "heads_k", 1 << 16);
    if (p.heads % p.heads_k)
      throw UsageError("problem field 'heads_k' (" + std::to_string(p.heads_k) + ") must divide 'heads' (" +
                       std::to_string(p.heads) + ")");
    if (p.heads_k == p.heads) p.heads_k = 0;  // multi-head: one spelling, one store key
  }
  if (p.varlen.enabled()) {
    // The grid's lengths: the longest sequence's (at least 1, so that a dense formula never divides by 0).
    p.seq_q = std::max(1, *std::max_element(p.varlen.seq_lens_q.begin(), p.varlen.seq_lens_q.end()));
    p.seq_k = std::max(1, *std::max_element(p.varlen.seq_lens_k.begin(), p.varlen.seq_lens_k.end()));
  } else if (paged_lengths) {
    p.seq_q = positive_int(j, "seq_q", 1 << 20);
  } else if (j.contains("seq")) {
    p.seq_q = p.seq_k = positive_int(j, "seq", 1 << 20);
  } else {
    p.seq_q = positive_int(j, "seq_q", 1 << 20);
    p.seq_k = positive_int(j, "seq_k", 1 << 20);
  }
  p.head_dim = positive_int(j, "head_dim", 1024);
  if (j.contains("dtype")) {
    if (!j["dtype"].is_string()) throw UsageError("problem field 'dtype' must be a string");
    p.dtype = parse_dtype(j["dtype"].get<std::string>());
  }
  if (j.contains("causal")) {
    if (!j["causal"].is_boolean()) throw UsageError("problem field 'causal' must be true or false");
    p.causal = j["causal"].get<bool>();
  }
  if (j.contains("direction")) {
    if (!j["direction"].is_string() || (j["direction"] != "fwd" && j["direction"] != "bwd"))
      throw UsageError("problem field 'direction' must be \"fwd\" or \"bwd\", got " + brief(j["direction"].dump(), 60));
    p.direction = j["direction"].get<std::string>();
  }
  if (j.contains("inputs")) p.inputs = input_dist_from_json(j["inputs"]);
  if (j.contains("window")) window_from_json(j["window"], p);
  if (j.contains("softcap")) {
    if (!j["softcap"].is_number()) throw UsageError("problem field 'softcap' must be a number, got " + brief(j["softcap"].dump(), 40));
    p.softcap = check_softcap(j["softcap"].get<double>(), "problem field 'softcap'");
  }
  if (j.contains("alibi")) {
    if (!j["alibi"].is_boolean()) throw UsageError("problem field 'alibi' must be true or false, got " + brief(j["alibi"].dump(), 40));
    p.alibi = j["alibi"].get<bool>();
  }
  p.canonicalize_mask();
  if (j.contains("mask_mod")) {
    p.mask_mod = mask_mod_from_json(j["mask_mod"]);
    if (p.varlen.enabled() || p.paged.enabled())
      throw UsageError("mask_mod goes with dense problems (not 'varlen' or 'paged')");
    if (p.windowed())
      throw UsageError("mask_mod and 'window' do not combine: write the window in the predicate (kv_idx >= q_idx - L)");
  }
  if (p.varlen.enabled()) {  // packed tensors within int32 element offsets
    const long long eq = p.varlen.total_q() * p.heads * p.head_dim, ek = p.varlen.total_k() * p.kv_heads() * p.head_dim;
    if (eq > kMaxVarlenElements || ek > kMaxVarlenElements)
      throw UsageError("varlen: a packed tensor of " + std::to_string(std::max(eq, ek)) + " elements (tokens x heads x head_dim) is over 2^31 - 1");
  }
  if (p.paged.enabled()) {  // the block table (and the pool's page count) within int32 and host memory
    if (p.direction != "fwd") throw UsageError("problem field 'paged' goes with forward problems (decoding reads the cache)");
    const long long entries = (long long)p.batch * ((p.seq_k + p.paged.page_size - 1) / p.paged.page_size);
    if (entries > kMaxPageTableEntries)
      throw UsageError("paged: a block table of " + std::to_string(entries) + " entries (batch x pages per sequence) is over 2^24");
  }
  return p;
}

nlohmann::json to_json(const Problem& p) {
  nlohmann::json j = {{"batch", p.batch}, {"heads", p.heads}, {"seq_q", p.seq_q}, {"seq_k", p.seq_k},
                      {"head_dim", p.head_dim}, {"dtype", to_string(p.dtype)}, {"causal", p.causal},
                      {"direction", p.direction}, {"inputs", to_json(p.inputs)}};
  if (p.heads_k > 0) j["heads_k"] = p.heads_k;  // only for GQA: multi-head problems keep their keys and shards
  if (p.varlen.enabled()) j["varlen"] = p.varlen.description();  // only for varlen, likewise
  if (p.paged.enabled()) j["paged"] = p.paged.description();  // only for paged, likewise
  if (p.windowed()) j["window"] = {p.window_left, p.window_right};  // only when set, likewise
  if (p.softcapped()) j["softcap"] = p.softcap;
  if (p.alibi) j["alibi"] = true;
  if (p.mask_mod.enabled()) j["mask_mod"] = p.mask_mod.description();
  return j;
}
#endif  // FLASHTUNE_NO_JSON

std::string DeviceInfo::slug() const { return slugify(name); }

}  // namespace flashtune
