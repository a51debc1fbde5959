// sqlite() for the runtime library: libsqlite3.so.0 by dlopen at first use (a $FLASHTUNE_DB lookup).
// Defined here, among the library's own objects, so the linker never takes results/sqlite_linked.cpp from
// the tuner's archive and the library needs no SQLite unless $FLASHTUNE_DB is set.
#include <dlfcn.h>

#include <stdexcept>
#include <string>

#include "results/sqlite_api.hpp"

namespace flashtune {

namespace {
struct Loaded {
  SqliteApi api;
  std::string why;  // empty: usable
};

Loaded load() {
  Loaded l;
  void* lib = dlopen("libsqlite3.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    l.why = std::string("cannot load SQLite: ") + (e ? e : "libsqlite3.so.0 not found");
    return l;
  }
#define FT_SQLITE_LOAD(name)                                                              \
  l.api.name = reinterpret_cast<decltype(&::sqlite3_##name)>(dlsym(lib, "sqlite3_" #name)); \
  if (!l.api.name) {                                                                      \
    l.why = "libsqlite3.so.0 has no sqlite3_" #name;                                      \
    return l;                                                                             \
  }
  FT_SQLITE_FUNCTIONS(FT_SQLITE_LOAD)
#undef FT_SQLITE_LOAD
  return l;
}
}  // namespace

const SqliteApi& sqlite() {
  static const Loaded loaded = load();  // once per process, thread-safe
  if (!loaded.why.empty()) throw std::runtime_error(loaded.why);
  return loaded.api;
}

}  // namespace flashtune
