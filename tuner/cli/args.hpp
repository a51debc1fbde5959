// Shared argument handling of the flashtune verbs: --key value / --key=value / --flag parsing with
// each verb's accepted keys, --help detection, and the options several verbs take (device, timeout,
// seed, input distribution, result filters, "-o"), plus where the CLI's scripts live.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/util.hpp"
#include "results/select.hpp"
#include "tuner/sweep/sweep.hpp"

namespace flashtune::cli {

// A decimal integer written plainly: an optional '-' and digits (no spaces, no '+', no hex), in range.
bool plain_integer(const std::string& text, long long& v);

// --key value / --key=value / --flag, with the set of keys each command accepts.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> opts;
  bool has(const std::string& k) const { return opts.count(k); }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = opts.find(k);
    return it == opts.end() ? def : it->second;
  }
  long long get_int(const std::string& k, long long def, long long lo, long long hi) const {
    if (!has(k)) return def;
    const std::string& s = opts.at(k);
    long long v = 0;
    if (!plain_integer(s, v) || v < lo || v > hi)
      throw UsageError("--" + k + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                       ", got '" + brief(s) + "'");
    return v;
  }
  double get_double(const std::string& k, double def, double hi = 1e6) const {
    if (!has(k)) return def;
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(opts.at(k).c_str(), &end);
    if (opts.at(k).empty() || *end || errno || !std::isfinite(v) || !(v > 0) || v > hi)
      throw UsageError("--" + k + " must be a positive number up to " + std::to_string((long long)hi) + ", got '" +
                       brief(opts.at(k)) + "'");
    return v;
  }
};

// --window L,R (each -1 or 0..2^30) and --softcap C (0 or in [0.001, 1e6]) into a problem's JSON (the fields
// "window" and "softcap"), checked here so that the message names the flag; the flag --alibi sets "alibi". Absent
// flags leave j alone.
// --mask-mod TEXT (the body of bool mask(int b, int h, int q_idx, int kv_idx)) and --mask-tensor NAME=FILE[,...]
// into the problem's "mask_mod" object (its parser checks both).
void mask_options(const Args& a, nlohmann::json& j);
// Each distinct mask_mod predicate of the problems compiled alone (check_mask_compiles): its NVRTC error as one
// UsageError line, before any other work.
void check_mask_mods_compile(const std::vector<Problem>& problems);

// Parses argv[2..] with the keys a verb accepts (valued: take a value; flags: take none). An option given
// twice is refused, as is an unknown one.
Args parse(int argc, char** argv, const std::set<std::string>& valued, const std::set<std::string>& flags);
// For a verb that takes no positional argument: one is refused, never ignored.
void no_positional(const Args& a, const char* verb);

// --help or -h anywhere after the verb.
bool wants_help(int argc, char** argv);

// --device, --timeout, --seed.
RunOptions run_options(const Args& a);

// --input-dist and --input-scale over `base` (either alone keeps the other from base).
InputDist input_dist_option(const Args& a, const InputDist& base);

// Where the scripts the CLI runs (reports/make_report.py, experiments/baselines.py) live: the installed
// package's data folder beside this binary's bin/ (the wheel: flashtune/bin/flashtune, flashtune/data/),
// else the source tree this binary was built from.
std::string data_dir();

// Exit 2 with "<what> '<path>' does not exist" unless the path exists.
void require_file(const std::string& path, const char* what);

// --family, --device, --dtype, --d, --causal as a result filter (best, emit, export).
ResultFilter filter_from(const Args& a);

// merge and export take "-o FILE" as well as "--output FILE".
std::vector<char*> with_output_flag(int argc, char** argv);

}  // namespace flashtune::cli
