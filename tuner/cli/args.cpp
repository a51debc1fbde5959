#include "tuner/cli/args.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/family.hpp"
#include "core/mask_mod.hpp"
#include "core/problem.hpp"

namespace flashtune::cli {

bool plain_integer(const std::string& text, long long& v) {
  const size_t digits = text.rfind('-', 0) == 0 ? 1 : 0;
  if (text.size() == digits || text.find_first_not_of("0123456789", digits) != std::string::npos) return false;
  errno = 0;
  v = std::strtoll(text.c_str(), nullptr, 10);
  return errno == 0;
}

Args parse(int argc, char** argv, const std::set<std::string>& valued, const std::set<std::string>& flags) {
  Args a;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      a.positional.push_back(s);
      continue;
    }
    std::string key = s.substr(2), value;
    bool has_value = false;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_value = true;
    }
    if ((flags.count(key) || valued.count(key)) && a.opts.count(key))  // never "the last one wins" in silence
      throw UsageError("--" + key + " is given twice" + (key == "output" ? " (-o and --output are one option)" : ""));
    if (flags.count(key)) {
      if (has_value) throw UsageError("--" + key + " takes no value");
      a.opts[key] = "1";
    } else if (valued.count(key)) {
      if (!has_value) {
        if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)  // "-o -o": not a file named --output
          throw UsageError("--" + key + " needs a value");
        value = argv[++i];
      }
      a.opts[key] = value;
    } else {
      throw UsageError("unknown option --" + brief(key));
    }
  }
  return a;
}

void no_positional(const Args& a, const char* verb) {
  if (!a.positional.empty())
    throw UsageError(std::string(verb) + " takes no positional arguments, got '" + brief(a.positional[0]) + "'");
}

bool wants_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
  return false;
}

RunOptions run_options(const Args& a) {
  RunOptions o;
  o.device = (int)a.get_int("device", 0, 0, 64);
  o.timeout_s = a.get_double("timeout", 30);
  o.seed = (unsigned long long)a.get_int("seed", (long long)o.seed, 0, (1ll << 62));
  o.pause_us = (int)a.get_int("pause-us", 0, 0, 100000);
  return o;
}

InputDist input_dist_option(const Args& a, const InputDist& base) {
  if (!a.has("input-dist") && !a.has("input-scale")) return base;
  double scale = base.scale;
  if (a.has("input-scale")) {
    const std::string v = a.get("input-scale");
    char* end = nullptr;
    scale = std::strtod(v.c_str(), &end);
    if (v.empty() || *end) throw UsageError("--input-scale must be a number, got '" + v + "'");
  }
  const std::string kind =
      a.has("input-dist") ? a.get("input-dist") : (base.kind == InputDist::Kind::heavy ? "heavy" : "normal");
  return make_input_dist(kind, scale);
}

std::string data_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    const std::filesystem::path installed = std::filesystem::path(std::string(buf, (size_t)n)).parent_path().parent_path() / "data";
    std::error_code ec;
    if (std::filesystem::is_regular_file(installed / "reports" / "make_report.py", ec)) return installed.string();
  }
  return FLASHTUNE_SOURCE_DIR;
}

void require_file(const std::string& path, const char* what) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw UsageError(std::string(what) + " '" + path + "' does not exist");
}

ResultFilter filter_from(const Args& a) {
  ResultFilter f;
  f.family = a.get("family");
  f.device = a.get("device");
  f.dtype = a.get("dtype");
  if (!f.dtype.empty()) parse_dtype(f.dtype);
  f.head_dim = (int)a.get_int("d", 0, 1, 1024);
  f.causal = (int)a.get_int("causal", -1, 0, 1);
  if (!f.family.empty()) find_family(f.family);
  return f;
}

std::vector<char*> with_output_flag(int argc, char** argv) {
  static std::string long_flag = "--output";
  std::vector<char*> out(argv, argv + argc);
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "-o")) out[i] = long_flag.data();
  return out;
}

void mask_options(const Args& a, nlohmann::json& j) {
  if (a.has("window")) {
    const auto parts = split(a.get("window"), ',');
    if (parts.size() != 2) throw UsageError("--window must be L,R (-1: unbounded), got '" + brief(a.get("window")) + "'");
    nlohmann::json w = nlohmann::json::array();
    const char* names[] = {"--window L", "--window R"};
    for (int e = 0; e < 2; ++e) {
      long long v = 0;
      if (!plain_integer(trim(parts[(size_t)e]), v))
        throw UsageError(std::string(names[e]) + " must be an integer, got '" + brief(parts[(size_t)e]) + "'");
      w.push_back(check_window_edge(v, names[e]));
    }
    j["window"] = w;
  }
  if (a.has("softcap")) {
    const std::string& t = a.get("softcap");
    char* end = nullptr;
    errno = 0;
    const double c = std::strtod(t.c_str(), &end);
    if (t.empty() || *end || errno) throw UsageError("--softcap must be a number, got '" + brief(t) + "'");
    j["softcap"] = check_softcap(c, "--softcap");
  }
  if (a.has("alibi")) j["alibi"] = true;
  if (a.has("mask-tensor") && !a.has("mask-mod")) throw UsageError("--mask-tensor goes with --mask-mod");
  if (a.has("mask-mod")) {  // the problem file's "mask_mod" object; the predicate and names checked by its parser
    nlohmann::json tensors = nlohmann::json::object();
    if (a.has("mask-tensor"))
      for (const std::string& item : split(a.get("mask-tensor"), ',')) {
        const size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
          throw UsageError("--mask-tensor must be NAME=FILE[,NAME=FILE...] (raw int32 files), got '" + brief(item) + "'");
        const std::string name = trim(item.substr(0, eq));
        if (tensors.contains(name)) throw UsageError("--mask-tensor names '" + brief(name) + "' twice");
        tensors[name] = item.substr(eq + 1);
      }
    j["mask_mod"] = {{"predicate", a.get("mask-mod")}, {"tensors", tensors}};
  }
}

void check_mask_mods_compile(const std::vector<Problem>& problems) {
  std::vector<MaskPredicate> checked;
  for (const Problem& p : problems)
    if (p.mask_mod.enabled() && std::find(checked.begin(), checked.end(), p.mask_mod.predicate) == checked.end()) {
      check_mask_compiles(p.mask_mod.predicate);
      checked.push_back(p.mask_mod.predicate);
    }
}

}  // namespace flashtune::cli
