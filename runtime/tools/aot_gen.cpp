// flashtune-aot-gen: the build-time half of FLASHTUNE_AOT_ARCHS. For each listed arch it compiles every
// variant the runtime can pick (runtime/src/aot.cpp's aot_variants) and the strided-copy kernels, with the
// same Compiler (NVRTC, options, variant hash) as the runtime's JIT path and the tuner, so the embedded
// cubins are byte for byte the ones the tuner validated. Writes OUT.bin (the cubins, back to back) and
// OUT.cpp (the table, sorted by hash, and the blob pulled in with .incbin).
// Usage: flashtune-aot-gen --archs 80,90a --out DIR/aot_kernels [--families a,b] [--head-dims 32,64]
//        [--dtypes fp32] [--causal 0,1] [--list]   (--list: print the plan, compile nothing)
// Exit: 0 written (or already up to date), 1 the copy kernel failed to compile or a file write failed,
// 2 bad arguments. Variants pruned or failing to compile are listed with their reason and left out (at
// run time NVRTC gives the same verdict and the runtime uses the family's default, which is built).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "aot.hpp"
#include "core/util.hpp"
#include "strided_copy.hpp"

using namespace flashtune;
using namespace flashtune::rt;

namespace {

struct Kernel {
  std::string names, cubin, what;  // what: a comment for the table line
};

std::vector<std::string> list(const std::string& s) {
  std::string t = s;
  for (char& c : t)
    if (c == ';') c = ',';
  std::vector<std::string> out;
  for (const std::string& x : split(t, ','))
    if (!trim(x).empty()) out.push_back(trim(x));
  return out;
}

std::vector<int> int_list(const std::string& flag, const std::string& s) {
  std::vector<int> out;
  for (const std::string& x : list(s)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(x, &used);
    } catch (const std::exception&) {
    }
    if (used != x.size() || x.empty()) throw UsageError(flag + ": '" + brief(x) + "' is not an integer");
    out.push_back(v);
  }
  return out;
}

// A C++ string literal's body.
std::string c_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if ((unsigned char)c < 0x20) out += '?';
    else out += c;
  }
  return out;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return in ? ss.str() : "";
}

// Written to a temporary file beside `path` and renamed: a build never sees half a file.
void write_file(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(data.data(), (std::streamsize)data.size());
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::puts("usage: flashtune-aot-gen --archs 80,90a --out PREFIX [--families F,...] [--head-dims D,...] "
                "[--dtypes T,...] [--causal 0,1] [--list]");
      return 0;
    }
    if (a == "--list") {
      args[a] = "1";
      continue;
    }
    static const char* known[] = {"--archs", "--out", "--families", "--head-dims", "--dtypes", "--causal"};
    bool ok = false;
    for (const char* k : known) ok = ok || a == k;
    if (!ok) throw UsageError("unknown argument '" + brief(a) + "'");
    if (i + 1 >= argc) throw UsageError(a + " needs a value");
    if (args.count(a)) throw UsageError(a + " given twice");
    args[a] = argv[++i];
  }
  const bool list_only = args.count("--list");
  if (!args.count("--archs") || (!args.count("--out") && !list_only)) throw UsageError("--archs and --out are required");
  const std::string out = args["--out"];
  const std::string bin_path = std::filesystem::absolute(out + ".bin").string();
  if (bin_path.find_first_of("\"\\\n") != std::string::npos)
    throw UsageError("the output path holds a quote, backslash or newline: " + brief(bin_path));

  AotFilter filter;
  filter.families = list(args["--families"]);
  for (const std::string& f : filter.families) find_family(f);  // throws for an unknown name
  filter.head_dims = int_list("--head-dims", args["--head-dims"]);
  for (const std::string& t : list(args["--dtypes"])) filter.dtypes.push_back(parse_dtype(t));
  filter.causal = int_list("--causal", args["--causal"]);
  for (int c : filter.causal)
    if (c != 0 && c != 1) throw UsageError("--causal: " + std::to_string(c) + " is not 0 or 1");

  std::vector<AotArch> archs;
  const std::vector<std::string> entries = list(args["--archs"]);
  if (entries.empty()) throw UsageError("--archs is empty");
  for (const std::string& e : entries) archs.push_back(parse_aot_arch(e));

  // Plan first (cheap, no NVRTC): the key of everything the table will hold.
  struct ArchPlan {
    std::string entry;
    AotArch arch;
    AotPlan plan;
  };
  std::vector<ArchPlan> plans;
  // The generated files' form (bump when it changes) and where the .cpp says the blob is.
  std::string key = "flashtune-aot 2|" + bin_path;
  for (size_t i = 0; i < archs.size(); ++i) {
    ArchPlan p{entries[i], archs[i], aot_variants(generated_tables(), archs[i], filter)};
    const Compiler compiler(p.arch.arch);
    key += '|' + p.entry + ':' + copy_kernel_hash(p.arch.arch);
    for (const Variant& v : p.plan.variants) key += ',' + compiler.variant_hash(v);
    plans.push_back(std::move(p));
  }
  if (list_only) {
    for (const ArchPlan& p : plans) {
      std::printf("%s (%s): %zu variants\n", p.entry.c_str(), p.arch.arch.c_str(), p.plan.variants.size());
      for (const Variant& v : p.plan.variants)
        std::printf("  %s %s d=%d %s%s%s\n", v.family->name.c_str(), v.family->config_string(v.config).c_str(),
                    v.head_dim, to_string(v.dtype), v.causal ? " causal" : "",
                    v.varlen ? " packed" : v.paged ? (v.page_layout == PageLayout::nhd ? " paged nhd" : " paged") : "");
      for (const std::string& s : p.plan.skipped) std::printf("  not built: %s\n", s.c_str());
    }
    return 0;
  }
  const std::string plan_key = content_hash(key);
  const std::string cpp_path = out + ".cpp";
  const std::string old = read_all(cpp_path);
  if (old.find("// plan " + plan_key + "\n") != std::string::npos) {
    const std::string blob = read_all(bin_path);
    if (old.find("// blob " + content_hash(blob) + "\n") != std::string::npos) {
      std::printf("flashtune AOT kernels for %s: up to date\n", args["--archs"].c_str());
      return 0;
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, Kernel> kernels;  // by hash: sorted, and 90 / 90a share theirs
  size_t not_built = 0;
  for (const ArchPlan& p : plans) {
    const Compiler compiler(p.arch.arch);
    std::printf("flashtune AOT %s (%s): %zu variants\n", p.entry.c_str(), p.arch.arch.c_str(), p.plan.variants.size());
    for (const std::string& s : p.plan.skipped) std::printf("  not built: %s\n", s.c_str());
    std::fflush(stdout);
    std::vector<Variant> todo;
    for (const Variant& v : p.plan.variants)
      if (!kernels.count(compiler.variant_hash(v))) todo.push_back(v);
    size_t last = 0;
    const std::vector<KernelRecord> recs = compiler.compile_all(todo, nullptr, [&](size_t done, size_t total) {
      if (done == total || done >= last + std::max<size_t>(1, total / 10)) {
        std::printf("  %zu/%zu compiled\n", done, total);
        std::fflush(stdout);
        last = done;
      }
    });
    for (size_t i = 0; i < todo.size(); ++i) {
      const KernelRecord& k = recs[i];
      Kernel out;
      out.what = k.family + " " + k.config + " d=" + std::to_string(k.head_dim) + " " + to_string(k.dtype) +
                 (k.causal ? " causal" : "") + (todo[i].varlen ? " packed" : todo[i].paged ? (todo[i].page_layout == PageLayout::nhd ? " paged nhd" : " paged") : "") + " " +
                 compiler.arch();
      if (k.status != "compiled") {
        std::printf("  not built: %s: %s: %s\n", out.what.c_str(), k.status.c_str(), brief(k.reason, 200).c_str());
        ++not_built;
        continue;
      }
      out.names = k.lowered_name;
      out.cubin = k.cubin;
      kernels[k.hash] = std::move(out);
    }
    const std::string copy_hash = copy_kernel_hash(p.arch.arch);
    if (!kernels.count(copy_hash)) {
      std::string error;
      Kernel copy;
      copy.cubin = compile_copy_kernel(p.arch.arch, &error);
      if (copy.cubin.empty()) throw std::runtime_error(error);
      for (const std::string& n : copy_kernel_names()) copy.names += (copy.names.empty() ? "" : "\n") + n;
      copy.what = "strided copy " + p.arch.arch;
      kernels[copy_hash] = std::move(copy);
    }
  }

  std::string blob, table;
  for (const auto& [hash, k] : kernels) {
    table += "    {\"" + hash + "\", \"" + c_escape(k.names) + "\", " + std::to_string(blob.size()) + ", " +
             std::to_string(k.cubin.size()) + "},  // " + k.what + "\n";
    blob += k.cubin;
  }
  std::string cpp = "// Generated by flashtune-aot-gen for FLASHTUNE_AOT_ARCHS " + args["--archs"] +
                    " (runtime/tools/aot_gen.cpp). Do not edit.\n// plan " + plan_key + "\n// blob " +
                    content_hash(blob) + "\n";
  cpp += "#include \"aot.hpp\"\n\n";
  cpp += "// The cubins, back to back (" + std::to_string(blob.size()) + " bytes), read by the assembler.\n";
  cpp += "__asm__(\".section .rodata.flashtune_aot,\\\"a\\\",@progbits\\n\"\n"
         "        \".balign 16\\n\"\n"
         "        \".hidden flashtune_aot_blob\\n\"\n"
         "        \"flashtune_aot_blob:\\n\"\n"
         "        \".incbin \\\"" + bin_path + "\\\"\\n\"\n"
         "        \".previous\\n\");\n";
  cpp += "extern \"C\" __attribute__((visibility(\"hidden\"))) const unsigned char flashtune_aot_blob[];\n\n";
  cpp += "namespace flashtune::rt {\nnamespace {\n// hash, lowered names, offset and size in the blob\n";
  cpp += "const AotKernel kKernels[] = {\n" + table + "};\n}  // namespace\n\n";
  cpp += "AotTable aot_table() { return {kKernels, sizeof kKernels / sizeof kKernels[0], flashtune_aot_blob}; }\n\n";
  cpp += "}  // namespace flashtune::rt\n";
  write_file(bin_path, blob);
  write_file(cpp_path, cpp);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("flashtune AOT kernels for %s: %zu built, %zu not (%.1f MiB) in %s\n", args["--archs"].c_str(),
              kernels.size(), not_built, blob.size() / 1048576.0, format_duration(s).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "flashtune-aot-gen: %s\n", brief(e.what(), 400).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashtune-aot-gen: error: %s\n", brief(e.what(), 400).c_str());
    return 1;
  }
}
