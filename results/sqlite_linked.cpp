// sqlite() for programs that link SQLite: the functions themselves.
#include "results/sqlite_api.hpp"

namespace flashtune {

const SqliteApi& sqlite() {
  static const SqliteApi api = [] {
    SqliteApi a;
#define FT_SQLITE_LINKED(name) a.name = &::sqlite3_##name;
    FT_SQLITE_FUNCTIONS(FT_SQLITE_LINKED)
#undef FT_SQLITE_LINKED
    return a;
  }();
  return api;
}

}  // namespace flashtune
