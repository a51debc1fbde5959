#include "tuner/interop/t4.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <istream>
#include <set>
#include <streambuf>
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
  // Windowed or softcapped only (problem_from_json's fields), likewise.
  if (p.windowed()) j["window"] = {p.window_left, p.window_right};
  if (p.softcapped()) j["softcap"] = p.softcap;
  if (p.alibi) j["alibi"] = true;
  if (p.mask_mod.enabled()) j["mask_mod"] = ordered_json::parse(p.mask_mod.key());  // digests: identity, not values
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
  if (!is_utc_timestamp(r.created))
    in.fail("'timestamp' must be a UTC time as YYYY-MM-DDTHH:MM:SSZ, got '" + brief(r.created) + "'");
  try {
    check_result_row(r);  // device name and arch
  } catch (const UsageError& e) {
    in.fail(e.what());
  }
  return r;
}

// The document's top level: schema_version and metadata, each checked as soon as it is read.
void check_version(const json& v, const Reader& top) {
  const std::string version = top.str(v, "schema_version", 32);
  const auto parts = split(version, '.');
  if (parts.size() != 3 || parts[0] != "1" ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& x) { return x.empty() || x.find_first_not_of("0123456789") != std::string::npos; }))
    top.fail("schema_version '" + brief(version) + "' is not a T4 1.x.y version");
}
void check_metadata(const json& m, const Reader& top) {
  if (!m.is_object()) top.fail("'metadata' must be an object");
  if (m.contains("timeunit") && m["timeunit"] != "milliseconds")
    top.fail("metadata.timeunit must be \"milliseconds\", got " + brief_json(m["timeunit"]));
}

// The file's bytes, read in chunks into the parser and hashed on the way (never held whole). `consumed()`:
// the bytes the parser has taken so far, for the size bounds of one value.
class HashingFileBuf : public std::streambuf {
 public:
  HashingFileBuf(int fd, size_t max_bytes, std::string prefix) : fd_(fd), max_(max_bytes) { hash_.update(prefix); }
  size_t consumed() const { return total_ - (size_t)(egptr() - gptr()); }
  size_t total() const { return total_; }
  bool too_large() const { return too_large_; }
  bool long_token() const { return long_token_; }
  std::string hash() const { return hash_.hex(); }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (too_large_ || long_token_) return traits_type::eof();
    ssize_t n;
    do n = ::read(fd_, buf_, sizeof buf_);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return traits_type::eof();  // a read error ends the document: the parser says where
    total_ += (size_t)n;
    if (total_ > max_) {  // it grew past the bound after the size check
      too_large_ = true;
      return traits_type::eof();
    }
    hash_.update(std::string_view(buf_, (size_t)n));
    scan(std::string_view(buf_, (size_t)n));
    setg(buf_, buf_, buf_ + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  // The parser holds a string or number whole (twice, with its raw text): one longer than kMaxT4ValueBytes
  // ends the input after this chunk, so that no token costs more than that.
  void scan(std::string_view chunk) {
    for (const char c : chunk) {
      if (in_string_) {
        if (escaped_) escaped_ = false;
        else if (c == '\\') escaped_ = true;
        else if (c == '"') in_string_ = false, run_ = 0;
      } else if (c == '"') {
        in_string_ = true, run_ = 0;
      } else if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '{' || c == '}' || c == '[' || c == ']' ||
                 c == ',' || c == ':') {
        run_ = 0;
      }
      if (++run_ > kMaxT4ValueBytes) long_token_ = true;
    }
  }

  int fd_;
  size_t max_, total_ = 0, run_ = 0;
  bool too_large_ = false, long_token_ = false, in_string_ = false, escaped_ = false;
  ContentHasher hash_;
  char buf_[1 << 16];
};

// SAX events of one T4 document: the top level is followed as it streams; each element of "results" and each
// other top-level value is built alone (at most kMaxT4ValueBytes of the file), checked, handed to on_result
// and dropped, so memory does not grow with the file. The first error is kept and the rest of the document is
// only scanned (no value built), so that a syntax error anywhere wins as it did when the file was parsed whole.
class T4Stream final : public nlohmann::json_sax<json> {
 public:
  T4Stream(const HashingFileBuf& in, std::function<void(ResultRecord&&)> on_result)
      : in_(in), on_result_(std::move(on_result)) {}

  long long results() const { return index_; }
  bool saw(const std::string& key) const { return seen_.count(key) > 0; }
  const std::string& error() const { return error_; }
  const std::string& syntax_error() const { return syntax_; }

  bool null() override { return scalar(json(nullptr)); }
  bool boolean(bool v) override { return scalar(json(v)); }
  bool number_integer(number_integer_t v) override { return scalar(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return scalar(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return scalar(json(v)); }
  bool string(string_t& v) override { return scalar(json(std::move(v))); }
  bool binary(binary_t&) override { return true; }  // never in JSON text

  bool start_object(std::size_t) override {
    if (!open(true)) return false;
    if (building()) {
      json* p = put(json::object());
      stack_.push_back(p);
      keys_.emplace_back();
    }
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {  // the document's own keys
      if (!error_.empty()) return true;
      if (!seen_.insert(k).second) return duplicate(k);
      if (k != "schema_version" && k != "metadata" && k != "results")
        return semantic("the file: a T4 document has an unknown field '" + brief(k) + "'");
      top_key_ = k;
      return true;
    }
    if (!building() || stack_.empty()) return true;
    if (!keys_.back().insert(k).second) return duplicate(k);
    element_ = &(*stack_.back())[k];
    return bounded();
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    if (!open(false)) return false;
    if (building()) stack_.push_back(put(json::array()));
    return true;
  }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    syntax_ = "is not valid JSON: " + brief(e.what(), 160);
    return false;
  }

 private:
  // A value is built when it is a result or a top-level value other than results, and no error was found.
  bool building() const { return error_.empty() && build_; }

  bool semantic(const std::string& what) {
    if (error_.empty()) error_ = what;
    build_ = false;
    stack_.clear();
    keys_.clear();
    return true;  // scanned on: a later syntax error wins
  }
  bool duplicate(const std::string& k) { return semantic("gives the key '" + brief(k) + "' twice in one object"); }
  bool bounded() {
    if (in_.consumed() - value_start_ <= kMaxT4ValueBytes) return true;
    return semantic(where() + " is larger than " + std::to_string(kMaxT4ValueBytes >> 20) +
                    " MiB: no result is that large");
  }
  std::string where() const {
    return top_key_ == "results" ? "results[" + std::to_string(index_) + "]" : "the file: '" + top_key_ + "'";
  }

  // A value begins: the document's object (depth 0), a top-level value (depth 1) or a result (depth 2 of results).
  void begin_value() {
    if (depth_ == 0 || !error_.empty()) return;
    if (depth_ == 1 && top_key_ == "results") return;  // the array itself is never built (open(), scalar())
    if (depth_ == 1 || (depth_ == 2 && in_results_)) {
      build_ = true;
      value_start_ = in_.consumed();
      root_ = json();
    }
  }
  // Where the next value goes: the root, the open array's end, or the object member named last.
  json* put(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
      return &stack_.back()->back();
    }
    *element_ = std::move(v);
    return element_;
  }
  bool scalar(json&& v) {
    if (depth_ == 0) return semantic("the file: a T4 document must be an object");
    if (depth_ == 1 && top_key_ == "results" && error_.empty()) return semantic("the file: 'results' must be an array");
    begin_value();
    if (!building()) return true;
    put(std::move(v));
    if (!bounded()) return true;
    if (stack_.empty()) done();
    return true;
  }
  bool open(bool object) {
    if (depth_ == 0 && !object) semantic("the file: a T4 document must be an object");
    if (depth_ == 1 && top_key_ == "results" && error_.empty()) {
      if (object) semantic("the file: 'results' must be an array");
      else in_results_ = true;
    }
    begin_value();
    if (++depth_ > kMaxJsonDepth) {
      syntax_ = "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      return false;
    }
    if (building()) bounded();
    return true;
  }
  bool close() {
    --depth_;
    if (depth_ == 1 && in_results_) {  // the end of results
      in_results_ = false;
      return true;
    }
    if (!building() || stack_.empty()) return true;
    if (stack_.back()->is_object()) keys_.pop_back();
    stack_.pop_back();
    if (stack_.empty()) done();
    return true;
  }
  // A built value is complete: a result is checked and handed on (on_result's throws go through: they are
  // not the file's), a top-level value checked.
  void done() {
    build_ = false;
    const json value = std::move(root_);
    root_ = json();
    ResultRecord r;
    try {
      if (in_results_) {
        const std::string at = "results[" + std::to_string(index_) + "]";
        r = read_result(value, Reader{at});
        const Problem& p = r.problem;
        lengths_ += (long long)(p.varlen.seq_lens_q.size() + p.varlen.seq_lens_k.size() + p.paged.seq_lens_k.size());
        if (lengths_ > kMaxResultLengths)
          Reader{"the file"}.fail("its packed and paged problems hold more than " + std::to_string(kMaxResultLengths) +
                                  " sequence lengths in all (at " + at + "): import it in parts");
      } else if (top_key_ == "schema_version") {
        check_version(value, Reader{"the file"});
      } else if (top_key_ == "metadata") {
        check_metadata(value, Reader{"the file"});
      }
    } catch (const UsageError& e) {
      semantic(e.what());
      return;
    }
    if (in_results_) {
      ++index_;
      on_result_(std::move(r));
    }
  }

  const HashingFileBuf& in_;
  std::function<void(ResultRecord&&)> on_result_;
  int depth_ = 0;
  bool in_results_ = false, build_ = false;
  std::string top_key_;
  std::set<std::string> seen_;  // the document's keys (three at most before an unknown one stops the reading)
  json root_;                   // the value being built
  std::vector<json*> stack_;    // its open arrays and objects
  std::vector<std::set<std::string>> keys_;  // the keys of each open object, for duplicates
  json* element_ = nullptr;     // the member named by the last key
  size_t value_start_ = 0;
  long long index_ = 0, lengths_ = 0;
  std::string error_, syntax_;
};

// The T4 file, opened once: a regular file of at most kMaxT4Bytes (never a FIFO that would block).
struct T4File {
  int fd = -1;
  explicit T4File(const std::string& path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) throw UsageError("cannot read '" + path + "': it does not exist");
    if (!S_ISREG(st.st_mode)) throw UsageError("cannot read '" + path + "': not a regular file");
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) throw UsageError("cannot read '" + path + "'");
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw UsageError("cannot read '" + path + "': not a regular file");
    if ((unsigned long long)st.st_size > kMaxT4Bytes)
      throw UsageError("'" + path + "' is larger than " + std::to_string(kMaxT4Bytes >> 20) + " MiB");
  }
  ~T4File() {
    if (fd >= 0) ::close(fd);
  }
  T4File(const T4File&) = delete;
  T4File& operator=(const T4File&) = delete;
};

struct StreamSummary {
  long long results = 0;
  size_t bytes = 0;
  std::string hash;  // content_hash("flashtune-t4\n" + the file's bytes)
};

// One pass over the file from its start: every result checked and handed to on_result in file order. Throws
// UsageError (one line, naming the file) at the end on the first problem found.
StreamSummary stream_t4(const T4File& f, const std::string& file, const std::function<void(ResultRecord&&)>& on_result) {
  if (lseek(f.fd, 0, SEEK_SET) != 0) throw UsageError("cannot read '" + file + "'");
  HashingFileBuf buf(f.fd, kMaxT4Bytes, "flashtune-t4\n");
  std::istream is(&buf);
  T4Stream sax(buf, on_result);
  const std::string name = "'" + file + "'";
  try {
    json::sax_parse(is, &sax, json::input_format_t::json, true);
  } catch (const json::exception& e) {
    throw UsageError(name + " is not valid JSON: " + brief(e.what(), 160));
  }
  if (buf.long_token())
    throw UsageError(name + " holds a string or number longer than " + std::to_string(kMaxT4ValueBytes >> 20) + " MiB");
  if (buf.too_large()) throw UsageError(name + " is larger than " + std::to_string(kMaxT4Bytes >> 20) + " MiB");
  if (!sax.syntax_error().empty()) throw UsageError(name + " " + sax.syntax_error());
  if (!sax.error().empty()) {
    const std::string& what = sax.error();
    throw UsageError(what.rfind("gives the key", 0) == 0 ? name + " " + what : name + ": " + what);
  }
  const Reader top{"the file"};
  try {
    if (!sax.saw("schema_version")) top.fail("'schema_version' is missing");
    if (!sax.saw("results")) top.fail("'results' is missing");
  } catch (const UsageError& e) {
    throw UsageError(name + ": " + e.what());
  }
  return {sax.results(), buf.total(), buf.hash()};
}

}  // namespace

void t4_export(Store& store, const ResultFilter& filter, const std::function<void(std::string_view)>& write) {
  std::vector<ResultRecord> rows = store.results(filter);  // bounded: ReadBudget
  // Ordered by family, device, SM count, direction, dtype, head dim, mask, shape, heads, kv heads, lengths,
  // pages, inputs, config and kernel (so an export of the same rows is the same file). The keys' derived
  // strings (a packed problem's lengths are a JSON text) are made once per row, not in each of some 20
  // comparisons; the rest is compared in place, so no row's text is copied for the sort.
  struct Derived {
    std::string varlen, paged, inputs;
  };
  std::vector<Derived> derived;
  derived.reserve(rows.size());
  for (const auto& r : rows) derived.push_back({r.problem.varlen.key(), r.problem.paged.key(), r.problem.inputs.str()});
  auto key = [&](size_t i) {
    const ResultRecord& r = rows[i];
    return std::tie(r.family, r.device_name, r.sm_count, r.direction);
  };
  auto rest = [&](size_t i) {
    const ResultRecord& r = rows[i];
    const Problem& p = r.problem;
    return std::make_tuple(std::string_view(to_string(p.dtype)), p.head_dim, p.causal, p.seq_q, p.seq_k, p.batch, p.heads,
                           p.heads_k, std::string_view(derived[i].varlen), std::string_view(derived[i].paged),
                           std::string_view(derived[i].inputs), std::string_view(r.config), std::string_view(r.kernel_hash));
  };
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto ka = key(a), kb = key(b);
    if (ka != kb) return ka < kb;
    return rest(a) < rest(b);
  });
  derived = {};
  // First every row checked (and written, to nothing): a refusal writes nothing. Then the head, then the rows,
  // one line each, written as they are made: the document is never held whole.
  std::string earliest;
  std::set<DeviceSignature> devices;
  for (const size_t i : order) {
    const ResultRecord& r = rows[i];
    try {
      check_result_row(r);
      (void)t4_result(r).dump();  // a string that is not UTF-8 refused here, not halfway through the output
    } catch (const UsageError& e) {
      throw UsageError("'" + store.path() + "': results row " + std::to_string(r.id) + ": " + e.what());
    } catch (const nlohmann::json::exception& e) {
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
  write(text + ",\"results\":[");
  bool first = true;
  for (const size_t i : order) {
    write((first ? "\n" : ",\n") + t4_result(rows[i]).dump());
    first = false;
  }
  write(first ? "]}\n" : "\n]}\n");
}

std::string t4_export(Store& store, const ResultFilter& filter) {
  std::string text;
  t4_export(store, filter, [&](std::string_view piece) { text += piece; });
  return text;
}

ImportSummary t4_import(const std::string& file, const std::string& db) {
  check_db_path(db);
  const T4File f(file);
  // First pass: every result checked and its device noted; nothing kept, nothing written.
  std::set<DeviceSignature> devices;
  const StreamSummary first = stream_t4(f, file, [&](ResultRecord&& r) {
    devices.insert({r.device_name, r.arch, r.sm_count, r.driver_version});
    if (devices.size() > kMaxT4Devices)
      throw UsageError("'" + file + "': its results name more than " + std::to_string(kMaxT4Devices) +
                       " devices: import it in parts");
  });
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
  out.transaction([&] {
    s = ImportSummary{};
    s.total = first.results;
    check_devices(out.device_signatures());
    if (auto p = out.find_provenance(first.hash)) {
      s.already = true;
      s.provenance_id = p->id;
      return;
    }
    Provenance p;
    p.kind = "import";
    p.source = std::filesystem::absolute(file).lexically_normal().string();
    p.content_hash = first.hash;
    s.provenance_id = out.add_provenance(p);
    // Second pass: the results copied as they are read, in this one transaction (a throw rolls all back).
    const StreamSummary second = stream_t4(f, file, [&](ResultRecord&& r) {
      const Copied c = out.copy_result(r, s.provenance_id);
      (c == Copied::added ? s.added : c == Copied::present ? s.present : s.differ)++;
    });
    if (second.hash != first.hash || second.bytes != first.bytes || second.results != first.results)
      throw UsageError("'" + file + "' changed while it was imported: nothing imported");
    out.set_provenance_counts(s.provenance_id, 0, s.added, 0);
  });
  return s;
}

}  // namespace flashtune
