// flashtune: the command line. Each verb validates its arguments and fails with one line
// and exit code 2 on bad input; stored results are never touched by a failing command.
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/compile.hpp"
#include "core/input_files.hpp"
#include "core/util.hpp"
#include "results/emit.hpp"
#include "results/select.hpp"
#include "results/store.hpp"
#include "tuner/experiments/experiment.hpp"
#include "tuner/interop/merge.hpp"
#include "tuner/interop/t4.hpp"
#include "tuner/search/search.hpp"
#include "tuner/space/space.hpp"
#include "tuner/sweep/sweep.hpp"
#include "user_store.hpp"

extern char** environ;

using namespace flashtune;
using nlohmann::json;

namespace {

constexpr const char* kUsage = R"(usage: flashtune <command> [options]

commands:
  devices                               list CUDA devices (through the worker)
  families [--json]                     the kernel families: direction, dtypes, head dims, tunables, default
  problems <problems.json> [--json]     a problem set as flashtune reads it (varlen: the lengths), FLOPs
  compile-check <space.json> [--arch sm_90]
                                        compile (or prune, with the reason) every variant of a space
  tune <space.json> <problems.json> [--db PATH] [--device N] [--timeout S] [--seed N] [--arch A]
      [--input-dist normal|heavy] [--input-scale X]
                                        sweep: compile, run, validate, time and store every candidate
  run --family F (--params K=V,... | --best) --shape B,H,Sq,Sk,d [--dtype fp32] [--causal]
      [--direction fwd|bwd] [--seed N] [--check] [--check-determinism] [--json] [--db PATH] [--device N]
      [--inputs DIR] [--save-outputs DIR] [--input-dist normal|heavy] [--input-scale X] [--heads-k N]
      (varlen: --shape H,d with --varlen FILE|JSON or --seq-lens L,.. [--seq-lens-k L,..])
                                        one config on one problem, validated, timed
  best --db PATH [--family F] [--device NAME] [--dtype T] [--d N] [--causal 0|1] [--csv]
                                        the best valid config per problem, with TFLOP/s
  emit --db PATH --out DIR              per-GPU best-config headers plus dispatch.hpp
  experiment <experiment.json> [--db PATH] [--dry-run] [--device N] [--timeout S] [--seed N]
                                        every implementation of an experiment on its problems, stored
  report --db PATH [--out DIR]          REPORT.md, CSVs and plots from a store (--gpu SLUG: reports/SLUG/results.db)
  drop-cubins --db PATH                 strip compiled binaries from a store (for committing it)
  merge A.db B.db ... -o OUT.db         stores (shards, machines) into one; the same input twice adds nothing
  export --db PATH [--format t4] [-o FILE]
                                        results in the T4 auto-tuning format (Kernel Tuner, KTT)
  import --db PATH FILE.json            a T4 file exported by flashtune into a store

every command takes --help.
)";

// A decimal integer written plainly: an optional '-' and digits (no spaces, no '+', no hex), in range.
bool plain_integer(const std::string& text, long long& v) {
  const size_t digits = text.rfind('-', 0) == 0 ? 1 : 0;
  if (text.size() == digits || text.find_first_not_of("0123456789", digits) != std::string::npos) return false;
  errno = 0;
  v = std::strtoll(text.c_str(), nullptr, 10);
  return errno == 0;
}

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

bool wants_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
  return false;
}

std::string command_line(int argc, char** argv) {
  std::string s = "flashtune";
  for (int i = 1; i < argc; ++i) s += std::string(" ") + argv[i];
  return s;
}

RunOptions run_options(const Args& a) {
  RunOptions o;
  o.device = (int)a.get_int("device", 0, 0, 64);
  o.timeout_s = a.get_double("timeout", 30);
  o.seed = (unsigned long long)a.get_int("seed", (long long)o.seed, 0, (1ll << 62));
  return o;
}

// --input-dist and --input-scale over `base` (either alone keeps the other from base).
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

// Where the scripts the CLI runs (reports/make_report.py, experiments/baselines.py) live: the installed
// package's data folder beside this binary's bin/ (the wheel: flashtune/bin/flashtune, flashtune/data/),
// else the source tree this binary was built from.
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

// ---------------------------------------------------------------------------------------
int cmd_devices(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune devices [--device N] [--slug | --store | --json]\nDescribes the CUDA device the worker sees; --slug prints only\n"
              "its report folder name (\"nvidia-h100-80gb-hbm3\"); --store only the path of the user's store for it,\n"
              "which the runtime reads with no environment variable ($XDG_CACHE_HOME/flashtune/<slug>.db, else\n"
              "~/.cache/flashtune/<slug>.db; flashtune.tune fills it); --json all of it as one JSON object\n"
              "(index, name, arch, slug, store, sm_count, memory_bytes, driver_version). Exit 1 without a GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {"device"}, {"slug", "store", "json"});
  if (a.has("slug") + a.has("store") + a.has("json") > 1) throw UsageError("give one of --slug, --store and --json");
  RunOptions o = run_options(a);
  GpuSession s(o);
  if (!s.has_gpu()) {
    std::printf("no GPU found: %s\n", s.no_gpu_reason().c_str());
    return 1;
  }
  const DeviceInfo& d = s.device();
  if (a.has("slug")) {
    std::printf("%s\n", rt::device_slug(d.name).c_str());
    return 0;
  }
  if (a.has("json")) {
    const json j = {{"index", o.device},         {"name", d.name},
                    {"arch", d.arch},            {"slug", rt::device_slug(d.name)},
                    {"store", rt::user_store_path(d.name)}, {"sm_count", d.sm_count},
                    {"memory_bytes", d.memory_bytes}, {"driver_version", d.driver_version}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (a.has("store")) {
    const std::string path = rt::user_store_path(d.name);
    if (path.empty()) throw UsageError("no user's store: neither XDG_CACHE_HOME nor HOME is an absolute path");
    std::printf("%s\n", path.c_str());
    return 0;
  }
  std::printf("%d: %s  %s  %d SMs  %.1f GiB  L2 %d MiB  smem/block %d KiB  driver %d\n", o.device, d.name.c_str(),
              d.arch.c_str(), d.sm_count, d.memory_bytes / 1073741824.0, d.l2_bytes >> 20, d.max_smem_optin >> 10,
              d.driver_version);
  return 0;
}

int cmd_families(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune families [--json]\n"
              "Lists the registry's kernel families: name, direction, dtypes, head dims, tunables with their\n"
              "domains, default config, hopper_only (built for sm_90a, pruned elsewhere), test_only, gqa\n"
              "(grouped-query heads_k), varlen (packed variable-length batches), paged (paged K/V caches),\n"
              "max_seq_q (the query rows per sequence it serves; 0: any). Tests and\n"
              "scripts read --json instead of keeping lists of families.");
    return 0;
  }
  Args a = parse(argc, argv, {}, {"json"});
  if (!a.positional.empty()) throw UsageError("families takes no positional arguments");
  json all = json::array();
  for (const auto& f : families()) {
    json j = {{"name", f.name}, {"direction", f.direction}, {"template", f.template_file},
              {"kernels", f.kernels}, {"head_dims", f.head_dims}, {"hopper_only", f.hopper_only},
              {"test_only", f.test_only}, {"gqa", f.gqa}, {"varlen", f.varlen}, {"paged", f.paged}, {"max_seq_q", f.max_seq_q},
              {"default", f.config_string(f.default_config)}};
    j["dtypes"] = json::array();
    for (DType t : f.dtypes) j["dtypes"].push_back(to_string(t));
    j["params"] = json::array();
    j["default_config"] = json::object();
    for (size_t i = 0; i < f.params.size(); ++i) {
      j["params"].push_back({{"name", f.params[i].name}, {"domain", f.params[i].domain}});
      j["default_config"][f.params[i].name] = f.default_config[i];
    }
    all.push_back(std::move(j));
  }
  if (a.has("json")) {
    std::printf("%s\n", all.dump(1).c_str());
    return 0;
  }
  for (const auto& j : all) {
    auto list = [](const json& arr) {
      std::string s;
      for (const auto& v : arr) s += (s.empty() ? "" : ",") + (v.is_string() ? v.get<std::string>() : v.dump());
      return s;
    };
    std::string params;
    for (const auto& p : j["params"]) params += (params.empty() ? "" : " ") + p["name"].get<std::string>() + "{" + list(p["domain"]) + "}";
    const int max_sq = j["max_seq_q"].get<int>();
    std::printf("%-14s %s  dtypes %s  d %s%s%s%s%s%s%s\n  params  %s\n  default %s\n", j["name"].get<std::string>().c_str(),
                j["direction"].get<std::string>().c_str(), list(j["dtypes"]).c_str(), list(j["head_dims"]).c_str(),
                j["gqa"].get<bool>() ? "  gqa" : "", j["varlen"].get<bool>() ? "  varlen" : "",
                j["paged"].get<bool>() ? "  paged" : "", max_sq ? ("  Sq<=" + std::to_string(max_sq)).c_str() : "",
                j["hopper_only"].get<bool>() ? "  hopper_only" : "", j["test_only"].get<bool>() ? "  test_only" : "",
                params.c_str(), j["default"].get<std::string>().c_str());
  }
  return 0;
}

int cmd_problems(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune problems <problems.json> [--json]\n"
              "Prints a problem set as flashtune reads it: a line per problem (its name, FLOPs, bytes), or with\n"
              "--json per problem its JSON (the form `run --json` reports) with \"flops\" and \"bytes\" and, for a\n"
              "packed variable-length batch, the lengths its description gives (\"seq_lens_q\", \"seq_lens_k\",\n"
              "\"cu_seqlens_q\", \"cu_seqlens_k\"), for a paged K/V cache each sequence's \"cache_seqlens\" and the\n"
              "pool's \"num_pages\": what scripts that time other implementations on the same\n"
              "problems read instead of re-deriving them. Needs no GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {}, {"json"});
  if (a.positional.size() != 1) throw UsageError("problems takes one problems file");
  const std::vector<Problem> problems = load_problems(a.positional[0]);
  json out = json::array();
  for (const Problem& p : problems) {
    json j = to_json(p);
    j["flops"] = p.flops();
    j["bytes"] = p.bytes();
    if (p.varlen.enabled()) {
      j["seq_lens_q"] = p.varlen.seq_lens_q;
      j["seq_lens_k"] = p.varlen.seq_lens_k;
      j["cu_seqlens_q"] = p.varlen.cu_seqlens_q();
      j["cu_seqlens_k"] = p.varlen.cu_seqlens_k();
    }
    if (p.paged.enabled()) {
      const PageTable t = page_table(p.paged, p.batch, p.seq_k);
      j["cache_seqlens"] = t.cache_seqlens;
      j["num_pages"] = t.num_pages;
    }
    if (!a.has("json")) std::printf("%-60s %12.4g FLOP %12.4g B\n", p.str().c_str(), p.flops(), p.bytes());
    out.push_back(std::move(j));
  }
  if (a.has("json")) std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

int cmd_compile_check(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune compile-check <space.json> [--arch sm_90] [--db PATH] [--save-cubins DIR]\n"
              "Compiles every variant of the space with NVRTC (or prunes it, with the reason) and prints the\n"
              "resource table; --save-cubins writes each compiled variant to DIR/<lowered name>.cubin (for\n"
              "cuobjdump). The space's \"varlen\": [false, true] compiles the packed variable-length form of\n"
              "its variants too, \"paged\": [false, true] the paged K/V cache form (column form). Exit 1 if any\n"
              "variant failed to compile.");
    return 0;
  }
  Args a = parse(argc, argv, {"arch", "db", "save-cubins"}, {"allow-large-space"});
  if (a.positional.size() != 1) throw UsageError("compile-check takes one space file");
  Space space = load_space(a.positional[0], a.has("allow-large-space"));
  Compiler c(a.get("arch", "sm_90"));
  if (a.has("save-cubins")) {  // checked before any work
    std::error_code ec;
    std::filesystem::create_directories(a.get("save-cubins"), ec);
    if (ec || !std::filesystem::is_directory(a.get("save-cubins")))
      throw UsageError("--save-cubins: cannot create folder '" + a.get("save-cubins") + "'");
  }
  std::unique_ptr<Store> store;
  if (a.has("db")) store = std::make_unique<Store>(a.get("db"));
  auto variants = space.variants();
  Progress prog("compile " + c.arch(), variants.size(), true);
  auto kernels = c.compile_all(variants, store.get(), [&](size_t d, size_t) { prog.update(d); });
  prog.finish();
  std::map<std::string, int> n;
  std::printf("%-10s %-44s %4s %-6s %-5s %-6s %-13s %5s %6s  %s\n", "family", "config", "d", "causal", "dtype", "form",
              "status", "regs", "spill", "reason");
  for (size_t i = 0; i < kernels.size(); ++i) {
    const KernelRecord& k = kernels[i];
    n[k.status]++;
    std::printf("%-10s %-44s %4d %-6s %-5s %-6s %-13s %5d %6d  %s\n", k.family.c_str(), k.config.c_str(), k.head_dim,
                k.causal ? "yes" : "no", to_string(k.dtype),
                variants[i].varlen ? "varlen" : variants[i].paged ? "paged" : "dense", k.status.c_str(),
                k.res.registers, k.res.spill_stores, k.reason.substr(0, 90).c_str());
  }
  if (a.has("save-cubins")) {
    // A kernel may come from --db's store: its lowered name is stored text, checked before any file is written.
    for (const auto& k : kernels)
      if (k.status == "compiled" && !is_safe_file_name(split(k.lowered_name, '\n')[0]))
        throw UsageError("--save-cubins: kernel " + brief(k.hash, 40) + "'s lowered name '" +
                         brief(split(k.lowered_name, '\n')[0]) + "' is not a plain file name");
    for (const auto& k : kernels)
      if (k.status == "compiled") {
        const auto file = std::filesystem::path(a.get("save-cubins")) / (split(k.lowered_name, '\n')[0] + ".cubin");
        if (a.has("db") && same_file(file.string(), a.get("db")))
          throw UsageError("--save-cubins: '" + file.string() + "' is the --db store: save the cubins elsewhere");
        std::ofstream f(std::filesystem::path(a.get("save-cubins")) / (split(k.lowered_name, '\n')[0] + ".cubin"),
                        std::ios::binary);
        f.write(k.cubin.data(), (std::streamsize)k.cubin.size());
      }
  }
  std::printf("%s %s: %zu variants:", space.family->name.c_str(), c.arch().c_str(), kernels.size());
  for (auto& [s, count] : n) std::printf(" %d %s", count, s.c_str());
  std::printf("\n");
  return n.count("compile_error") ? 1 : 0;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "0,1,3": device indices, each 0..64, at most 16 of them (an index may repeat: workers sharing a GPU).
std::vector<int> parse_devices(const std::string& text) {
  const std::string bad = "--devices must be a comma-separated list of device indices such as 0,1, got '" +
                          brief(text) + "'";
  std::vector<int> out;
  for (const std::string& part : split(text, ',')) {
    if (part.empty() || part.size() > 2 || part.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(bad);
    const int d = std::stoi(part);
    if (d > 64) throw UsageError(bad);
    out.push_back(d);
  }
  if (out.empty() || out.size() > 16) throw UsageError(bad);
  return out;
}

int cmd_tune(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts(
        "usage: flashtune tune <space.json> <problems.json> [--db PATH] [--device N | --devices 0,1,...]\n"
        "                      [--strategy exhaustive|random|halving|guided] [--max-evals N|N%] [--time-budget 10m]\n"
        "                      [--seed N] [--shard k/n] [--replay DB [--replay-device NAME]] [--json]\n"
        "                      [--stop-margin X] [--retime N] [--timeout S] [--arch A] [--quiet]\n"
        "                      [--input-dist normal|heavy] [--input-scale X]\n"
        "Searches the space's variants on each problem: a strategy proposes candidates, a worker process per\n"
        "GPU compiles only what is proposed, runs it, validates it against the float64 reference, times the\n"
        "valid ones and stores every attempt (one row each: a stopped sweep resumes from what is stored).\n"
        "Without a GPU it compiles and prunes only. Default --db flashtune.db, --timeout 30 s.\n"
        "  --strategy     exhaustive (default: every candidate), random, halving (every candidate with 2\n"
        "                 repeats, the best quarter with 8, the best 3 with the full timing), guided\n"
        "                 (a space-filling start, then a nearest-neighbour model of the times so far\n"
        "                 proposes the candidate it predicts fastest, less a shrinking exploration bonus)\n"
        "  --max-evals    distinct candidates per problem: a count or a percentage of the problem's\n"
        "                 candidates (after pruning without compiling)\n"
        "  --time-budget  wall time of the whole sweep (replay: simulated GPU timing time), e.g. 90s, 10m, 1h30m;\n"
        "                 each problem, as it starts, gets an equal part of what is left (so every problem\n"
        "                 gets a pick, and what one leaves goes to the next); no evaluation of a problem\n"
        "                 starts after its part\n"
        "  --seed         seeds the strategy (and the inputs); default 20261121\n"
        "  --devices      one worker per listed GPU on one sweep into one store (an index twice: two workers\n"
        "                 on one GPU, which perturbs their timings); the GPUs must share an architecture\n"
        "  --shard k/n    this run takes candidate (variant, problem) pairs whose stable hash % n == k\n"
        "                 (compile-only: variants whose hash % n == k); `flashtune merge` joins the stores\n"
        "  --replay DB    evaluates from DB's stored results instead of a GPU (the family's rows on\n"
        "                 --replay-device, default the device with the most), with seeded noise of the stored\n"
        "                 spread; nothing is written. --json prints per problem space_size, evaluations,\n"
        "                 best_found_tflops and exhaustive_best_tflops (null unless DB holds every candidate)\n"
        "  --stop-margin  stop timing a candidate after 3 repeats when it is slower than (1 + X) x the best so\n"
        "                 far (default 0.25; 0: off)\n"
        "  --retime N     re-time each problem's N fastest interleaved (A B C A B C ...) at the end and store\n"
        "                 both figures (default 3; 0: off)\n"
        "--input-dist and --input-scale override every problem's \"inputs\": seeded normal numbers, or\n"
        "Student-t with 3 degrees of freedom (heavy), times the scale (0.001 to 1000); either alone keeps\n"
        "the other from each problem. Default: the problem's own, else normal, 1.");
    return 0;
  }
  Args a = parse(argc, argv,
                 {"db", "device", "devices", "timeout", "seed", "arch", "input-dist", "input-scale", "strategy",
                  "max-evals", "time-budget", "shard", "replay", "replay-device", "stop-margin", "retime"},
                 {"quiet", "allow-large-space", "json"});
  if (a.positional.size() != 2) throw UsageError("tune takes a space file and a problems file");
  Space space = load_space(a.positional[0], a.has("allow-large-space"));
  std::vector<Problem> problems = load_problems(a.positional[1]);
  for (Problem& p : problems) p.inputs = input_dist_option(a, p.inputs);
  if (variants_for(space, problems).empty())  // a sweep that would do nothing is an error, before any work
    throw UsageError("no problem in " + a.positional[1] + " matches a variant of " + a.positional[0] +
                     " (head_dim, causal, dtype and direction must agree; heads_k needs a grouped-query family, varlen a "
                     "family that runs packed variable-length batches, Sq within the family's max_seq_q)");
  SearchOptions so;
  so.strategy = a.get("strategy", "exhaustive");
  make_strategy({so.strategy, 0, 1}, {});  // an unknown name fails here, before any work
  so.max_evals = a.get("max-evals");
  if (!so.max_evals.empty()) parse_max_evals(so.max_evals, 100);
  if (a.has("time-budget")) so.time_budget_s = parse_duration(a.get("time-budget"));
  so.seed = (uint64_t)a.get_int("seed", 20261121, 0, (1ll << 62));
  if (a.has("shard")) so.shard = parse_shard(a.get("shard"));
  so.stop_margin = a.get("stop-margin") == "0" ? 0.0 : a.get_double("stop-margin", 0.25, 100);
  so.retime_top = (int)a.get_int("retime", 3, 0, 20);
  so.progress = !a.has("quiet");
  if (a.has("device") && a.has("devices")) throw UsageError("give --device or --devices, not both");

  if (a.has("replay")) {
    const std::string db = a.get("replay");
    check_db_path(db);
    require_file(db, "--replay database");
    if (a.has("db")) throw UsageError("--replay writes nothing: drop --db");
    const auto reports = replay_search(space, problems, db, a.get("replay-device"), so);
    if (a.has("json")) {
      json out = json::array();
      for (const auto& r : reports) out.push_back(r.to_json());
      std::printf("%s\n", out.dump(1).c_str());
      return 0;
    }
    std::printf("%-44s %6s %6s %9s %9s %7s  %s\n", "problem", "space", "evals", "found", "best", "ratio", "config");
    for (const auto& r : reports)
      std::printf("%-44s %6zu %6zu %9.2f %9s %7s  %s\n", r.problem.str().c_str(), r.space_size, r.evaluations,
                  r.best_tflops, r.exhaustive_best_tflops >= 0 ? fixed(r.exhaustive_best_tflops, 2).c_str() : "-",
                  r.exhaustive_best_tflops > 0 ? fixed(r.best_tflops / r.exhaustive_best_tflops, 4).c_str() : "-",
                  r.best_config.c_str());
    return 0;
  }

  check_db_path(a.get("db", "flashtune.db"));
  SweepOptions o;
  o.run = run_options(a);
  o.arch = a.get("arch");
  if (!o.arch.empty()) arch_limits(o.arch);
  o.progress = so.progress;
  o.search = so;
  o.devices = a.has("devices") ? parse_devices(a.get("devices")) : std::vector<int>{o.run.device};
  o.json = a.has("json");
  Store store(a.get("db", "flashtune.db"));
  SweepSummary s = tune(space, problems, store, o);
  if (o.json) {
    json out = json::array();
    for (const auto& r : s.reports) out.push_back(r.to_json());
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  std::printf("%s: %s", space.family->name.c_str(), s.ran_kernels ? "candidates" : "variants");
  for (auto& [status, count] : s.by_status) std::printf(" %d %s", count, status.c_str());
  if (s.skipped) std::printf(", %d already stored", s.skipped);
  std::printf("  (db %s)\n", store.path().c_str());
  return 0;
}

// A comma-separated list of integers as JSON numbers (ranges are the problem parser's to check).
json int_list_option(const std::string& flag, const std::string& text) {
  json out = json::array();
  for (const std::string& part : split(text, ',')) {
    long long v = 0;
    if (!plain_integer(part, v)) throw UsageError(flag + " must be comma-separated integers, got '" + brief(part) + "'");
    if (out.size() >= (size_t)kMaxVarlenSeqs) throw UsageError(flag + " has more than " + std::to_string(kMaxVarlenSeqs) + " lengths");
    out.push_back(v);
  }
  return out;
}

// --shape B,H,Sq,Sk,d; with --varlen FILE|JSON or --seq-lens L,.. [--seq-lens-k L,..] (a packed
// variable-length batch: the lengths give B, Sq and Sk) --shape H,d.
Problem parse_shape(const std::string& shape, const Args& a) {
  const bool packed = a.has("varlen") || a.has("seq-lens");
  if (a.has("varlen") && a.has("seq-lens")) throw UsageError("give --varlen or --seq-lens, not both");
  if (a.has("seq-lens-k") && !a.has("seq-lens")) throw UsageError("--seq-lens-k goes with --seq-lens");
  auto parts = split(shape, ',');
  if (!packed && parts.size() != 5) throw UsageError("--shape must be B,H,Sq,Sk,d, got '" + brief(shape) + "'");
  if (packed && parts.size() != 2)
    throw UsageError("--shape must be H,d with --varlen or --seq-lens (the lengths give B, Sq, Sk), got '" + brief(shape) + "'");
  json j;
  const std::vector<const char*> keys = packed ? std::vector<const char*>{"heads", "head_dim"}
                                               : std::vector<const char*>{"batch", "heads", "seq_q", "seq_k", "head_dim"};
  for (size_t i = 0; i < keys.size(); ++i) {
    long long v = 0;
    if (!plain_integer(parts[i], v))
      throw UsageError("--shape field " + std::string(keys[i]) + " is not an integer: '" + brief(parts[i]) + "'");
    j[keys[i]] = v;
  }
  if (a.has("paged")) {  // a paged K/V cache: the problem file's "paged" object, the shape as for a dense one
    const std::string v = a.get("paged");
    j["paged"] = !v.empty() && v[0] == '{' ? parse_json_bounded(v, "--paged") : read_json_file(v);
  }
  if (a.has("varlen")) {
    const std::string v = a.get("varlen");
    j["varlen"] = !v.empty() && v[0] == '{' ? parse_json_bounded(v, "--varlen") : read_json_file(v);
  } else if (a.has("seq-lens")) {
    j["varlen"] = {{"seq_lens", int_list_option("--seq-lens", a.get("seq-lens"))}};
    if (a.has("seq-lens-k")) j["varlen"]["seq_lens_k"] = int_list_option("--seq-lens-k", a.get("seq-lens-k"));
  }
  j["dtype"] = a.get("dtype", "fp32");
  j["causal"] = a.has("causal");
  if (a.has("heads-k")) j["heads_k"] = a.get_int("heads-k", 1, 1, 1 << 16);
  try {
    return problem_from_json(j);
  } catch (const UsageError& e) {
    throw UsageError(std::string(a.has("varlen") ? "--varlen: " : a.has("paged") ? "--paged: " : "") + e.what());
  }
}

int cmd_run(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune run --family F (--params K=V,... | --best) --shape B,H,Sq,Sk,d [--dtype fp32]\n"
              "                     [--causal] [--direction fwd|bwd] [--seed N] [--check] [--check-determinism]\n"
              "                     [--json] [--db PATH] [--device N] [--timeout S] [--inputs DIR] [--save-outputs DIR]\n"
              "                     [--input-dist normal|heavy] [--input-scale X] [--heads-k N]\n"
              "       flashtune run ... --shape H,d (--varlen FILE|JSON | --seq-lens L,L,.. [--seq-lens-k L,L,..])\n"
              "       flashtune run ... --shape B,H,Sq,Sk,d --paged FILE|JSON\n"
              "Runs one config of a family on one problem in the worker: validated against the float64\n"
              "reference (forward: sampled rows, every row with --check; backward: every element of dQ, dK,\n"
              "dV), then timed. --check-determinism runs it twice and reports whether the outputs' bits\n"
              "agree. --best takes the stored best config for this device and problem from --db (the\n"
              "problem's own, else its sequence bucket's: grouped-query problems need their own).\n"
              "--inputs DIR reads the inputs instead of generating seeded ones: DIR/q.bin, k.bin, v.bin (and\n"
              "do.bin for a backward), raw little-endian values in the --dtype (fp32, or fp16/bf16 bits), layout\n"
              "[B,H,S,d] contiguous, sizes exactly as --shape says; the float64 reference is computed from them\n"
              "(a backward's over every head: B*H*Sq*Sk*d at most 2^34). Such a run is not stored in --db.\n"
              "Files holding NaN or Inf are refused (exit 2).\n"
              "--input-dist normal|heavy and --input-scale X (0.001 to 1000) choose the generated inputs: seeded\n"
              "normal numbers, or Student-t with 3 degrees of freedom (heavy), times X for q, k, v (a backward's\n"
              "dO is of the same kind, unscaled). Default normal, 1. Tolerances scale with the inputs.\n"
              "--save-outputs DIR writes the validated run's outputs there as raw files: forward o.bin (dtype)\n"
              "and lse.bin (fp32, [B,H,Sq]); backward dq.bin, dk.bin, dv.bin (dtype).\n"
              "--heads-k N: grouped-query attention (N divides H): K, V, dK, dV have N heads, query head h\n"
              "reads kv head h / (H / N) (families fa2_mma, fa2_mma_bwd).\n"
              "--varlen FILE|JSON (a problem file's \"varlen\" object, from a file or inline when it starts with\n"
              "'{') or --seq-lens L,L,.. (query lengths; keys the same unless --seq-lens-k): a packed\n"
              "variable-length batch, Q and O (total_q, H, d), K and V (total_k, Hk, d), LSE (H, total_q),\n"
              "causal per sequence; --shape is then H,d (families fa2_mma, fa2_mma_bwd; --best needs the\n"
              "problem's own stored row). --save-outputs writes the packed tensors.\n"
              "--paged FILE|JSON (a problem file's \"paged\" object: {\"page_size\": P, \"seed\": S, \"seq_lens_k\": [..]}):\n"
              "K and V in a paged cache, pools of (num_pages, Hk, P, d) pages in a seeded order through a block\n"
              "table, each sequence its own cache length (B and Sk of --shape: the lengths' count and longest);\n"
              "family decode_splitkv, whose BLOCK_N must divide P; --best needs the problem's own stored row.\n"
              "Exit 1 if the kernel is not valid.");
    return 0;
  }
  Args a = parse(argc, argv,
                 {"family", "params", "shape", "dtype", "seed", "db", "device", "timeout", "direction", "inputs",
                  "save-outputs", "input-dist", "input-scale", "heads-k", "varlen", "seq-lens", "seq-lens-k", "paged"},
                 {"causal", "check", "json", "best", "check-determinism"});
  if (!a.has("family")) throw UsageError("run needs --family");
  if (!a.has("shape")) throw UsageError("run needs --shape B,H,Sq,Sk,d (or H,d with --varlen or --seq-lens)");
  if (a.has("params") == a.has("best")) throw UsageError("run needs exactly one of --params and --best");
  if (a.has("best") && !a.has("db")) throw UsageError("--best needs --db");
  const Family& f = find_family(a.get("family"));
  Problem p = parse_shape(a.get("shape"), a);
  if (a.has("inputs") && p.varlen.enabled())
    throw UsageError("--inputs reads dense [B,H,S,d] files; a packed variable-length batch uses generated inputs");
  if (a.has("inputs") && p.paged.enabled())
    throw UsageError("--inputs reads dense [B,H,S,d] files; a paged K/V cache uses generated inputs");
  if (a.has("inputs") && (a.has("input-dist") || a.has("input-scale")))
    throw UsageError("--inputs reads the inputs from files; --input-dist and --input-scale are for generated ones");
  p.inputs = input_dist_option(a, p.inputs);
  p.direction = a.get("direction", f.direction);
  if (p.direction != f.direction)
    throw UsageError("family " + f.name + " computes the " + f.direction + " direction, not " + p.direction);
  if (std::find(f.dtypes.begin(), f.dtypes.end(), p.dtype) == f.dtypes.end())
    throw UsageError("family " + f.name + " does not support dtype " + to_string(p.dtype));
  if (std::find(f.head_dims.begin(), f.head_dims.end(), p.head_dim) == f.head_dims.end())
    throw UsageError("family " + f.name + " does not support head_dim " + std::to_string(p.head_dim));
  if (const std::string why = f.shape_reason(p); !why.empty()) throw UsageError("family " + f.name + " " + why);
  RunOptions o = run_options(a);
  if (a.has("check")) o.max_rows = p.rows_q();  // every row
  o.check_determinism = a.has("check-determinism");
  std::unique_ptr<Store> store;  // --best: opened read-only for the lookup; for storing the run, read-write after it
  if (a.has("db")) store = std::make_unique<Store>(a.get("db"), a.has("best") ? Store::Mode::read_only : Store::Mode::read_write);
  Config cfg = a.has("params") ? f.parse_config(a.get("params")) : Config{};  // bad params fail before any GPU work
  auto check_pages = [&](const Config& c) {  // a paged problem: the config must read its pages
    if (p.paged.enabled())
      if (const char* why = f.paged_check(c, p.paged.page_size))
        throw UsageError("family " + f.name + " " + f.config_string(c) + ": " + why + " (" +
                         std::to_string(p.paged.page_size) + ")");
  };
  if (a.has("params")) check_pages(cfg);
  if (a.has("inputs")) {  // checked here, before any GPU work: every file there, every size exact
    const double work = (double)p.batch * p.heads * p.seq_q * p.seq_k * p.head_dim;
    if (p.direction == "bwd" && work > kMaxFileBwdReferenceWork)
      throw UsageError("--inputs with a backward: B*H*Sq*Sk*d = " + std::to_string((long long)work) +
                       " is over 2^34, too slow for the float64 reference of every head");
    if (const std::string why = check_input_files(a.get("inputs"), p); !why.empty()) throw UsageError("--inputs: " + why);
    o.inputs_dir = std::filesystem::absolute(a.get("inputs")).string();
  }
  if (a.has("save-outputs")) {
    std::error_code ec;
    std::filesystem::create_directories(a.get("save-outputs"), ec);
    if (ec || !std::filesystem::is_directory(a.get("save-outputs")))
      throw UsageError("--save-outputs: cannot create folder '" + a.get("save-outputs") + "'");
    o.save_outputs_dir = std::filesystem::absolute(a.get("save-outputs")).string();
    std::vector<std::string> inputs;  // no output file may be one of the run's inputs
    if (a.has("db")) inputs.push_back(a.get("db"));
    for (const char* n : {"q.bin", "k.bin", "v.bin", "do.bin"})
      if (a.has("inputs")) inputs.push_back(a.get("inputs") + "/" + n);
    for (const char* n : {"o.bin", "lse.bin", "dq.bin", "dk.bin", "dv.bin"})
      for (const std::string& in : inputs)
        if (same_file(o.save_outputs_dir + "/" + n, in))
          throw UsageError("--save-outputs: '" + o.save_outputs_dir + "/" + n + "' is the input '" + in + "'");
  }
  GpuSession gpu(o);
  if (!gpu.has_gpu()) {
    std::fprintf(stderr, "flashtune: no GPU found (%s)\n", gpu.no_gpu_reason().c_str());
    return 1;
  }
  if (a.has("best")) {
    ResultFilter filter{f.name, gpu.device().name, to_string(p.dtype), f.direction, p.head_dim, (int)p.causal, false};  // every status: see select.cpp's superseded
    const StoredChoice pick = stored_choice(store->results(filter), p);  // the problem's own best, else its bucket's
    if (pick.source.empty())
      throw UsageError("no stored valid " + f.name + " result for " + gpu.device().name + " " + to_string(p.dtype) +
                       " d" + std::to_string(p.head_dim) + (p.causal ? " causal" : "") + " in " + a.get("db"));
    cfg = f.parse_config(pick.config);
    store = std::make_unique<Store>(a.get("db"));
  }
  check_pages(cfg);  // --best: its pick is the problem's own row, which read these pages
  Variant v{&f, cfg, p.head_dim, p.causal, p.dtype, p.varlen.enabled(), p.paged.enabled()};
  Compiler compiler(gpu.device().arch);
  KernelRecord k = compiler.compile_all({v}, store.get())[0];
  ResultRecord r = gpu.run(k, v, p);
  // A run on file inputs is not a (problem, seed) measurement: it stays out of the store.
  if (store && k.status == "compiled" && o.inputs_dir.empty()) store->put_result(r, gpu.device());
  if (a.has("json")) {
    json j = {{"family", f.name}, {"config", k.config}, {"problem", to_json(p)}, {"status", r.status},
              {"error", r.error}, {"max_abs", r.max_abs}, {"max_rel", r.max_rel}, {"mse", r.mse},
              {"ms_median", r.ms_median}, {"ms_p20", r.ms_p20}, {"ms_p80", r.ms_p80}, {"reps", r.reps},
              {"tflops", r.tflops}, {"gbps", r.gbps}, {"registers", k.res.registers}, {"device", gpu.device().name},
              {"detail", r.detail.empty() ? json::object() : json::parse(r.detail, nullptr, false)}};
    if (!o.inputs_dir.empty()) j["inputs"] = o.inputs_dir;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s %s on %s [%s]\n", f.name.c_str(), k.config.c_str(), p.str().c_str(), gpu.device().name.c_str());
    std::printf("  status %s%s%s\n", r.status.c_str(), r.error.empty() ? "" : ": ", r.error.c_str());
    std::printf("  errors vs float64 reference: max_abs %.3g  max_rel %.3g  mse %.3g  %s\n", r.max_abs, r.max_rel, r.mse,
                r.detail.c_str());
    if (r.status == "ok")
      std::printf("  time %.4f ms (p20 %.4f, p80 %.4f, %d reps)  %.2f TFLOP/s  %.1f GB/s  %d registers\n", r.ms_median,
                  r.ms_p20, r.ms_p80, r.reps, r.tflops, r.gbps, k.res.registers);
  }
  return r.status == "ok" ? 0 : 1;
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

int cmd_best(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune best --db PATH [--family F] [--device NAME] [--dtype T] [--d N] [--causal 0|1] [--csv]\n"
              "                      [--deterministic]\n"
              "The fastest valid config per problem, with its time, TFLOP/s and errors; --deterministic: among the\n"
              "configs whose gradients are bitwise reproducible only. Needs no GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {"db", "family", "device", "dtype", "d", "causal"}, {"csv", "deterministic"});
  if (!a.has("db")) throw UsageError("best needs --db");
  Store store(a.get("db"), Store::Mode::read_only);
  // Every status: a newer prune or failure of a config supersedes its older success (select.cpp).
  const ResultFilter filter = filter_from(a);
  auto best = best_per_problem(a.has("deterministic") ? reproducible_rows(store.results(filter)) : store.results(filter));
  if (a.has("csv")) {
    std::puts("device,family,direction,batch,heads,seq_q,seq_k,head_dim,dtype,causal,config,ms_median,ms_p20,ms_p80,"
              "tflops,gbps,max_abs,max_rel,heads_k,varlen,paged");
    // Stored text quoted as CSV quotes a field (inner quotes doubled), control characters as '?'
    // (never an escape sequence on a terminal); varlen and paged empty when dense.
    // (device and config always quoted, others when they hold ',' or '"').
    auto csv = [](const std::string& text, bool always) {
      const std::string safe = brief(text, text.size());
      if (!always && safe.find_first_of(",\"") == std::string::npos) return safe;
      std::string quoted;
      for (char ch : safe) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      return "\"" + quoted + "\"";
    };
    for (const auto& r : best) {
      const Problem& p = r.problem;
      std::printf("%s,%s,%s,%d,%d,%d,%d,%d,%s,%d,%s,%.6f,%.6f,%.6f,%.3f,%.1f,%.3g,%.3g,%d,%s,%s\n", csv(r.device_name, true).c_str(),
                  csv(r.family, false).c_str(), csv(r.direction, false).c_str(), p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim,
                  to_string(p.dtype), (int)p.causal, csv(r.config, true).c_str(), r.ms_median, r.ms_p20, r.ms_p80, r.tflops,
                  r.gbps, r.max_abs, r.max_rel, p.kv_heads(), p.varlen.key().empty() ? "" : csv(p.varlen.key(), true).c_str(),
                  p.paged.key().empty() ? "" : csv(p.paged.key(), true).c_str());
    }
  } else {
    std::printf("%-24s %-9s %-40s %-46s %9s %8s %9s\n", "device", "family", "problem", "config", "ms", "TFLOP/s",
                "max_abs");
    for (const auto& r : best)
      std::printf("%-24s %-9s %-40s %-46s %9.4f %8.2f %9.2g\n", brief(r.device_name.substr(0, 24)).c_str(),
                  brief(r.family).c_str(), brief(r.problem.str(), 200).c_str(), brief(r.config, 200).c_str(), r.ms_median,
                  r.tflops, r.max_abs);
    if (best.empty()) std::puts("(no valid results match)");
  }
  return 0;
}

int cmd_emit(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune emit --db PATH --out DIR [--family F]\n"
              "Writes DIR/<arch>_<gpu>.hpp per device in the store and DIR/dispatch.hpp (fallback device ->\n"
              "arch -> default); a backward bucket also gets the best of its bitwise-reproducible configs as a\n"
              "deterministic entry. Needs no GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {"db", "out", "family"}, {});
  if (!a.has("db") || !a.has("out")) throw UsageError("emit needs --db and --out");
  Store store(a.get("db"), Store::Mode::read_only);
  const ResultFilter filter = filter_from(a);  // every status, as best's
  const std::vector<ResultRecord> rows = store.results(filter);
  auto choices = best_per_bucket(rows);
  for (auto& c : best_per_bucket(rows, true))  // the deterministic backward's picks, entries of their own
    if (c.direction == "bwd") choices.push_back(std::move(c));
  auto res = emit_headers(choices, a.get("out"), command_line(argc, argv), {a.get("db")});
  for (const auto& w : res.written) std::printf("wrote %s\n", w.c_str());
  std::printf("%d entries\n", res.entries);
  return 0;
}

// Runs argv[0] (looked up in PATH) with these arguments, no shell in between; its exit status, or -1.
int spawn_and_wait(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& x : args) argv.push_back(const_cast<char*>(x.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (int rc = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ); rc != 0)
    throw std::runtime_error("cannot start " + args[0] + ": " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int cmd_report(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune report --db PATH [--out DIR]\n"
              "       flashtune report --gpu SLUG [--reports DIR] [--out DIR]\n"
              "Builds REPORT.md, its CSVs and PNG plots (matplotlib) from a store, opened read-only, and the\n"
              "comparison CSVs beside it. Needs no GPU. --out defaults to the store's folder. --gpu SLUG is\n"
              "short for --db DIR/SLUG/results.db, DIR defaulting to the source tree's reports/.");
    return 0;
  }
  Args a = parse(argc, argv, {"db", "gpu", "reports", "out"}, {});
  if (a.has("db") == a.has("gpu")) throw UsageError("report needs exactly one of --db PATH and --gpu SLUG");
  std::string db = a.get("db");
  if (a.has("gpu")) {
    const std::string slug = a.get("gpu");
    if (slug.empty() || slug.find('/') != std::string::npos || slug == "." || slug == "..")
      throw UsageError("--gpu takes a folder name under reports/, got '" + brief(slug) + "'");
    db = a.get("reports", std::string(FLASHTUNE_SOURCE_DIR) + "/reports") + "/" + slug + "/results.db";
  }
  { Store check(db, Store::Mode::read_only); }  // exists, is ours, is readable: one line and exit 2 if not
  const std::string out = a.has("out") ? a.get("out") : std::filesystem::path(db).parent_path().string();
  std::error_code ec;
  std::filesystem::create_directories(out.empty() ? "." : out, ec);
  if (ec || !std::filesystem::is_directory(out.empty() ? "." : out))
    throw UsageError("--out '" + out + "' is not a folder that can be created");
  {  // REPORT.md, *.csv and *.png are written into --out: never over the store
    const std::filesystem::path name = std::filesystem::path(db).filename();
    const std::string ext = name.extension().string();
    if (same_file(std::filesystem::path(db).parent_path().empty() ? "." : std::filesystem::path(db).parent_path().string(),
                  out.empty() ? "." : out) &&
        (name == "REPORT.md" || ext == ".csv" || ext == ".png"))
      throw UsageError("report writes REPORT.md, *.csv and *.png into --out: it would overwrite the store '" + db + "'");
  }
  // An argv, never a shell string: the paths and slugs stay data.
  std::vector<std::string> args = {"python3", data_dir() + "/reports/make_report.py", "--db", db,
                                    "--out", out.empty() ? "." : out};
  for (const auto& f : families())
    if (!f.test_only) args.push_back("--default=" + f.name + ":" + f.config_string(f.default_config));
  return spawn_and_wait(args) == 0 ? 0 : 1;
}

int cmd_experiment(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune experiment <experiment.json> [--db PATH] [--dry-run] [--device N] [--timeout S]\n"
              "                            [--seed N] [--python PY]\n"
              "Runs an experiment definition (experiments/*.json) on this GPU: the spaces it lists are tuned\n"
              "on its problems, matmul and copy peaks are probed, then every implementation runs on every\n"
              "problem it supports -- our families with the stored tuned config (or ':default'), the cuBLAS\n"
              "unfused baseline, and the Python baselines (torch SDPA backends, PyTorch CPU, Triton) -- each\n"
              "validated against the float64 reference and timed; one row per (implementation, problem) in\n"
              "--db (default flashtune.db). --dry-run validates the file and lists the rows without a GPU.\n"
              "Then `flashtune report --gpu SLUG` draws it.");
    return 0;
  }
  Args a = parse(argc, argv, {"db", "device", "timeout", "seed", "python"}, {"dry-run", "quiet"});
  if (a.positional.size() != 1) throw UsageError("experiment takes one experiment file");
  require_file(a.positional[0], "experiment file");
  ExperimentSpec spec = load_experiment(a.positional[0]);
  if (a.has("dry-run")) {
    auto plan = experiment_plan(spec);
    for (const auto& [impl, p] : plan) std::printf("%-20s %s\n", impl.c_str(), p.str().c_str());
    std::printf("%s: %zu problems, %zu implementations, %zu rows, %zu spaces to tune\n", spec.name.c_str(),
                spec.problems.size(), spec.impls.size(), plan.size(), spec.tune_spaces.size());
    return 0;
  }
  ExperimentOptions o;
  o.run = run_options(a);
  if (!a.has("timeout")) o.run.timeout_s = 120;  // slow baselines on large shapes
  o.python = a.get("python", "python3");
  o.source_dir = data_dir();
  o.progress = !a.has("quiet");
  check_db_path(a.get("db", "flashtune.db"));
  {  // no GPU: one line and exit 2 before any space is compiled or the store is touched
    GpuSession probe(o.run);
    if (!probe.has_gpu())
      throw UsageError("no GPU found (" + probe.no_gpu_reason() + "): an experiment measures on a GPU (--dry-run lists it)");
  }
  Store store(a.get("db", "flashtune.db"));
  long long run = run_experiment(spec, store, o);
  std::map<std::string, int> n;
  for (const auto& r : store.experiment_rows(run)) n[r.status]++;
  std::printf("experiment %s: run %lld:", spec.name.c_str(), run);
  for (auto& [s, c] : n) std::printf(" %d %s", c, s.c_str());
  std::printf("  (db %s)\n", store.path().c_str());
  return 0;
}

int cmd_drop_cubins(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune drop-cubins --db PATH\nRemoves compiled binaries, keeping every result and resource row.");
    return 0;
  }
  Args a = parse(argc, argv, {"db"}, {});
  if (!a.has("db")) throw UsageError("drop-cubins needs --db");
  check_db_path(a.get("db"));
  require_file(a.get("db"), "database");  // a write verb, but not one that creates a store
  Store(a.get("db")).drop_cubins();
  return 0;
}

// merge and export take "-o FILE" as well as "--output FILE".
std::vector<char*> with_output_flag(int argc, char** argv) {
  static std::string long_flag = "--output";
  std::vector<char*> out(argv, argv + argc);
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "-o")) out[i] = long_flag.data();
  return out;
}

int cmd_merge(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune merge A.db B.db ... -o OUT.db [--quiet]\n"
              "Copies the kernels, results and experiment runs of every input store into OUT.db (created if\n"
              "missing; an existing store of ours is merged into, and migrated if older). A row whose key OUT.db\n"
              "already holds is kept as stored. Each input becomes a provenance row of OUT.db (its path, a hash\n"
              "of its rows, the time, the rows it added), and an input whose content was merged before adds\n"
              "nothing: merging twice changes nothing. Inputs are opened read-only, any schema of ours.\n"
              "Refused (exit 2, OUT.db untouched): a file that is not a flashtune store, a newer schema, an input\n"
              "that is OUT.db, a row this build cannot use, and mismatched devices: a device name that two stores\n"
              "hold results for with different (arch, SM count, driver version) sets. One transaction.");
    return 0;
  }
  std::vector<char*> args = with_output_flag(argc, argv);
  Args a = parse(argc, args.data(), {"output"}, {"quiet"});
  if (!a.has("output")) throw UsageError("merge needs -o OUT.db");
  if (a.positional.empty()) throw UsageError("merge needs at least one input store");
  auto summaries = merge_stores(a.positional, a.get("output"));
  long long kernels = 0, results = 0;
  for (const auto& m : summaries) {
    kernels += m.kernels;
    results += m.results;
    if (a.has("quiet")) continue;
    if (m.already) {
      std::printf("%s: already merged (provenance %lld), nothing copied\n", m.path.c_str(), m.provenance_id);
      continue;
    }
    std::printf("%s: +%lld kernels, +%lld results, +%lld experiment runs (+%lld rows)", m.path.c_str(), m.kernels,
                m.results, m.experiment_runs, m.experiment_rows);
    if (m.kernels_present + m.results_present) std::printf(", %lld already stored", m.kernels_present + m.results_present);
    if (m.kernels_differ + m.results_differ)
      std::printf(", %lld kept as stored though the input's values differ", m.kernels_differ + m.results_differ);
    std::printf("\n");
  }
  std::printf("merged %zu stores into %s: +%lld kernels, +%lld results\n", summaries.size(), a.get("output").c_str(),
              kernels, results);
  return 0;
}

int cmd_export(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune export --db PATH [--format t4] [-o FILE] [--family F] [--device NAME] [--dtype T]\n"
              "                        [--d N] [--causal 0|1]\n"
              "Writes the store's results (every status) in the T4 auto-tuning results format shared by Kernel\n"
              "Tuner and KTT (schema 1.0.0): configuration = the family's tunables, objectives time (ms) and\n"
              "tflops, the median time as runtimes, invalidity and correctness from the status, measurements,\n"
              "and a \"flashtune\" object per result with the family, problem, device, driver, NVRTC and status\n"
              "(what `flashtune import` reads back). To FILE (written whole, then renamed) or stdout. Needs no\n"
              "GPU; the store is opened read-only. A compile-only store has kernels but no results to export.");
    return 0;
  }
  std::vector<char*> args = with_output_flag(argc, argv);
  Args a = parse(argc, args.data(), {"db", "format", "output", "family", "device", "dtype", "d", "causal"}, {});
  if (!a.positional.empty()) throw UsageError("export takes no positional arguments (--db PATH)");
  if (!a.has("db")) throw UsageError("export needs --db");
  if (a.get("format", "t4") != "t4") throw UsageError("--format must be t4, got '" + brief(a.get("format")) + "'");
  ResultFilter filter = filter_from(a);
  std::string out_dir;
  if (a.has("output")) {  // checked before the store is read
    const std::string out = a.get("output");
    if (out.empty()) throw UsageError("-o needs a file name");
    if (std::filesystem::is_directory(out)) throw UsageError("-o '" + out + "' is a folder, not a file");
    if (same_file(out, a.get("db"))) throw UsageError("-o '" + out + "' is the --db store: export to another file");
    out_dir = std::filesystem::path(out).parent_path().string();
    if (!std::filesystem::is_directory(out_dir.empty() ? "." : out_dir))
      throw UsageError("-o '" + out + "': folder '" + out_dir + "' does not exist");
  }
  Store store(a.get("db"), Store::Mode::read_only);
  const std::string text = t4_export(store, filter);
  if (!a.has("output")) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  // A temporary file beside the target, renamed over it: a failed export leaves the old file whole.
  const std::string out = a.get("output");
  std::string tmp = out + ".tmp-XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) throw UsageError("-o '" + out + "': cannot create a file in '" + (out_dir.empty() ? "." : out_dir) + "'");
  const bool written = write(fd, text.data(), text.size()) == (ssize_t)text.size();
  fchmod(fd, 0644);
  if (close(fd) != 0 || !written || std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write '" + out + "'");
  }
  return 0;
}

int cmd_import(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune import --db PATH FILE.json\n"
              "Reads a T4 results file written by `flashtune export` into the store (created if missing), as if\n"
              "its results had been measured here: later tunes skip them, best/emit/report use them. The file is\n"
              "untrusted: every field is checked (known family and tunables in their domains, problem, status\n"
              "matching invalidity and correctness, measurements and units, device) before anything is stored,\n"
              "and its devices must match the store's (see merge --help). A row whose key is stored is kept as\n"
              "stored; the file's bytes become a provenance row, so importing it again adds nothing. Up to 128 MiB.");
    return 0;
  }
  Args a = parse(argc, argv, {"db"}, {});
  if (!a.has("db")) throw UsageError("import needs --db");
  if (a.positional.size() != 1) throw UsageError("import takes one T4 file");
  if (same_file(a.positional[0], a.get("db"))) throw UsageError("'" + a.positional[0] + "' is the --db store itself");
  ImportSummary s = t4_import(a.positional[0], a.get("db"));
  if (s.already)
    std::printf("%s: already imported (provenance %lld), nothing copied\n", a.positional[0].c_str(), s.provenance_id);
  else
    std::printf("%s: %lld results, +%lld, %lld already stored%s  (db %s)\n", a.positional[0].c_str(), s.total, s.added,
                s.present + s.differ, s.differ ? (" (" + std::to_string(s.differ) + " with other values, kept as stored)").c_str() : "",
                a.get("db").c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string verb = argv[1];
  static const std::map<std::string, int (*)(int, char**)> verbs = {
      {"devices", cmd_devices}, {"compile-check", cmd_compile_check}, {"tune", cmd_tune}, {"run", cmd_run},
      {"families", cmd_families}, {"problems", cmd_problems},
      {"best", cmd_best},       {"emit", cmd_emit},                   {"drop-cubins", cmd_drop_cubins},
      {"report", cmd_report},   {"experiment", cmd_experiment},
      {"merge", cmd_merge},     {"export", cmd_export},               {"import", cmd_import}};
  auto it = verbs.find(verb);
  try {
    if (it == verbs.end()) throw UsageError("unknown command '" + verb + "' (see flashtune --help)");
    return it->second(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "flashtune: %s\n", brief(e.what(), 400).c_str());
    return 2;
  } catch (const nlohmann::json::exception& e) {  // JSON the CLI read that had the wrong shape: bad input
    std::fprintf(stderr, "flashtune: bad JSON input: %s\n", brief(e.what(), 200).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashtune: error: %s\n", brief(e.what(), 400).c_str());
    return 1;
  }
}
