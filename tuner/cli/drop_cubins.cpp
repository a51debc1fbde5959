// flashtune drop-cubins: strip compiled binaries from a store.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"

using nlohmann::json;

namespace flashtune::cli {

int cmd_drop_cubins(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune drop-cubins --db PATH\nRemoves compiled binaries, keeping every result and resource row.");
    return 0;
  }
  Args a = parse(argc, argv, {"db"}, {});
  no_positional(a, "drop-cubins");
  if (!a.has("db")) throw UsageError("drop-cubins needs --db");
  check_db_path(a.get("db"));
  require_file(a.get("db"), "database");  // a write verb, but not one that creates a store
  Store(a.get("db")).drop_cubins();
  return 0;
}

}  // namespace flashtune::cli
