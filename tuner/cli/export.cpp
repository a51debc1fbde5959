// flashtune export: results in the T4 auto-tuning format.
#include "tuner/cli/verbs.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/interop/t4.hpp"

using nlohmann::json;

namespace flashtune::cli {

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
    if (is_store_file(out, a.get("db")))  // the store itself, or its -wal, -shm or -journal: by any spelling
      throw UsageError("-o '" + out + "' is the --db store (or a file SQLite keeps beside it): export to another file");
    out_dir = std::filesystem::path(out).parent_path().string();
    if (!std::filesystem::is_directory(out_dir.empty() ? "." : out_dir))
      throw UsageError("-o '" + out + "': folder '" + out_dir + "' does not exist");
  }
  Store store(a.get("db"), Store::Mode::read_only);
  if (!a.has("output")) {  // every row is checked before the first byte is written
    t4_export(store, filter, [](std::string_view piece) { std::fwrite(piece.data(), 1, piece.size(), stdout); });
    return 0;
  }
  // A temporary file beside the target, written as the document is made, renamed over it: a failed export
  // leaves the old file whole.
  const std::string out = a.get("output");
  std::string tmp = out + ".tmp-XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) throw UsageError("-o '" + out + "': cannot create a file in '" + (out_dir.empty() ? "." : out_dir) + "'");
  bool written = true;
  try {
    t4_export(store, filter, [&](std::string_view piece) {
      while (written && !piece.empty()) {
        const ssize_t n = write(fd, piece.data(), piece.size());
        if (n <= 0) written = false;
        else piece.remove_prefix((size_t)n);
      }
    });
  } catch (...) {
    close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  fchmod(fd, 0644);
  if (close(fd) != 0 || !written || std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write '" + out + "'");
  }
  return 0;
}

}  // namespace flashtune::cli
