// flashtune import: a T4 file exported by flashtune into a store.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/interop/t4.hpp"

using nlohmann::json;

namespace flashtune::cli {

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
  if (is_store_file(a.positional[0], a.get("db")))  // the import would write the file it reads
    throw UsageError("'" + a.positional[0] + "' is the --db store itself (or a file SQLite keeps beside it)");
  ImportSummary s = t4_import(a.positional[0], a.get("db"));
  if (s.already)
    std::printf("%s: already imported (provenance %lld), nothing copied\n", a.positional[0].c_str(), s.provenance_id);
  else
    std::printf("%s: %lld results, +%lld, %lld already stored%s  (db %s)\n", a.positional[0].c_str(), s.total, s.added,
                s.present + s.differ, s.differ ? (" (" + std::to_string(s.differ) + " with other values, kept as stored)").c_str() : "",
                a.get("db").c_str());
  return 0;
}

}  // namespace flashtune::cli
