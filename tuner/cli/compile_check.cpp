// flashtune compile-check: compile (or prune) every variant of a space.
#include "tuner/cli/verbs.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/compile.hpp"
#include "core/mask_mod.hpp"
#include "core/util.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/space/space.hpp"

using nlohmann::json;

namespace flashtune::cli {

int cmd_compile_check(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune compile-check <space.json> [--arch sm_90] [--db PATH] [--save-cubins DIR]\n"
              "Compiles every variant of the space with NVRTC (or prunes it, with the reason) and prints the\n"
              "resource table; --save-cubins writes each compiled variant to DIR/<lowered name>.cubin (for\n"
              "cuobjdump). The space's \"varlen\": [false, true] compiles the packed variable-length form of\n"
              "its variants too, \"paged\": [false, true] the paged K/V cache form (column form; with\n"
              "\"page_layouts\": [\"hnd\", \"nhd\"] also its token-major pages, form paged-nhd); \"mods\": [\"mask\", ...]\n"
              "with \"mask_mod\": {\"predicate\": \"...\", \"tensors\": [\"doc\"]} the mask_mod form. Exit 1 if any\n"
              "variant failed to compile.");
    return 0;
  }
  Args a = parse(argc, argv, {"arch", "db", "save-cubins"}, {"allow-large-space"});
  if (a.positional.size() != 1) throw UsageError("compile-check takes one space file");
  Space space = load_space(a.positional[0], a.has("allow-large-space"));
  Compiler c(a.get("arch", "sm_90"));
  if (space.mask) check_mask_compiles(*space.mask);  // a predicate NVRTC rejects: one line, not a row per variant
  if (a.has("save-cubins")) {  // checked before any work
    std::error_code ec;
    std::filesystem::create_directories(a.get("save-cubins"), ec);
    if (ec || !std::filesystem::is_directory(a.get("save-cubins")))
      throw UsageError("--save-cubins: cannot create folder '" + a.get("save-cubins") + "'");
  }
  std::unique_ptr<Store> store;
  if (a.has("db") && is_store_file(a.positional[0], a.get("db")))
    throw UsageError("the space file '" + a.positional[0] + "' is the --db store (or a file SQLite keeps beside it)");
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
    // The form, and the score modifications compiled in ("dense+window", "varlen+window+softcap").
    const std::string form = std::string(variants[i].varlen                              ? "varlen"
                                         : !variants[i].paged                            ? "dense"
                                         : variants[i].page_layout == PageLayout::nhd   ? "paged-nhd"
                                                                                        : "paged") +
                             (variants[i].mods ? "+" + mods_string(variants[i].mods) : "");
    std::printf("%-10s %-44s %4d %-6s %-5s %-6s %-13s %5d %6d  %s\n", k.family.c_str(), k.config.c_str(), k.head_dim,
                k.causal ? "yes" : "no", to_string(k.dtype), form.c_str(), k.status.c_str(),
                k.res.registers, k.res.spill_stores, k.reason.substr(0, 90).c_str());
  }
  if (a.has("save-cubins")) {
    // A kernel may come from --db's store: its lowered name is stored text, checked before any file is written.
    for (const auto& k : kernels)
      if (k.status == "compiled" && !is_safe_file_name(split(k.lowered_name, '\n')[0]))
        throw UsageError("--save-cubins: kernel " + brief(k.hash, 40) + "'s lowered name '" +
                         brief(split(k.lowered_name, '\n')[0]) + "' is not a plain file name");
    // No cubin over an input: the space file, the store or a file SQLite keeps beside it (checked first).
    for (const auto& k : kernels)
      if (k.status == "compiled") {
        const auto file = std::filesystem::path(a.get("save-cubins")) / (split(k.lowered_name, '\n')[0] + ".cubin");
        if ((a.has("db") && is_store_file(file.string(), a.get("db"))) || same_file(file.string(), a.positional[0]))
          throw UsageError("--save-cubins: '" + file.string() + "' is an input (" +
                           (same_file(file.string(), a.positional[0]) ? "the space file" : "the --db store") +
                           "): save the cubins elsewhere");
      }
    for (const auto& k : kernels)
      if (k.status == "compiled") {
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

}  // namespace flashtune::cli
