#include "tuner/space/space.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <iterator>
#include <fstream>
#include <set>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/util.hpp"

using nlohmann::json;

namespace flashtune {

namespace {

// Deeper nesting than any flashtune file needs is refused before the parser sees it, so that
// neither parsing nor destroying nor printing a hostile document can exhaust the stack.
void check_nesting(std::string_view text, const std::string& what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw UsageError(what + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace

json parse_json_bounded(std::string_view text, const std::string& what, size_t max_bytes) {
  if (text.size() > max_bytes) throw UsageError(what + " is larger than " + std::to_string(max_bytes >> 20) + " MiB");
  check_nesting(text, what);
  // A key given twice in one object is refused (the parser would keep the last one silently).
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    else if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    else if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
             duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text, callback);
  } catch (const json::exception& e) {
    throw UsageError(what + " is not valid JSON: " + brief(e.what(), 160));
  }
  if (!duplicate.empty()) throw UsageError(what + " gives the key '" + brief(duplicate) + "' twice in one object");
  return j;
}

std::string read_bounded_file(const std::string& path, size_t max_bytes) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw UsageError("cannot read '" + path + "': it does not exist");
  if (!S_ISREG(st.st_mode)) throw UsageError("cannot read '" + path + "': not a regular file");
  const std::string too_large = "'" + path + "' is larger than " + std::to_string(max_bytes >> 20) + " MiB";
  if ((unsigned long long)st.st_size > max_bytes) throw UsageError(too_large);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError("cannot read '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (text.size() > max_bytes) throw UsageError(too_large);
  return text;
}

json read_json_file(const std::string& path) {
  return parse_json_bounded(read_bounded_file(path, kMaxJsonBytes), "'" + path + "'");
}

std::string brief_json(const json& j) { return brief(j.dump(), 60); }

int json_int(const json& v, const std::string& what, long long lo, long long hi) {
  // The full range is checked before converting: 4294967424 is not 128.
  bool ok = false;
  long long x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<unsigned long long>();
    ok = u <= (unsigned long long)hi;
    x = ok ? (long long)u : 0;
  } else if (v.is_number_integer()) {
    x = v.get<long long>();
    ok = true;
  }
  if (!ok || x < lo || x > hi)
    throw UsageError(what + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " +
                     brief_json(v));
  return (int)x;
}

// A list of integers, duplicates dropped (first occurrence kept): a value is compiled once. Linear time: a
// million distinct values take a fraction of a second (hostile_inputs).
static std::vector<int> int_list(const json& j, const std::string& what) {
  if (!j.is_array() || j.empty()) throw UsageError(what + " must be a non-empty array of integers");
  std::vector<int> out;
  std::unordered_set<int> seen;
  for (const auto& v : j) {
    if (!v.is_number_integer()) throw UsageError(what + " must hold integers only, got " + brief_json(v));
    const int x = json_int(v, what, INT_MIN, INT_MAX);
    if (seen.insert(x).second) out.push_back(x);
  }
  return out;
}

Space space_from_json(const json& j, bool allow_large) {
  if (!j.is_object()) throw UsageError("a space must be a JSON object");
  for (auto& [key, _] : j.items())
    if (key != "family" && key != "params" && key != "head_dims" && key != "causal" && key != "dtypes" &&
        key != "description" && key != "varlen" && key != "paged" && key != "page_layouts" && key != "mods" &&
        key != "mask_mod")
      throw UsageError("unknown space field '" + key + "'");
  if (!j.contains("family") || !j["family"].is_string()) throw UsageError("space needs a string 'family'");
  Space s;
  s.family = &find_family(j["family"].get<std::string>());
  const Family& f = *s.family;

  const json params = j.value("params", json::object());
  if (!params.is_object()) throw UsageError("space 'params' must be an object");
  for (auto& item : params.items())
    if (const std::string& key = item.key();
        std::none_of(f.params.begin(), f.params.end(), [&](const ParamSpec& p) { return p.name == key; }))
      throw UsageError("family " + f.name + " has no parameter '" + key + "'");
  for (size_t i = 0; i < f.params.size(); ++i) {
    const ParamSpec& p = f.params[i];
    if (!params.contains(p.name)) {
      s.values.push_back({f.default_config[i]});  // unnamed: the default value
      continue;
    }
    auto vals = int_list(params[p.name], "parameter " + p.name);
    for (int v : vals)
      if (std::find(p.domain.begin(), p.domain.end(), v) == p.domain.end()) {
        std::string dom;
        for (int d : p.domain) dom += (dom.empty() ? "" : ",") + std::to_string(d);
        throw UsageError("parameter " + p.name + " = " + std::to_string(v) + " is outside its domain {" + dom + "}");
      }
    s.values.push_back(vals);
  }

  s.head_dims = j.contains("head_dims") ? int_list(j["head_dims"], "head_dims") : f.head_dims;
  for (int d : s.head_dims)
    if (std::find(f.head_dims.begin(), f.head_dims.end(), d) == f.head_dims.end())
      throw UsageError("family " + f.name + " does not support head_dim " + std::to_string(d));
  if (j.contains("causal")) {
    if (!j["causal"].is_array() || j["causal"].empty()) throw UsageError("space 'causal' must be an array of booleans");
    for (const auto& c : j["causal"]) {
      if (!c.is_boolean()) throw UsageError("space 'causal' must hold booleans, got " + brief_json(c));
      if (std::find(s.causal.begin(), s.causal.end(), c.get<bool>()) == s.causal.end()) s.causal.push_back(c.get<bool>());
    }
  } else {
    s.causal = {false, true};
  }
  if (j.contains("dtypes")) {
    if (!j["dtypes"].is_array() || j["dtypes"].empty()) throw UsageError("space 'dtypes' must be an array of strings");
    for (const auto& t : j["dtypes"]) {
      if (!t.is_string()) throw UsageError("space 'dtypes' must hold strings");
      DType d = parse_dtype(t.get<std::string>());
      if (std::find(f.dtypes.begin(), f.dtypes.end(), d) == f.dtypes.end())
        throw UsageError("family " + f.name + " does not support dtype " + t.get<std::string>());
      if (std::find(s.dtypes.begin(), s.dtypes.end(), d) == s.dtypes.end()) s.dtypes.push_back(d);
    }
  } else {
    s.dtypes = f.dtypes;
  }
  if (j.contains("varlen")) {
    if (!j["varlen"].is_array() || j["varlen"].empty()) throw UsageError("space 'varlen' must be an array of booleans");
    s.varlen.clear();
    for (const auto& c : j["varlen"]) {
      if (!c.is_boolean()) throw UsageError("space 'varlen' must hold booleans, got " + brief_json(c));
      if (c.get<bool>() && !f.varlen) throw UsageError("family " + f.name + " does not support packed variable-length batches");
      if (std::find(s.varlen.begin(), s.varlen.end(), c.get<bool>()) == s.varlen.end()) s.varlen.push_back(c.get<bool>());
    }
  }
  if (j.contains("paged")) {
    if (!j["paged"].is_array() || j["paged"].empty()) throw UsageError("space 'paged' must be an array of booleans");
    s.paged.clear();
    for (const auto& c : j["paged"]) {
      if (!c.is_boolean()) throw UsageError("space 'paged' must hold booleans, got " + brief_json(c));
      if (c.get<bool>() && !f.paged) throw UsageError("family " + f.name + " does not read paged K/V caches");
      if (std::find(s.paged.begin(), s.paged.end(), c.get<bool>()) == s.paged.end()) s.paged.push_back(c.get<bool>());
    }
  }
  if (j.contains("page_layouts")) {
    const auto& ls = j["page_layouts"];
    if (!ls.is_array() || ls.empty()) throw UsageError("space 'page_layouts' must be an array of \"hnd\" and \"nhd\"");
    s.page_layouts.clear();
    for (const auto& c : ls) {
      const std::optional<PageLayout> l = c.is_string() ? page_layout_from_string(c.get<std::string>()) : std::nullopt;
      if (!l) throw UsageError("space 'page_layouts' must hold \"hnd\" or \"nhd\", got " + brief_json(c));
      if (*l == PageLayout::nhd && !f.paged_nhd)
        throw UsageError("family " + f.name + " does not read token-major (nhd) paged K/V caches");
      if (std::find(s.page_layouts.begin(), s.page_layouts.end(), *l) == s.page_layouts.end()) s.page_layouts.push_back(*l);
    }
    if (std::find(s.paged.begin(), s.paged.end(), true) == s.paged.end())
      throw UsageError("space 'page_layouts' goes with \"paged\": [true] (the layouts of the paged form)");
  }
  if (j.contains("mods")) {
    if (!j["mods"].is_array() || j["mods"].empty())
      throw UsageError("space 'mods' must be an array of \"none\" or of \"window\", \"softcap\", \"alibi\", \"mask\" joined by '+'");
    s.mods.clear();
    for (const auto& c : j["mods"]) {
      const std::string name = c.is_string() ? c.get<std::string>() : std::string();
      unsigned m = 0;
      if (!mods_from_string(name, m))
        throw UsageError("space 'mods' holds \"none\" or \"window\", \"softcap\", \"alibi\", \"mask\" joined by '+' (\"window+softcap\"), got " +
                         brief_json(c));
      if (m & ~f.mods) throw UsageError("family " + f.name + " has no " + mods_string(m & ~f.mods) + " form");
      if ((m & kModMask) && (m & kModWindow)) throw UsageError("space 'mods': a mask does not combine with a window");
      if (std::find(s.mods.begin(), s.mods.end(), m) == s.mods.end()) s.mods.push_back(m);
    }
  }
  if (j.contains("mask_mod")) {  // the predicate alone: {"predicate": "...", "tensors": ["name", ...]}
    const json& mm = j["mask_mod"];
    if (!mm.is_object() || !mm.contains("predicate") || !mm["predicate"].is_string())
      throw UsageError("space 'mask_mod' must be {\"predicate\": \"...\", \"tensors\": [\"name\", ...]}");
    for (auto& [key, _] : mm.items())
      if (key != "predicate" && key != "tensors") throw UsageError("unknown space mask_mod field '" + brief(key, 40) + "'");
    std::vector<std::string> names;
    if (mm.contains("tensors")) {
      if (!mm["tensors"].is_array() || mm["tensors"].size() > (size_t)kMaxMaskTensors)
        throw UsageError("space mask_mod 'tensors' must be an array of at most " + std::to_string(kMaxMaskTensors) + " names");
      for (const auto& n : mm["tensors"]) {
        if (!n.is_string()) throw UsageError("space mask_mod 'tensors' must hold names, got " + brief_json(n));
        names.push_back(n.get<std::string>());
      }
    }
    s.mask = std::make_shared<const MaskPredicate>(make_mask_predicate(mm["predicate"].get<std::string>(), names));
  }
  for (unsigned m : s.mods)
    if ((m & kModMask) && !s.mask) throw UsageError("space 'mods' holds a mask: give the predicate as 'mask_mod'");
  if (!allow_large && s.size() > kMaxSpaceVariants)
    throw UsageError("the space has " + std::to_string(s.size()) + " variants, more than " +
                     std::to_string(kMaxSpaceVariants) + " (--allow-large-space to sweep it anyway)");
  return s;
}

unsigned long long Space::size() const {
  // Saturating product, computed before anything is materialised.
  unsigned long long n = 1;
  const unsigned long long cap = 1ull << 62;
  auto mul = [&](size_t k) { n = k == 0 ? 0 : (n > cap / k ? cap : n * k); };
  for (const auto& v : values) mul(v.size());
  mul(head_dims.size());
  mul(causal.size());
  mul(dtypes.size());
  mul(forms().size());
  mul(mods.size());
  return n;
}

Space load_space(const std::string& path, bool allow_large) {
  try {
    return space_from_json(read_json_file(path), allow_large);
  } catch (const UsageError& e) {
    throw UsageError(path + ": " + e.what());
  } catch (const json::exception& e) {  // a type error deep in the document is bad input too
    throw UsageError(path + ": " + brief(e.what(), 160));
  }
}

std::vector<Config> Space::configs() const {
  std::vector<Config> out{{}};
  for (const auto& vals : values) {
    std::vector<Config> next;
    for (const auto& prefix : out)
      for (int v : vals) {
        Config c = prefix;
        c.push_back(v);
        next.push_back(std::move(c));
      }
    out = std::move(next);
  }
  return out;
}

std::vector<Space::Form> Space::forms() const {
  std::vector<Form> out;
  for (bool packed : varlen)
    for (bool pg : paged)
      if (!(packed && pg)) {  // a kernel has one second form at most
        if (!pg) out.push_back({packed, pg});
        else
          for (PageLayout l : page_layouts) out.push_back({packed, pg, l});
      }
  return out;
}

std::vector<Variant> Space::variants() const {
  std::vector<Variant> out;
  for (int d : head_dims)
    for (bool c : causal)
      for (DType t : dtypes)
        for (const Form& fm : forms())
          for (unsigned m : mods)
            for (const auto& cfg : configs())
              out.push_back({family, cfg, d, c, t, fm.packed, fm.paged, m, fm.layout, (m & kModMask) ? mask : nullptr});
  return out;
}

std::vector<Variant> variants_for(const Space& s, const std::vector<Problem>& problems) {
  // A varlen problem takes the packed form of the space's variants, a paged one the paged form, a dense one
  // the dense form, whatever the space's own "varlen" and "paged" lists (which are for compile-check and the
  // NVRTC tests).
  Space dense = s;
  dense.varlen = {false};
  dense.paged = {false};
  dense.page_layouts = {PageLayout::hnd};
  dense.mods = {0};
  // The modifications the problems have, each a variant of its own (a mask_mod's with each predicate).
  std::vector<std::pair<unsigned, std::shared_ptr<const MaskPredicate>>> problem_mod_sets;
  for (const Problem& p : problems) {
    const unsigned m = problem_mods(p);
    const bool seen = std::any_of(problem_mod_sets.begin(), problem_mod_sets.end(), [&](const auto& e) {
      return e.first == m && (!(m & kModMask) || *e.second == p.mask_mod.predicate);
    });
    if (!seen)
      problem_mod_sets.push_back(
          {m, (m & kModMask) ? std::make_shared<const MaskPredicate>(p.mask_mod.predicate) : nullptr});
  }
  const std::vector<Space::Form> forms = {{false, false}, {true, false}, {false, true, PageLayout::hnd}, {false, true, PageLayout::nhd}};
  std::vector<Variant> out;
  for (const Variant& v : dense.variants())
    for (const Space::Form& fm : forms)
      for (const auto& [m, pred] : problem_mod_sets) {
        bool needed = false;
        for (const Problem& p : problems)
          needed |= p.head_dim == v.head_dim && p.causal == v.causal && p.dtype == v.dtype &&
                    p.direction == v.family->direction && p.varlen.enabled() == fm.packed &&
                    p.paged.enabled() == fm.paged && (!fm.paged || p.paged.layout == fm.layout) &&
                    problem_mods(p) == m && (!pred || *pred == p.mask_mod.predicate) &&
                    v.family->shape_reason(p).empty();
        if (!needed) continue;
        out.push_back(v);
        out.back().varlen = fm.packed;
        out.back().paged = fm.paged;
        out.back().mods = m;
        out.back().page_layout = fm.layout;
        out.back().mask = pred;
      }
  return out;
}

constexpr size_t kMaxProblems = 100000;  // a problem set's size (the committed ones hold at most hundreds)

std::vector<Problem> problems_from_json(const json& j) {
  if (!j.is_object()) throw UsageError("a problem set must be a JSON object");
  for (auto& [key, _] : j.items())
    if (key != "problems" && key != "grid" && key != "description" && key != "name")
      throw UsageError("unknown problem-set field '" + key + "'");
  std::vector<Problem> out;
  if (j.contains("problems")) {
    if (!j["problems"].is_array()) throw UsageError("'problems' must be an array");
    if (j["problems"].size() > kMaxProblems)
      throw UsageError("'problems' lists more than " + std::to_string(kMaxProblems) + " problems");
    for (const auto& p : j["problems"]) out.push_back(problem_from_json(p));
  }
  if (j.contains("grid")) {
    const json& g = j["grid"];
    if (!g.is_object()) throw UsageError("'grid' must be an object");
    for (auto& [key, _] : g.items())
      if (key != "tokens" && key != "hidden" && key != "seq" && key != "head_dim" && key != "causal" && key != "dtype" &&
          key != "direction" && key != "inputs")
        throw UsageError("unknown grid field '" + key + "'");
    if (!g.contains("tokens") || !g["tokens"].is_number_integer() || !g.contains("hidden") ||
        !g["hidden"].is_number_integer())
      throw UsageError("grid needs integer 'tokens' and 'hidden'");
    const int tokens = json_int(g["tokens"], "grid tokens", 1, INT_MAX),
              hidden = json_int(g["hidden"], "grid hidden", 1, INT_MAX);
    if (!g.contains("seq") || !g.contains("head_dim")) throw UsageError("grid needs 'seq' and 'head_dim'");
    const auto seqs = int_list(g["seq"], "grid seq"), dims = int_list(g["head_dim"], "grid head_dim");
    json causal = g.value("causal", json::array({false}));
    json dtypes = g.value("dtype", json::array({"fp32"}));
    if (!causal.is_array() || !dtypes.is_array()) throw UsageError("grid 'causal' and 'dtype' must be arrays");
    // Counted before any problem is made: a small file must not ask for billions of them.
    const double count = (double)dtypes.size() * dims.size() * causal.size() * seqs.size();
    if (count + out.size() > kMaxProblems)
      throw UsageError("the grid makes " + std::to_string((long long)count) + " problems, more than " +
                       std::to_string(kMaxProblems));
    for (const auto& t : dtypes)
      for (int d : dims)
        for (const auto& c : causal)
          for (int s : seqs) {
            if (s <= 0 || d <= 0 || tokens % s != 0 || hidden % d != 0)
              throw UsageError("grid: tokens " + std::to_string(tokens) + " / seq " + std::to_string(s) +
                               " and hidden " + std::to_string(hidden) + " / head_dim " + std::to_string(d) +
                               " must divide exactly");
            json pj = {{"batch", tokens / s}, {"heads", hidden / d}, {"seq", s}, {"head_dim", d},
                       {"causal", c}, {"dtype", t}, {"direction", g.value("direction", "fwd")}};
            if (g.contains("inputs")) pj["inputs"] = g["inputs"];  // {"distribution", "scale"}, as in a problem
            out.push_back(problem_from_json(pj));
          }
  }
  if (out.empty()) throw UsageError("the problem set is empty");
  return out;
}

std::vector<Problem> load_problems(const std::string& path) {
  try {
    return problems_from_json(read_json_file(path));
  } catch (const UsageError& e) {
    throw UsageError(path + ": " + e.what());
  } catch (const json::exception& e) {
    throw UsageError(path + ": " + brief(e.what(), 160));
  }
}

}  // namespace flashtune
