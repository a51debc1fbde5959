#include "core/compile.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <regex>
#include <thread>

#include "core/embedded.hpp"
#include "core/mask_mod.hpp"
#include "core/nvrtc_api.hpp"
#include "core/util.hpp"

namespace flashtune {

ArchLimits arch_limits(const std::string& arch) {
  // Opt-in shared memory per block (CUDA programming guide, compute capabilities table).
  if (arch == "sm_80" || arch == "sm_87") return {166912};
  if (arch == "sm_86" || arch == "sm_89") return {101376};
  if (arch == "sm_90" || arch == "sm_90a") return {232448};
  if (arch == "sm_100" || arch == "sm_120") return {232448};
  throw UsageError("unsupported arch '" + arch + "' (expected sm_80, sm_86, sm_87, sm_89, sm_90, sm_100 or sm_120)");
}

std::string nvrtc_version() {
  const NvrtcApi& nv = nvrtc();  // throws NvrtcUnavailable where none loads
  return std::to_string(nv.major) + "." + std::to_string(nv.minor);
}

Resources parse_ptxas_log(const std::string& log) {
  // One block per entry function; a multi-kernel family reports the worst of its kernels.
  Resources r;
  auto each = [&](const std::regex& re, auto&& take) {
    for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) take(*it);
  };
  each(std::regex(R"(Used (\d+) registers)"), [&](const std::smatch& m) { r.registers = std::max(r.registers, std::stoi(m[1])); });
  each(std::regex(R"((\d+) bytes smem)"), [&](const std::smatch& m) { r.smem_static = std::max(r.smem_static, std::stoi(m[1])); });
  each(std::regex(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)"),
       [&](const std::smatch& m) {
         r.stack_bytes = std::max(r.stack_bytes, std::stoi(m[1]));
         r.spill_stores = std::max(r.spill_stores, std::stoi(m[2]));
         r.spill_loads = std::max(r.spill_loads, std::stoi(m[3]));
       });
  return r;
}

std::map<std::string, Resources> parse_ptxas_entries(const std::string& log) {
  static const std::string marker = "Compiling entry function '";
  std::map<std::string, Resources> out;
  for (size_t at = log.find(marker); at != std::string::npos;) {
    const size_t name0 = at + marker.size(), name1 = log.find('\'', name0);
    if (name1 == std::string::npos) break;
    const size_t next = log.find(marker, name1);
    out[log.substr(name0, name1 - name0)] = parse_ptxas_log(log.substr(name1, next == std::string::npos ? next : next - name1));
    at = next;
  }
  return out;
}

Compiler::Compiler(std::string arch) : arch_(std::move(arch)) {
  arch_limits(arch_);  // validates the name
  std::string all;
  for (const auto& f : embedded_templates()) all += f.name + '\0' + f.contents + '\0';
  source_hash_ = content_hash(all);
}

std::string Compiler::target(const Family& f) const {
  return f.hopper_only && arch_ == "sm_90" ? "sm_90a" : arch_;
}

std::vector<std::string> Compiler::options(const Family& f) const {
  // --frandom-seed: NVRTC otherwise names internal-linkage symbols of a templated program after the
  // compiling process, so the same variant's cubin differed between processes (the tuner's, the runtime's
  // JIT, an AOT build's) in those names; seeded, a variant's cubin is the same bytes everywhere.
  return {"--gpu-architecture=" + target(f), "--std=c++17", "-Xptxas=-v", "-DFLASHTUNE_NVRTC=1",
          "--frandom-seed=flashtune"};
}

std::string Compiler::options_string(const Family& f) const {
  std::string s;
  for (const auto& o : options(f)) s += (s.empty() ? "" : " ") + o;
  return s;
}

std::vector<std::string> Variant::name_expressions() const {
  return family->name_expressions(config, head_dim, causal, dtype, varlen, paged, mods, page_layout,
                                  mask ? mask->type_name() : std::string());
}

Variant variant_for(const Family& f, const Config& c, const Problem& p) {
  Variant v{&f, c, p.head_dim, p.causal, p.dtype, p.varlen.enabled(), p.paged.enabled(), problem_mods(p), p.paged.layout};
  if (p.mask_mod.enabled()) v.mask = std::make_shared<const MaskPredicate>(p.mask_mod.predicate);
  return v;
}

std::string Compiler::variant_hash(const Variant& v) const {
  std::string key = source_hash_ + '|' + options_string(*v.family) + '|' + nvrtc_version() + '|' + arch_;
  for (const auto& e : v.name_expressions()) key += '|' + e;
  if (v.mask) key += '|' + v.mask->body + '|' + std::to_string(v.mask->names.size());  // (the type name hashes both)
  return content_hash(key);
}

namespace {
Problem shape_free_probe(const Variant& v) {  // launch geometry that does not depend on the shape
  Problem probe;
  probe.head_dim = v.head_dim;
  probe.causal = v.causal;
  probe.dtype = v.dtype;
  probe.direction = v.family->direction;
  return probe;
}
}  // namespace

std::string Compiler::prune_before_compile(const Variant& v) const {
  const Family& f = *v.family;
  if (f.hopper_only && target(f) != "sm_90a") return "needs Hopper's wgmma (sm_90a); target is " + arch_;
  if (v.varlen && !f.varlen) return "does not support packed variable-length batches";
  if (v.paged && !f.paged) return "does not read paged K/V caches";
  if (v.varlen && v.paged) return "the packed and the paged form do not combine";
  if (v.page_layout == PageLayout::nhd && !v.paged) return "a page layout goes with the paged form";
  if (v.page_layout == PageLayout::nhd && !f.paged_nhd) return "does not read token-major (nhd) paged K/V caches";
  if (v.mods & ~f.mods) return "has no " + mods_string(v.mods & ~f.mods) + " form";
  if (((v.mods & kModMask) != 0) != (v.mask != nullptr)) return "a mask variant needs its predicate, and only it one";
  if ((v.mods & kModMask) && (v.varlen || v.paged)) return "a mask_mod is dense only";
  if ((v.mods & kModMask) && (v.mods & kModWindow)) return "a mask_mod does not combine with a window";
  if (const char* why = f.mods_check(v.config, v.mods)) return why;
  if (!f.has_mods(v.mods, v.head_dim))
    return "has its " + mods_string(v.mods) + " form up to head_dim " + std::to_string(f.mods_max_head_dim) +
           " (past it the kernels spill)";
  if (const char* why = f.check(v.config, v.head_dim)) return why;
  if (const char* why = f.causal_check(v.config, v.causal)) return why;
  if (v.varlen)
    if (const char* why = f.varlen_check(v.config)) return why;
  unsigned max_smem = 0;
  for (const Launch& l : f.launches(v.config, shape_free_probe(v))) max_smem = std::max(max_smem, l.smem_bytes);
  const ArchLimits lim = arch_limits(arch_);
  if ((int)max_smem > lim.max_smem_per_block)
    return "shared memory " + std::to_string(max_smem) + " B exceeds the " + arch_ + " limit of " +
           std::to_string(lim.max_smem_per_block) + " B";
  return "";
}

KernelRecord Compiler::compile(const Variant& v) const {
  const Family& f = *v.family;
  KernelRecord k;
  k.hash = variant_hash(v);
  k.family = f.name;
  k.direction = f.direction;
  k.config = f.config_string(v.config);
  k.head_dim = v.head_dim;
  k.causal = v.causal;
  k.dtype = v.dtype;
  k.arch = arch_;
  k.nvrtc_version = nvrtc_version();
  k.options = options_string(f);
  k.source_hash = source_hash_;
  const std::vector<std::string> exprs = v.name_expressions();
  for (const auto& e : exprs) k.name_expression += (k.name_expression.empty() ? "" : "\n") + e;

  // Prune before compiling: the target's instruction set, the family's constraints, the target's limits.
  k.reason = prune_before_compile(v);
  if (!k.reason.empty()) {
    k.status = "pruned";
    return k;
  }
  const ArchLimits lim = arch_limits(arch_);

  auto t0 = std::chrono::steady_clock::now();
  const EmbeddedHeaders headers = embedded_headers();
  // A mask_mod's wrapper first (its struct is the traits' fifth argument), then the family's template.
  const std::string source =
      v.mask ? mask_program_source(*v.mask, f.template_file) : "#include \"" + f.template_file + "\"\n";
  const NvrtcApi& nv = nvrtc();
  nvrtcProgram prog;
  nv.CreateProgram(&prog, source.c_str(), ("flashtune_" + f.name + ".cu").c_str(), headers.count(),
                     headers.sources.data(), headers.names.data());
  for (const auto& e : exprs) nv.AddNameExpression(prog, e.c_str());
  const auto opts = options(f);
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  nvrtcResult rc = nv.CompileProgram(prog, (int)copts.size(), copts.data());
  size_t log_size = 0;
  nv.GetProgramLogSize(prog, &log_size);
  k.log.resize(log_size);
  if (log_size) nv.GetProgramLog(prog, k.log.data());
  while (!k.log.empty() && k.log.back() == '\0') k.log.pop_back();
  k.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  if (rc != NVRTC_SUCCESS) {
    k.status = "compile_error";
    // The first "error" line says why (a static_assert message, for instance).
    auto pos = k.log.find("error");
    k.reason = pos == std::string::npos ? nv.GetErrorString(rc) : k.log.substr(pos, k.log.find('\n', pos) - pos);
    nv.DestroyProgram(&prog);
    return k;
  }
  for (const auto& e : exprs) {
    const char* lowered = nullptr;
    nv.GetLoweredName(prog, e.c_str(), &lowered);
    k.lowered_name += (k.lowered_name.empty() ? "" : "\n") + std::string(lowered ? lowered : "");
  }
  size_t cubin_size = 0;
  nv.GetCUBINSize(prog, &cubin_size);
  k.cubin.resize(cubin_size);
  nv.GetCUBIN(prog, k.cubin.data());
  nv.DestroyProgram(&prog);

  k.res = parse_ptxas_log(k.log);
  k.status = "compiled";
  if (k.res.spill_stores > 0 || k.res.spill_loads > 0 || k.res.stack_bytes > 0) {
    k.status = "pruned";
    k.reason = "spills: " + std::to_string(k.res.stack_bytes) + " B stack, " + std::to_string(k.res.spill_stores) +
               " B spill stores, " + std::to_string(k.res.spill_loads) + " B spill loads";
  } else {
    // Each kernel against its own launch: its registers times its threads, its static shared memory plus its
    // dynamic (a kernel's static buffer is not another kernel's). A name the log lacks gets the worst of all.
    const auto entries = parse_ptxas_entries(k.log);
    const auto launches = f.launches(v.config, shape_free_probe(v));
    std::vector<std::string> names;
    for (size_t a = 0, b; a <= k.lowered_name.size(); a = b + 1) {
      b = k.lowered_name.find('\n', a);
      if (b == std::string::npos) b = k.lowered_name.size();
      names.push_back(k.lowered_name.substr(a, b - a));
    }
    for (size_t i = 0; i < launches.size() && k.status == "compiled"; ++i) {
      const auto e = i < names.size() ? entries.find(names[i]) : entries.end();
      const Resources& r = e != entries.end() ? e->second : k.res;
      const std::string kernel = i < f.kernels.size() ? f.kernels[i] : "kernel " + std::to_string(i);
      if ((long long)r.registers * launches[i].threads > lim.registers_per_sm) {
        k.status = "pruned";
        k.reason = kernel + ": " + std::to_string(r.registers) + " registers x " + std::to_string(launches[i].threads) +
                   " threads exceed the register file";
      } else if ((long long)launches[i].smem_bytes + r.smem_static > lim.max_smem_per_block) {
        k.status = "pruned";
        k.reason = kernel + ": static + dynamic shared memory exceeds the limit";
      }
    }
  }
  if (k.status != "compiled") k.cubin.clear();
  return k;
}

std::vector<KernelRecord> Compiler::compile_all(const std::vector<Variant>& variants, KernelCache* cache,
                                                const std::function<void(size_t, size_t)>& progress) const {
  std::vector<KernelRecord> out(variants.size());
  std::vector<size_t> todo;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (cache) {
      if (auto k = cache->find_kernel(variant_hash(variants[i]))) {
        out[i] = std::move(*k);
        continue;
      }
    }
    todo.push_back(i);
  }
  std::atomic<size_t> next{0}, done{variants.size() - todo.size()};
  std::mutex store_mutex;
  auto work = [&] {
    for (size_t t; (t = next++) < todo.size();) {
      size_t i = todo[t];
      std::optional<KernelRecord> stored;  // another process sharing the store may have compiled it meanwhile
      if (cache) {
        std::lock_guard lock(store_mutex);
        stored = cache->find_kernel(variant_hash(variants[i]));
      }
      out[i] = stored ? std::move(*stored) : compile(variants[i]);
      std::lock_guard lock(store_mutex);
      if (cache && !stored) cache->put_kernel(out[i]);
      size_t d = ++done;
      if (progress) progress(d, variants.size());
    }
  };
  unsigned n = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), (unsigned)todo.size()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(work);
  for (auto& th : pool) th.join();
  return out;
}

}  // namespace flashtune
