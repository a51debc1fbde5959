// The SQLite functions the store calls, through one table. The tuner links SQLite (sqlite_linked.cpp);
// the runtime library defines sqlite() itself (runtime/src/sqlite_dlopen.cpp: libsqlite3.so.0 by dlopen,
// at the first $FLASHTUNE_DB lookup), so that it links no SQLite and loads where there is none.
#pragma once
#include <sqlite3.h>

namespace flashtune {

#define FT_SQLITE_FUNCTIONS(X)                                                                              \
  X(open_v2) X(close) X(busy_timeout) X(errmsg) X(errstr) X(exec) X(free) X(prepare_v2) X(finalize) X(step) \
  X(bind_text) X(bind_int64) X(bind_double) X(bind_null) X(bind_blob) X(column_text) X(column_blob)        \
  X(column_bytes) X(column_int64) X(column_double) X(last_insert_rowid) X(changes) X(limit)

struct SqliteApi {
#define FT_SQLITE_MEMBER(name) decltype(&::sqlite3_##name) name = nullptr;
  FT_SQLITE_FUNCTIONS(FT_SQLITE_MEMBER)
#undef FT_SQLITE_MEMBER
};

// The table; throws std::runtime_error (one line) where SQLite cannot be loaded.
const SqliteApi& sqlite();

}  // namespace flashtune
