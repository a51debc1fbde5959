#include "tuner/interop/t4.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/family.hpp"
#include "core/util.hpp"
#include "tuner/interop/merge.hpp"
#include "tuner/space/space.hpp"

using nlohmann::json;
using nlohmann::ordered_json;

namespace flashtune {

namespace {

constexpr const char* kT4Version = "1.0.0";

const char* invalidity_of(const std::string& status) {
  if (status == "ok") return "correct";
  if (status == "invalid") return "correctness";
  if (status == "compile_error") return "compile";
  if (status == "pruned") return "constraints";
  if (status == "timeout") return "timeout";
  return "runtime";  // crashed, launch_error, error
}

// The result columns that T4 carries as measurements: name, unit, range [0, max], integer or not.
struct Measure {
  const char* name;
  const char* unit;
  double max;
  bool integer;
  double (*get)(const ResultRecord&);
  void (*set)(ResultRecord&, double);
};
const Measure kMeasures[] = {
    {"time", "ms", 1e9, false, [](const ResultRecord& r) { return r.ms_median; }, [](ResultRecord& r, double v) { r.ms_median = v; }},
    {"time_p20", "ms", 1e9, false, [](const ResultRecord& r) { return r.ms_p20; }, [](ResultRecord& r, double v) { r.ms_p20 = v; }},
    {"time_p80", "ms", 1e9, false, [](const ResultRecord& r) { return r.ms_p80; }, [](ResultRecord& r, double v) { r.ms_p80 = v; }},
    {"reps", "", 1e9, true, [](const ResultRecord& r) { return (double)r.reps; }, [](ResultRecord& r, double v) { r.reps = (int)v; }},
    {"tflops", "TFLOP/s", 1e4, false, [](const ResultRecord& r) { return r.tflops; }, [](ResultRecord& r, double v) { r.tflops = v; }},
    {"gbps", "GB/s", 1e7, false, [](const ResultRecord& r) { return r.gbps; }, [](ResultRecord& r, double v) { r.gbps = v; }},
    {"max_abs", "", 1e300, false, [](const ResultRecord& r) { return r.max_abs; }, [](ResultRecord& r, double v) { r.max_abs = v; }},
    {"max_rel", "", 1e300, false, [](const ResultRecord& r) { return r.max_rel; }, [](ResultRecord& r, double v) { r.max_rel = v; }},
    {"mse", "", 1e300, false, [](const ResultRecord& r) { return r.mse; }, [](ResultRecord& r, double v) { r.mse = v; }},
    {"registers", "", 65536, true, [](const ResultRecord& r) { return (double)r.res.registers; }, [](ResultRecord& r, double v) { r.res.registers = (int)v; }},
    {"smem_static", "B", 1 << 30, true, [](const ResultRecord& r) { return (double)r.res.smem_static; }, [](ResultRecord& r, double v) { r.res.smem_static = (int)v; }},
    {"spill_stores", "B", 1 << 30, true, [](const ResultRecord& r) { return (double)r.res.spill_stores; }, [](ResultRecord& r, double v) { r.res.spill_stores = (int)v; }},
};

// JSON has no infinities or NaN: such a value travels as a string.
ordered_json measure_value(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

auto sort_key(const ResultRecord& r) {
  const Problem& p = r.problem;
  return std::make_tuple(r.family, r.device_name, r.sm_count, r.direction, std::string(to_string(p.dtype)), p.head_dim,
                         p.causal, p.seq_q, p.seq_k, p.batch, p.heads, p.heads_k, p.varlen.key(), p.paged.key(), p.inputs.str(), r.config,
                         r.kernel_hash);
}

ordered_json problem_json(const Problem& p) {
  ordered_json j;
  j["batch"] = p.batch; j["heads"] = p.heads;
  if (p.heads_k > 0) j["heads_k"] = p.heads_k;  // GQA only: multi-head rows export as before
  j["seq_q"] = p.seq_q; j["seq_k"] = p.seq_k; j["head_dim"] = p.head_dim;
  j["dtype"] = to_string(p.dtype); j["causal"] = p.causal; j["direction"] = p.direction;
  j["inputs"] = {{"distribution", p.inputs.kind == InputDist::Kind::heavy ? "heavy" : "normal"}, {"scale", p.inputs.scale}};
  // Varlen only: the lengths' description (batch, seq_q and seq_k above are the count and longest lengths).
  if (p.varlen.enabled()) j["varlen"] = ordered_json::parse(p.varlen.key());
  // Paged only: the cache's description (seq_k above is its longest length).
  if (p.paged.enabled()) j["paged"] = ordered_json::parse(p.paged.key());
  return j;
}

ordered_json device_json(const std::string& name, const std::string& arch, int sm_count, int driver) {
  ordered_json j;
  j["name"] = name; j["arch"] = arch; j["sm_count"] = sm_count; j["driver_version"] = driver;
  return j;
}

ordered_json t4_result(const ResultRecord& r) {
  const Family& f = find_family(r.family);
  const Config c = f.parse_config(r.config);
  ordered_json t;
  t["timestamp"] = r.created;
  t["configuration"] = ordered_json::object();
  for (size_t i = 0; i < f.params.size(); ++i) t["configuration"][f.params[i].name] = c[i];
  t["objectives"] = {"time", "tflops"};
  t["times"] = {{"runtimes", r.status == "ok" ? ordered_json::array({r.ms_median}) : ordered_json::array()}};
  t["invalidity"] = invalidity_of(r.status);
  t["correctness"] = r.status == "ok" ? 1 : 0;
  t["measurements"] = ordered_json::array();
  for (const Measure& m : kMeasures) {
    const double v = m.get(r);
    const bool objective = r.status == "ok" && (!std::strcmp(m.name, "time") || !std::strcmp(m.name, "tflops"));
    if (v == 0 && !objective) continue;
    const ordered_json value = m.integer ? ordered_json((long long)v) : measure_value(v);
    t["measurements"].push_back({{"name", m.name}, {"value", value}, {"unit", m.unit}});
  }
  ordered_json ft;
  ft["family"] = r.family;
  // A row stored before a tunable existed names fewer of them ("...,DQ_RED=0" without LOAD): the
  // stored text goes along, so that an import stores the same row.
  if (r.config != f.config_string(c)) ft["config"] = r.config;
  ft["problem"] = problem_json(r.problem);
  ft["status"] = r.status;
  if (!r.error.empty()) ft["error"] = r.error;
  ft["kernel_hash"] = r.kernel_hash;
  ft["seed"] = r.seed;
  ft["device"] = device_json(r.device_name, r.arch, r.sm_count, r.driver_version);
  ft["nvrtc_version"] = r.nvrtc_version;
  ft["options"] = r.options;
  ft["source_hash"] = r.source_hash;
  if (!r.detail.empty()) {  // stored as JSON text: an object when it parses, else the text
    ordered_json d = ordered_json::parse(r.detail, nullptr, false);
    ft["detail"] = d.is_object() ? d : ordered_json(r.detail);
  }
  t["flashtune"] = std::move(ft);
  return t;
}

// --- import: every field checked, named by its place in the file -----------------------------

struct Reader {
  std::string where;  // "results[12]"

  [[noreturn]] void fail(const std::string& what) const { throw UsageError(where + ": " + what); }

  void only_keys(const json& j, const std::string& what, std::initializer_list<const char*> keys) const {
    if (!j.is_object()) fail(what + " must be an object");
    for (const auto& [k, _] : j.items())
      if (std::none_of(keys.begin(), keys.end(), [&key = k](const char* x) { return key == x; }))
        fail(what + " has an unknown field '" + brief(k) + "'");
  }
  const json& need(const json& j, const char* key) const {
    if (!j.contains(key)) fail("'" + std::string(key) + "' is missing");
    return j.at(key);
  }
  // A string of at most max bytes; control characters refused unless allowed.
  std::string str(const json& v, const std::string& what, size_t max, bool control_ok = false) const {
    if (!v.is_string()) fail(what + " must be a string, got " + brief_json(v));
    std::string s = v.get<std::string>();
    if (s.size() > max) fail(what + " is longer than " + std::to_string(max) + " bytes");
    if (!control_ok && brief(s, max) != s) fail(what + " holds control characters: '" + brief(s) + "'");
    return s;
  }
  // The full range is checked before converting: 4294967424 is not 128.
  long long integer(const json& v, const std::string& what, long long lo, long long hi) const {
    bool ok = false;
    long long x = 0;
    if (v.is_number_unsigned()) {
      ok = v.get<unsigned long long>() <= (unsigned long long)hi;
      if (ok) x = (long long)v.get<unsigned long long>();
    } else if (v.is_number_integer()) {
      ok = true;
      x = v.get<long long>();
    }
    if (!ok || x < lo || x > hi)
      fail(what + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + brief_json(v));
    return x;
  }
};

ResultRecord read_result(const json& t, const Reader& in) {
  in.only_keys(t, "a result", {"timestamp", "configuration", "objectives", "times", "invalidity", "correctness",
                               "measurements", "flashtune"});
  const json& ft = in.need(t, "flashtune");
  in.only_keys(ft, "'flashtune'", {"family", "config", "problem", "status", "error", "kernel_hash", "seed", "device",
                                   "nvrtc_version", "options", "source_hash", "detail"});
  ResultRecord r;
  const std::string family = in.str(in.need(ft, "family"), "flashtune.family", 64);
  const Family* fp = nullptr;
  try {
    fp = &find_family(family);
  } catch (const UsageError& e) {
    in.fail(e.what());
  }
  const Family& f = *fp;
  r.family = f.name;
  r.direction = f.direction;

  // configuration: exactly the family's tunables, each an integer in its domain
  const json& cfg = in.need(t, "configuration");
  if (!cfg.is_object()) in.fail("'configuration' must be an object");
  std::string kv;
  for (const auto& [k, v] : cfg.items()) {
    if (std::none_of(f.params.begin(), f.params.end(), [&key = k](const ParamSpec& p) { return p.name == key; }))
      in.fail("family " + f.name + " has no tunable '" + brief(k) + "'");
    kv += (kv.empty() ? "" : ",") + k + "=" + std::to_string(in.integer(v, "configuration." + k, -(1ll << 31), (1ll << 31) - 1));
  }
  for (const auto& p : f.params)
    if (!cfg.contains(p.name)) in.fail("configuration has no " + p.name + " (family " + f.name + ")");
  try {
    const Config c = f.parse_config(kv);
    r.config = f.config_string(c);
    if (ft.contains("config")) {  // the stored text, naming the same values
      const std::string text = in.str(ft["config"], "flashtune.config", 1024);
      if (f.parse_config(text) != c) in.fail("flashtune.config '" + brief(text) + "' is not the configuration");
      r.config = text;
    }
  } catch (const UsageError& e) {
    in.fail(e.what());
  }

  try {
    r.problem = problem_from_json(in.need(ft, "problem"));
  } catch (const UsageError& e) {
    in.fail(std::string("flashtune.problem: ") + e.what());
  }
  const Problem& p = r.problem;
  if (p.direction != f.direction) in.fail("family " + f.name + " computes " + f.direction + ", the problem is " + p.direction);
  if (std::find(f.dtypes.begin(), f.dtypes.end(), p.dtype) == f.dtypes.end())
    in.fail("family " + f.name + " does not support dtype " + to_string(p.dtype));
  if (std::find(f.head_dims.begin(), f.head_dims.end(), p.head_dim) == f.head_dims.end())
    in.fail("family " + f.name + " does not support head_dim " + std::to_string(p.head_dim));
  if (const std::string why = f.shape_reason(p); !why.empty()) in.fail("family " + f.name + " " + why);

  // status, and T4's invalidity and correctness that must say the same
  r.status = in.str(in.need(ft, "status"), "flashtune.status", 32);
  const std::string invalidity = in.str(in.need(t, "invalidity"), "'invalidity'", 32);
  if (!is_result_status(r.status)) in.fail("unknown status '" + brief(r.status) + "'");
  if (invalidity != invalidity_of(r.status))
    in.fail("invalidity '" + brief(invalidity) + "' does not go with status " + r.status + " (" + invalidity_of(r.status) + ")");
  const json& correct = in.need(t, "correctness");
  if (!correct.is_number() || correct.get<double>() != (r.status == "ok" ? 1.0 : 0.0))
    in.fail("correctness must be " + std::string(r.status == "ok" ? "1" : "0") + " for status " + r.status + ", got " + brief_json(correct));
  if (ft.contains("error")) r.error = in.str(ft["error"], "flashtune.error", 1 << 16, true);

  // measurements: known names with their units, once each
  const json& ms = in.need(t, "measurements");
  if (!ms.is_array()) in.fail("'measurements' must be an array");
  std::vector<bool> seen(std::size(kMeasures), false);
  for (const auto& m : ms) {
    in.only_keys(m, "a measurement", {"name", "value", "unit"});
    const std::string name = in.str(in.need(m, "name"), "a measurement's name", 64);
    auto it = std::find_if(std::begin(kMeasures), std::end(kMeasures), [&](const Measure& x) { return name == x.name; });
    if (it == std::end(kMeasures)) in.fail("unknown measurement '" + brief(name) + "'");
    const size_t i = (size_t)(it - std::begin(kMeasures));
    if (seen[i]) in.fail("measurement " + name + " is given twice");
    seen[i] = true;
    const std::string unit = in.str(in.need(m, "unit"), "measurement " + name + "'s unit", 16);
    if (unit != it->unit) in.fail("measurement " + name + " must be in '" + it->unit + "', got '" + brief(unit) + "'");
    const json& v = in.need(m, "value");
    double x = 0;
    if (v.is_string() && !it->integer && it->max >= 1e300 && (v == "inf" || v == "-inf" || v == "nan")) {  // errors only
      x = v == "nan" ? std::nan("") : v == "inf" ? INFINITY : -INFINITY;
    } else if (it->integer) {
      x = (double)in.integer(v, "measurement " + name, 0, (long long)it->max);
    } else {
      if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > it->max)
        in.fail("measurement " + name + " must be a number in 0.." + brief(json(it->max).dump()) + ", got " + brief_json(v));
      x = v.get<double>();
    }
    it->set(r, x);
  }

  // A valid row's figures decide `best` and `run --best`: a time above zero, TFLOP/s below 10^4.
  if (r.status == "ok" && !(r.ms_median > 0)) in.fail("measurement time must be above 0 for status ok");

  // objectives and times: T4's shapes; runtimes hold the median or nothing
  if (t.contains("objectives")) {
    if (!t["objectives"].is_array()) in.fail("'objectives' must be an array of names");
    for (const auto& o : t["objectives"]) in.str(o, "an objective", 64);
  }
  const json& times = in.need(t, "times");
  if (!times.is_object()) in.fail("'times' must be an object");
  for (const auto& [k, v] : times.items()) {
    if (k == "runtimes") {
      if (!v.is_array() || v.size() > 1 || (v.size() == 1 && (!v[0].is_number() || v[0].get<double>() != r.ms_median)))
        in.fail("times.runtimes must be [] or [the time measurement], got " + brief_json(v));
    } else if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
      in.fail("times." + brief(k) + " must be a non-negative number");
    }
  }

  r.kernel_hash = in.str(in.need(ft, "kernel_hash"), "flashtune.kernel_hash", 128);
  if (r.kernel_hash.empty() || r.kernel_hash.find(' ') != std::string::npos)
    in.fail("flashtune.kernel_hash must be a non-empty string without spaces");
  r.seed = (unsigned long long)in.integer(in.need(ft, "seed"), "flashtune.seed", 0, (long long)(~0ull >> 1));
  const json& dev = in.need(ft, "device");
  in.only_keys(dev, "flashtune.device", {"name", "arch", "sm_count", "driver_version"});
  r.device_name = in.str(in.need(dev, "name"), "flashtune.device.name", 256);
  r.arch = in.str(in.need(dev, "arch"), "flashtune.device.arch", 16);
  r.sm_count = (int)in.integer(in.need(dev, "sm_count"), "flashtune.device.sm_count", 1, 4096);
  r.driver_version = (int)in.integer(in.need(dev, "driver_version"), "flashtune.device.driver_version", 0, 100000000);
  r.nvrtc_version = in.str(in.need(ft, "nvrtc_version"), "flashtune.nvrtc_version", 64);
  r.options = in.str(in.need(ft, "options"), "flashtune.options", 4096);
  r.source_hash = in.str(in.need(ft, "source_hash"), "flashtune.source_hash", 128);
  if (ft.contains("detail")) {
    const json& d = ft["detail"];
    if (!d.is_object() && !d.is_string()) in.fail("flashtune.detail must be an object or a string");
    r.detail = d.is_string() ? d.get<std::string>() : d.dump();
    if (r.detail.size() > (1 << 16)) in.fail("flashtune.detail is longer than 65536 bytes");
  }
  r.created = t.contains("timestamp") ? in.str(t["timestamp"], "'timestamp'", 64) : now_iso8601();
  static const std::regex iso8601("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?Z");
  if (!std::regex_match(r.created, iso8601))
    in.fail("'timestamp' must be a UTC time as YYYY-MM-DDTHH:MM:SSZ, got '" + brief(r.created) + "'");
  try {
    check_result_row(r);  // device name and arch
  } catch (const UsageError& e) {
    in.fail(e.what());
  }
  return r;
}

std::vector<ResultRecord> read_t4(const json& doc) {
  const Reader top{"the file"};
  top.only_keys(doc, "a T4 document", {"schema_version", "metadata", "results"});
  const std::string version = top.str(top.need(doc, "schema_version"), "schema_version", 32);
  const auto parts = split(version, '.');
  if (parts.size() != 3 || parts[0] != "1" ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& x) { return x.empty() || x.find_first_not_of("0123456789") != std::string::npos; }))
    top.fail("schema_version '" + brief(version) + "' is not a T4 1.x.y version");
  if (doc.contains("metadata")) {
    const json& m = doc["metadata"];
    if (!m.is_object()) top.fail("'metadata' must be an object");
    if (m.contains("timeunit") && m["timeunit"] != "milliseconds")
      top.fail("metadata.timeunit must be \"milliseconds\", got " + brief_json(m["timeunit"]));
  }
  const json& results = top.need(doc, "results");
  if (!results.is_array()) top.fail("'results' must be an array");
  std::vector<ResultRecord> out;
  long long lengths = 0;  // the packed and paged problems' sequence lengths, bounded as a store's read is
  for (size_t i = 0; i < results.size(); ++i) {
    out.push_back(read_result(results[i], Reader{"results[" + std::to_string(i) + "]"}));
    const Problem& p = out.back().problem;
    lengths += (long long)(p.varlen.seq_lens_q.size() + p.varlen.seq_lens_k.size() + p.paged.seq_lens_k.size());
    if (lengths > kMaxResultLengths)
      top.fail("its packed and paged problems hold more than " + std::to_string(kMaxResultLengths) +
               " sequence lengths in all (at results[" + std::to_string(i) + "]): import it in parts");
  }
  return out;
}

}  // namespace

std::string t4_export(Store& store, const ResultFilter& filter) {
  std::vector<ResultRecord> rows = store.results(filter);
  std::sort(rows.begin(), rows.end(), [](const ResultRecord& a, const ResultRecord& b) { return sort_key(a) < sort_key(b); });
  std::string lines, earliest;
  std::set<DeviceSignature> devices;
  for (const auto& r : rows) {
    try {
      check_result_row(r);
      lines += (lines.empty() ? "\n" : ",\n") + t4_result(r).dump();
    } catch (const UsageError& e) {
      throw UsageError("'" + store.path() + "': results row " + std::to_string(r.id) + ": " + e.what());
    }
    devices.insert({r.device_name, r.arch, r.sm_count, r.driver_version});
    if (earliest.empty() || r.created < earliest) earliest = r.created;
  }
  ordered_json meta;
  meta["timeunit"] = "milliseconds";
  meta["compute_api"] = "CUDA";
  meta["autotuner"] = "flashtune";
  if (devices.size() == 1) meta["device"] = devices.begin()->name;
  if (!earliest.empty()) meta["timestamp"] = earliest;
  meta["flashtune"]["devices"] = ordered_json::array();
  for (const auto& d : devices) meta["flashtune"]["devices"].push_back(device_json(d.name, d.arch, d.sm_count, d.driver_version));
  ordered_json head;
  head["schema_version"] = kT4Version;
  head["metadata"] = std::move(meta);
  // One result per line: the head's closing brace is replaced by the results array.
  std::string text = head.dump();
  text.pop_back();
  return text + ",\"results\":[" + lines + (lines.empty() ? "]}\n" : "\n]}\n");
}

ImportSummary t4_import(const std::string& file, const std::string& db) {
  check_db_path(db);
  const std::string text = read_bounded_file(file, kMaxT4Bytes);
  std::vector<ResultRecord> rows;
  try {
    rows = read_t4(parse_json_bounded(text, "'" + file + "'", kMaxT4Bytes));
  } catch (const UsageError& e) {
    const std::string what = e.what();
    throw UsageError(what.rfind("'" + file + "'", 0) == 0 ? what : "'" + file + "': " + what);
  }
  std::set<DeviceSignature> devices;
  for (const auto& r : rows) devices.insert({r.device_name, r.arch, r.sm_count, r.driver_version});
  auto check_devices = [&](const std::set<DeviceSignature>& stored) {
    if (const std::string why = device_mismatch({stored, devices}, {db, file}); !why.empty())
      throw UsageError("cannot import: " + why);
  };
  // The store, if it holds anything, is checked read-only first: a refused import creates nothing.
  struct stat st {};
  if (stat(db.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    Store existing(db, Store::Mode::read_only);
    check_devices(existing.device_signatures());
  }
  Store out(db);
  ImportSummary s;
  const std::string hash = content_hash("flashtune-t4\n" + text);
  out.transaction([&] {
    s = ImportSummary{};
    s.total = (long long)rows.size();
    check_devices(out.device_signatures());
    if (auto p = out.find_provenance(hash)) {
      s.already = true;
      s.provenance_id = p->id;
      return;
    }
    Provenance p;
    p.kind = "import";
    p.source = std::filesystem::absolute(file).lexically_normal().string();
    p.content_hash = hash;
    s.provenance_id = out.add_provenance(p);
    for (const auto& r : rows) {
      const Copied c = out.copy_result(r, s.provenance_id);
      (c == Copied::added ? s.added : c == Copied::present ? s.present : s.differ)++;
    }
    out.set_provenance_counts(s.provenance_id, 0, s.added, 0);
  });
  return s;
}

}  // namespace flashtune
