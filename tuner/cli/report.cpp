// flashtune report: REPORT.md, CSVs and plots from a store (reports/make_report.py).
#include "tuner/cli/verbs.hpp"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/family.hpp"
#include "core/util.hpp"
#include "process/subprocess.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"

using nlohmann::json;

namespace flashtune::cli {

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
  no_positional(a, "report");
  if (a.has("db") == a.has("gpu")) throw UsageError("report needs exactly one of --db PATH and --gpu SLUG");
  std::string db = a.get("db");
  if (a.has("gpu")) {
    const std::string slug = a.get("gpu");
    if (slug.empty() || slug.find('/') != std::string::npos || slug == "." || slug == "..")
      throw UsageError("--gpu takes a folder name under reports/, got '" + brief(slug) + "'");
    db = a.get("reports", std::string(FLASHTUNE_SOURCE_DIR) + "/reports") + "/" + slug + "/results.db";
  }
  {  // exists, is ours, is readable, and within the bounds of a read (ReadBudget: rows, text; the packed
     // lengths): one line and exit 2 if not, before Python reads it whole
    Store check(db, Store::Mode::read_only);
    check.results({});
    for (const auto& run : check.experiment_runs()) check.experiment_rows(run.id);
  }
  const std::string out = a.has("out") ? a.get("out") : std::filesystem::path(db).parent_path().string();
  std::error_code ec;
  std::filesystem::create_directories(out.empty() ? "." : out, ec);
  if (ec || !std::filesystem::is_directory(out.empty() ? "." : out))
    throw UsageError("--out '" + out + "' is not a folder that can be created");
  {  // REPORT.md, *.csv and *.png are written into --out (Python's open follows links): never over the store,
     // whatever name, link or hard link it has there
    auto writes = [](const std::filesystem::path& name) {
      const std::string ext = name.extension().string();
      return name == "REPORT.md" || ext == ".csv" || ext == ".png";
    };
    const std::filesystem::path name = std::filesystem::path(db).filename();
    bool over = same_file(std::filesystem::path(db).parent_path().empty() ? "." : std::filesystem::path(db).parent_path().string(),
                          out.empty() ? "." : out) && writes(name);
    for (const auto& e : std::filesystem::directory_iterator(out.empty() ? "." : out, ec)) {
      if (over) break;
      over = writes(e.path().filename()) && is_store_file(e.path().string(), db);
    }
    if (over) throw UsageError("report writes REPORT.md, *.csv and *.png into --out: it would overwrite the store '" + db + "'");
  }
  // An argv, never a shell string: the paths and slugs stay data.
  std::vector<std::string> args = {"python3", data_dir() + "/reports/make_report.py", "--db", db,
                                    "--out", out.empty() ? "." : out};
  for (const auto& f : families())
    if (!f.test_only) args.push_back("--default=" + f.name + ":" + f.config_string(f.default_config));
  ProcessOptions ro;
  ro.search_path = true;  // python3 from PATH
  return run_process(args, ro).status.ok() ? 0 : 1;
}

}  // namespace flashtune::cli
