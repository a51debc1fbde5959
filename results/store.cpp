#include "results/store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <iterator>
#include <random>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "results/sqlite_api.hpp"

namespace flashtune {


namespace {

// SQLITE_BUSY / SQLITE_LOCKED where SQLite gave up (or never called the busy handler): retried.
struct BusyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
constexpr int kBusyTimeoutMs = 60000;       // the busy handler's wait per statement
constexpr double kBusyRetrySeconds = 300;   // and our own retries on top of it

[[noreturn]] void throw_sqlite(sqlite3* db, int rc, const std::string& what) {
  const std::string msg = std::string("sqlite: ") + (db ? sqlite().errmsg(db) : sqlite().errstr(rc)) + what;
  if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) throw BusyError(msg);
  // A damaged file, or one whose tables lack a column we read: bad input (one line, exit 2).
  if ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_FORMAT)
    throw UsageError("the database is damaged: " + brief(msg, 200));
  // SQLite refuses a record that claims a huge size as out of memory: a damaged file of 15 KB did so (fuzz_store).
  if ((rc & 0xff) == SQLITE_NOMEM)
    throw UsageError("the database is damaged (a record larger than SQLite reads) or too large to read here: " +
                     brief(msg, 200));
  // A value past SQLITE_LIMIT_LENGTH (kMaxStoredValueBytes), refused before SQLite allocates it.
  if ((rc & 0xff) == SQLITE_TOOBIG)
    throw UsageError("the database holds a value over " + std::to_string(kMaxStoredValueBytes >> 20) +
                     " MiB, more than flashtune reads or writes in one: " + brief(msg, 200));
  if ((rc & 0xff) == SQLITE_ERROR && what.rfind(" in: ", 0) == 0)
    throw UsageError("the database does not have the tables and columns of its schema version: " + brief(msg, 200));
  throw std::runtime_error(msg);
}

// sqlite3_exec of one or more statements; BUSY and LOCKED as BusyError (retried by write_txn).
void exec_sql(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (int rc = sqlite().exec(db, sql.c_str(), nullptr, nullptr, &err); rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite().errstr(rc);
    sqlite().free(err);
    if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) throw BusyError("sqlite: " + msg);
    throw std::runtime_error("sqlite: " + msg);
  }
}

void backoff(int attempt) {
  static thread_local std::minstd_rand rng{(unsigned)getpid()};
  std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % (5 + 10 * std::min(attempt, 20))));
}

// A statement's columns as one list of names: its SQL is written from the list, and a read or a bind names
// its column, resolved at compile time (a misspelt or missing name does not compile), never a position.
struct Column {
  int index;  // in the list: the result column, and the parameter index + 1 of a list written as placeholders
};

template <size_t N>
struct Columns {
  std::array<std::string_view, N> names;

  consteval Column operator[](std::string_view name) const {
    for (size_t i = 0; i < N; ++i)
      if (names[i] == name) return {(int)i};
    throw "no such column in this list";  // not a constant expression: a compile error
  }
  // "a,b,c": a SELECT or an INSERT's column list. With `expr`: each column as expr(name), aliased to its
  // name where that differs (a stand-in for a column an older schema lacks, or one a lean read skips).
  std::string list() const {
    return list([](std::string_view c) { return std::string(c); });
  }
  template <class Expr>
  std::string list(Expr&& expr) const {
    std::string out;
    for (std::string_view c : names) {
      const std::string e = expr(c);
      out += (out.empty() ? "" : ",") + e + (e == c ? "" : " AS " + std::string(c));
    }
    return out;
  }
  // "?,?,?": an INSERT's values, one parameter per column in order; with `expr`, a column's own placeholder
  // expression ("NULLIF(?,0)").
  std::string placeholders() const {
    return placeholders([](std::string_view) { return std::string("?"); });
  }
  template <class Expr>
  std::string placeholders(Expr&& expr) const {
    std::string out;
    for (std::string_view c : names) out += (out.empty() ? "" : ",") + std::string(expr(c));
    return out;
  }
  // "a=? AND b=?": a WHERE over every column, one parameter each, in order; `expr` as for list().
  template <class Expr>
  std::string equal_to_parameters(Expr&& expr) const {
    std::string out;
    for (std::string_view c : names) out += (out.empty() ? "" : " AND ") + expr(c) + "=?";
    return out;
  }
  std::string equal_to_parameters() const {
    return equal_to_parameters([](std::string_view c) { return std::string(c); });
  }
};

template <class... Names>
consteval auto column_list(Names... names) {
  return Columns<sizeof...(Names)>{{std::string_view(names)...}};
}

// A prepared statement; finalizes itself. Binds and reads take a Column of the list the SQL was written
// from, or a position where the statement has one parameter or column (a count, an id).
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql) : db_(db) {
    if (int rc = sqlite().prepare_v2(db, sql.c_str(), -1, &s_, nullptr); rc != SQLITE_OK) {
      sqlite().finalize(s_);
      s_ = nullptr;
      throw_sqlite(db, rc, " in: " + sql.substr(0, 120));
    }
  }
  ~Stmt() { sqlite().finalize(s_); }
  Stmt& bind(int i, const std::string& v) { check(sqlite().bind_text(s_, i, v.c_str(), (int)v.size(), SQLITE_TRANSIENT)); return *this; }
  Stmt& bind(int i, long long v) { check(sqlite().bind_int64(s_, i, v)); return *this; }
  Stmt& bind(int i, int v) { return bind(i, (long long)v); }
  Stmt& bind(int i, double v) { check(sqlite().bind_double(s_, i, v)); return *this; }
  Stmt& bind_blob(int i, const std::string& v) {
    check(v.empty() ? sqlite().bind_null(s_, i) : sqlite().bind_blob(s_, i, v.data(), (int)v.size(), SQLITE_TRANSIENT));
    return *this;
  }
  template <class V>
  Stmt& bind(Column c, const V& v) { return bind(c.index + 1, v); }
  Stmt& bind_blob(Column c, const std::string& v) { return bind_blob(c.index + 1, v); }
  bool step() {
    int rc = sqlite().step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw_sqlite(db_, rc, "");
  }
  std::string text(int c) const {
    auto p = sqlite().column_text(s_, c);
    return p ? std::string((const char*)p, sqlite().column_bytes(s_, c)) : std::string();
  }
  std::string blob(int c) const {
    auto p = sqlite().column_blob(s_, c);
    return p ? std::string((const char*)p, sqlite().column_bytes(s_, c)) : std::string();
  }
  long long bytes(int c) const { return sqlite().column_bytes(s_, c); }  // as text (a number is converted)
  long long i64(int c) const { return sqlite().column_int64(s_, c); }
  double f64(int c) const { return sqlite().column_double(s_, c); }
  std::string text(Column c) const { return text(c.index); }
  long long bytes(Column c) const { return bytes(c.index); }
  std::string blob(Column c) const { return blob(c.index); }
  long long i64(Column c) const { return i64(c.index); }
  double f64(Column c) const { return f64(c.index); }

 private:
  void check(int rc) {
    if (rc != SQLITE_OK) throw std::runtime_error(std::string("sqlite bind: ") + sqlite().errmsg(db_));
  }
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
};

// The results table of schema v8, by name (the v3 -> v4, v5 -> v6, v6 -> v7 and v7 -> v8 migrations build it
// beside the old one). heads_k (v6): grouped-query attention's kv heads, 0 for multi-head. varlen (v7): a packed
// variable-length batch's description (Varlen::key(), canonical JSON), '' for a dense problem; batch,
// seq_q and seq_k then hold the number of sequences and the longest lengths. paged (v8): a paged K/V cache's
// description (Paged::key()), '' for contiguous K/V; seq_k then holds the longest cache length. window_left,
// window_right and softcap (v9): the sliding window and the logit softcap (Problem's fields; -1, -1, 0: none, what
// every earlier row means). alibi (v10): ALiBi's bias (Problem::alibi; 0: none, what every earlier row means; the
// slopes are seeded inputs, not identity). mask_mod (v11): a mask predicate's identity (MaskMod::key(), canonical
// JSON: the normalised predicate and each tensor's content digest), '' for none, what every earlier row means.
std::string results_ddl(const std::string& name) {
  return "CREATE TABLE IF NOT EXISTS " + name + R"sql((
  id INTEGER PRIMARY KEY,
  kernel_hash TEXT NOT NULL, family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
  batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
  head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, causal INTEGER NOT NULL,
  status TEXT NOT NULL, error TEXT,
  max_abs REAL, max_rel REAL, mse REAL,
  ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL, gbps REAL, seed INTEGER,
  device_name TEXT NOT NULL, arch TEXT NOT NULL, sm_count INTEGER NOT NULL, driver_version INTEGER NOT NULL,
  nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
  registers INTEGER, smem_static INTEGER, spill_stores INTEGER,
  created TEXT NOT NULL, detail TEXT, inputs TEXT NOT NULL DEFAULT 'normal', origin INTEGER,
  heads_k INTEGER NOT NULL DEFAULT 0, varlen TEXT NOT NULL DEFAULT '', paged TEXT NOT NULL DEFAULT '',
  window_left INTEGER NOT NULL DEFAULT -1, window_right INTEGER NOT NULL DEFAULT -1, softcap REAL NOT NULL DEFAULT 0,
  alibi INTEGER NOT NULL DEFAULT 0, mask_mod TEXT NOT NULL DEFAULT '',
  UNIQUE(kernel_hash, device_name, sm_count, batch, heads, heads_k, seq_q, seq_k, inputs, varlen, paged,
         window_left, window_right, softcap, alibi, mask_mod)))sql";
}

constexpr const char* kSchemaRest = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kernels(
  hash TEXT PRIMARY KEY,
  family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
  head_dim INTEGER NOT NULL, causal INTEGER NOT NULL, dtype TEXT NOT NULL,
  arch TEXT NOT NULL, nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
  name_expression TEXT NOT NULL,
  status TEXT NOT NULL, reason TEXT, lowered_name TEXT,
  registers INTEGER, smem_static INTEGER, stack_bytes INTEGER, spill_stores INTEGER, spill_loads INTEGER,
  compile_ms REAL, log TEXT, cubin BLOB, created TEXT NOT NULL, origin INTEGER);

CREATE TABLE IF NOT EXISTS experiment_runs(
  id INTEGER PRIMARY KEY, experiment TEXT NOT NULL, title TEXT, device_name TEXT NOT NULL,
  probes TEXT, spec TEXT, created TEXT NOT NULL, origin INTEGER);
CREATE TABLE IF NOT EXISTS experiment_rows(
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES experiment_runs(id),
  impl TEXT NOT NULL, family TEXT, config TEXT, direction TEXT NOT NULL, dtype TEXT NOT NULL,
  batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
  head_dim INTEGER NOT NULL, causal INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
  ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL, gbps REAL,
  max_abs REAL, mean_abs REAL, mse REAL, max_rel REAL, peak_bytes INTEGER, device TEXT, detail TEXT);
-- Where merged or imported rows came from (schema 5): one row per input, its content hash unique,
-- so that merging or importing the same content again adds nothing. `origin` columns point here;
-- NULL origin: produced in this store by tune, run or experiment.
CREATE TABLE IF NOT EXISTS provenance(
  id INTEGER PRIMARY KEY, kind TEXT NOT NULL, source TEXT NOT NULL, content_hash TEXT NOT NULL UNIQUE,
  source_schema INTEGER, kernels INTEGER NOT NULL DEFAULT 0, results INTEGER NOT NULL DEFAULT 0,
  experiment_runs INTEGER NOT NULL DEFAULT 0, upstream TEXT, created TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS results_by_problem ON results(family, direction, device_name, head_dim, dtype, causal);
)sql";

std::string schema_sql() {
  const std::string rest = kSchemaRest;
  const auto kernels_end = rest.find("CREATE TABLE IF NOT EXISTS experiment_runs");
  return rest.substr(0, kernels_end) + results_ddl("results") + ";\n" + rest.substr(kernels_end);
}

// What the file holds, read without writing anything.
struct FileState {
  long long application_id = 0;
  std::set<std::string> tables;   // sqlite_* excluded
  std::string version;            // meta.schema_version, "" without one
  long long meta_rows = 0;
  std::set<std::string> results_columns, kernels_columns;
};

std::set<std::string> table_columns(sqlite3* db, const std::string& table) {
  std::set<std::string> out;
  Stmt s(db, "SELECT name FROM pragma_table_info('" + table + "')");
  while (s.step()) out.insert(s.text(0));
  return out;
}

FileState inspect(sqlite3* db) {
  FileState f;
  {
    Stmt s(db, "PRAGMA application_id");
    if (s.step()) f.application_id = s.i64(0);
  }
  {
    Stmt s(db, R"(SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\')");
    while (s.step()) f.tables.insert(s.text(0));
  }
  if (f.tables.count("meta")) {
    const auto meta_columns = table_columns(db, "meta");
    if (meta_columns.count("key") && meta_columns.count("value")) {
      Stmt n(db, "SELECT count(*) FROM meta");
      n.step();
      f.meta_rows = n.i64(0);
      Stmt v(db, "SELECT value FROM meta WHERE key='schema_version'");
      if (v.step()) f.version = v.text(0);
    }
  }
  if (f.tables.count("results")) f.results_columns = table_columns(db, "results");
  if (f.tables.count("kernels")) f.kernels_columns = table_columns(db, "kernels");
  return f;
}

// Stores written before application_id existed (schema 1-3) are ours when their table set is
// exactly what that version created and `meta` holds only the version row.
bool legacy_ours(const FileState& f) {
  static const std::set<std::string> v12 = {"meta", "kernels", "results"};
  static const std::set<std::string> v3 = {"meta", "kernels", "results", "experiment_runs", "experiment_rows"};
  const bool tables_match = ((f.version == "1" || f.version == "2") && f.tables == v12) || (f.version == "3" && f.tables == v3);
  return f.application_id == 0 && tables_match && f.meta_rows == 1 && f.results_columns.count("kernel_hash") &&
         f.results_columns.count("device_name") && f.kernels_columns.count("hash");
}

// A new column in the unique key: the table rebuilt beside the old one, the common columns copied.
void rebuild_results(sqlite3* db) {
  const std::set<std::string> old_cols = table_columns(db, "results");
  exec_sql(db, "DROP TABLE IF EXISTS results_new;" + results_ddl("results_new") + ";");
  const std::set<std::string> new_cols = table_columns(db, "results_new");
  std::string list;
  for (const auto& c : old_cols)
    if (new_cols.count(c)) list += (list.empty() ? "" : ",") + c;
  exec_sql(db, "INSERT INTO results_new(" + list + ") SELECT " + list + " FROM results ORDER BY id;");
  exec_sql(db, "DROP TABLE results; ALTER TABLE results_new RENAME TO results;");
}

// The schema's history, one step per version: kMigrations[i] takes a store of version i + 1 to i + 2, inside
// the writer's open transaction, given what the file held before the first step. A step may find its
// change made already (a rebuild makes the newest results table at once), so each checks first. After the
// last step, schema_sql() adds the tables and index a migrated file lacks (experiments: v3; provenance: v5).
struct Migration {
  int to;            // the version it makes
  const char* what;  // the change
  void (*apply)(sqlite3* db, const FileState& before);
};

constexpr Migration kMigrations[] = {
    {2, "results.detail",
     [](sqlite3* db, const FileState& f) {
       if (!f.results_columns.count("detail")) exec_sql(db, "ALTER TABLE results ADD COLUMN detail TEXT;");
     }},
    {3, "the experiment tables (made by the schema)", [](sqlite3*, const FileState&) {}},
    {4, "results.inputs in the unique key (the newest results table at once)",
     [](sqlite3* db, const FileState&) { rebuild_results(db); }},
    {5, "origin columns (the provenance table made by the schema)",
     [](sqlite3* db, const FileState& f) {
       for (const char* table : {"kernels", "results", "experiment_runs"})
         if (f.tables.count(table) && !table_columns(db, table).count("origin"))
           exec_sql(db, std::string("ALTER TABLE ") + table + " ADD COLUMN origin INTEGER;");
     }},
    {6, "results.heads_k (grouped-query attention) in the unique key",
     [](sqlite3* db, const FileState&) {
       if (!table_columns(db, "results").count("heads_k")) rebuild_results(db);
     }},
    {7, "results.varlen (packed variable-length batches) in the unique key",
     [](sqlite3* db, const FileState&) {
       if (!table_columns(db, "results").count("varlen")) rebuild_results(db);
     }},
    {8, "results.paged (paged K/V caches) in the unique key",
     [](sqlite3* db, const FileState&) {
       if (!table_columns(db, "results").count("paged")) rebuild_results(db);
     }},
    {9, "results.window_left, window_right, softcap (sliding windows, softcapping) in the unique key",
     [](sqlite3* db, const FileState&) {
       if (!table_columns(db, "results").count("softcap")) rebuild_results(db);  // defaults: no window, no cap
     }},
    {10, "results.alibi (ALiBi) in the unique key",
     [](sqlite3* db, const FileState&) {
       if (!table_columns(db, "results").count("alibi")) rebuild_results(db);  // default: no ALiBi
     }},
    {11, "results.mask_mod (a mask predicate) in the unique key",
     [](sqlite3* db, const FileState&) {
       if (!table_columns(db, "results").count("mask_mod")) rebuild_results(db);  // default: no mask_mod
     }},
};

constexpr bool migrations_in_order() {
  for (size_t i = 0; i < std::size(kMigrations); ++i)
    if (kMigrations[i].to != (int)i + 2) return false;
  return true;
}
static_assert(std::size(kMigrations) == kSchemaVersion - 1 && migrations_in_order(),
              "one migration per schema version, in order: a new version adds its step here");

}  // namespace

void check_db_path(const std::string& path) {
  if (path.empty()) throw UsageError("the database path is empty");
  if (path == ":memory:") throw UsageError("--db :memory: would discard every result; give a file");
  if (path.rfind("file:", 0) == 0) throw UsageError("--db '" + brief(path) + "': SQLite URIs are not accepted; give a file path");
}

namespace {

// "file:" + the path with '%', '?' and '#' escaped (and a "//" start kept from being an authority).
std::string sqlite_uri(const std::string& path) {
  std::string out = path.rfind("//", 0) == 0 ? "file:/" : "file:";
  for (unsigned char c : path) {
    if (c == '%' || c == '?' || c == '#') {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    } else {
      out += (char)c;
    }
  }
  return out;
}

// A read-only open of a store. A file in rollback mode with no -wal beside it opens as usual. A -wal
// file makes SQLite read it as part of the store, whatever the header says; so a -wal beside a store
// whose header is not in WAL mode, or one that is not a regular file of the store's owner, is refused
// (a planted file is never read as the store). A store in WAL mode whose -wal is missing or empty
// (a writer closed it uncleanly, or it was copied) holds everything in the main file: it is opened
// immutable, so a read-only folder works and no -wal/-shm is left behind. Only a non-empty -wal of
// the store's owner (a writer is running, or was killed) is read through SQLite's WAL index, the -shm file;
// where there is none and the folder cannot be written, SQLite could not make one: refused in one line.
namespace fs = std::filesystem;

bool read_only_open_immutable(const std::string& path, const struct stat& st) {
  unsigned char header[20] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  const bool whole = fd >= 0 && ::read(fd, header, sizeof header) == (ssize_t)sizeof header;
  if (fd >= 0) ::close(fd);
  const bool wal_mode = whole && header[18] == 2 && header[19] == 2;
  struct stat wst {};
  const std::string wal = path + "-wal";
  if (lstat(wal.c_str(), &wst) != 0) return wal_mode;
  if (!S_ISREG(wst.st_mode) || wst.st_uid != st.st_uid || (wst.st_size > 0 && !wal_mode))
    throw UsageError("'" + path + "' has a -wal file beside it that is not its own (" +
                     (!S_ISREG(wst.st_mode) ? "not a regular file" : wst.st_uid != st.st_uid ? "another owner" : "the store is not in WAL mode") +
                     "): not read; remove '" + wal + "'");
  if (wst.st_size == 0) return true;
  // Changes in the -wal (a writer was killed, or runs): SQLite reads them through a -shm index, which it
  // must create where there is none; in a folder this user cannot write, that fails ("unable to open").
  struct stat sst {};
  const std::string dir = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
  if (lstat((path + "-shm").c_str(), &sst) != 0 && access(dir.c_str(), W_OK | X_OK) != 0)
    throw UsageError("'" + path + "' has changes in its -wal file, which SQLite reads only through a -shm file it "
                     "cannot create in this read-only folder: copy the store and its -wal to a folder you can write");
  return false;
}

}  // namespace

Store::Store(const std::string& path, Mode mode) : path_(path), read_only_(mode == Mode::read_only) {
  check_db_path(path);
  struct stat st {};
  const bool exists = stat(path.c_str(), &st) == 0;
  if (!exists && read_only_) throw UsageError("database '" + path + "' does not exist");
  if (exists && S_ISDIR(st.st_mode)) throw UsageError("database '" + path + "' is a folder, not a file");
  if (exists && !S_ISREG(st.st_mode)) throw UsageError("database '" + path + "' is not a regular file");
  if (exists && read_only_ && st.st_size == 0) throw UsageError("'" + path + "' is empty, not a flashtune database");
  int flags = read_only_ ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  std::string name = path;
  if (read_only_ && read_only_open_immutable(path, st)) {  // nothing beside it to read: no locks, no files made
    name = sqlite_uri(path) + "?immutable=1";
    flags |= SQLITE_OPEN_URI;
  }
  if (int rc = sqlite().open_v2(name.c_str(), &db_, flags | SQLITE_OPEN_FULLMUTEX, nullptr); rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite().errmsg(db_) : sqlite().errstr(rc);
    sqlite().close(db_);
    db_ = nullptr;
    throw UsageError("cannot open database '" + path + "': " + msg);
  }
  sqlite().busy_timeout(db_, kBusyTimeoutMs);
  sqlite().limit(db_, SQLITE_LIMIT_LENGTH, kMaxStoredValueBytes);  // one value of a hostile store: refused unread
  try {
    open_checked(mode);
  } catch (const UsageError&) {
    sqlite().close(db_);
    db_ = nullptr;
    throw;
  } catch (const std::exception& e) {  // "file is not a database", an unreadable file: bad input
    sqlite().close(db_);
    db_ = nullptr;
    throw UsageError("cannot use database '" + path + "': " + brief(e.what(), 160));
  }
}

void Store::open_checked(Mode mode) {
  // Nothing is written before the file is known to be ours (or new). A database written by something
  // else, or by a newer flashtune, is refused untouched.
  auto refuse_foreign = [&](const FileState& f) {
    if (f.application_id != 0 && f.application_id != kApplicationId)
      throw UsageError("'" + path_ + "' is not a flashtune database (application_id " + std::to_string(f.application_id) + ")");
    if (!f.tables.count("meta"))
      throw UsageError("'" + path_ + "' is not a flashtune database (it has tables but no meta table)");
    throw UsageError("'" + path_ + "' is not a flashtune database (its tables and meta row are not flashtune's)");
  };
  auto version_of = [&](const FileState& f) {
    const std::string& v = f.version;
    // One or two digits, no sign, space or leading zero (the stored text is checked before it is read as a number).
    int n = -1;
    if ((v.size() == 1 || v.size() == 2) && v[0] >= '1' && v[0] <= '9' && (v.size() == 1 || (v[1] >= '0' && v[1] <= '9')))
      n = v.size() == 1 ? v[0] - '0' : (v[0] - '0') * 10 + (v[1] - '0');
    if (n < 1 || n > kSchemaVersion)
      throw UsageError("'" + path_ + "' has schema version '" + brief(v, 20) + "', this flashtune reads versions 1.." +
                       std::to_string(kSchemaVersion));
    return n;
  };

  if (mode == Mode::read_only) {
    FileState f;
    for (int attempt = 0;; ++attempt) {  // a writer creating the schema right now: wait for it
      try {
        f = inspect(db_);
        break;
      } catch (const BusyError&) {
        if (attempt > 2000) throw;
        backoff(attempt);
      }
    }
    if (f.tables.empty()) throw UsageError("'" + path_ + "' is not a flashtune database (no tables)");
    if (f.application_id != kApplicationId && !legacy_ours(f)) refuse_foreign(f);
    version_ = version_of(f);
    has_detail_ = f.results_columns.count("detail") > 0;
    has_inputs_ = f.results_columns.count("inputs") > 0;
    has_heads_k_ = f.results_columns.count("heads_k") > 0;
    has_varlen_ = f.results_columns.count("varlen") > 0;
    has_paged_ = f.results_columns.count("paged") > 0;
    has_mask_ = f.results_columns.count("softcap") > 0;
    has_alibi_ = f.results_columns.count("alibi") > 0;
    has_mask_mod_ = f.results_columns.count("mask_mod") > 0;
    has_experiments_ = f.tables.count("experiment_runs") && f.tables.count("experiment_rows");
    has_provenance_ = f.tables.count("provenance") > 0;
    return;
  }

  // Writers: inspect, create or migrate, all inside one BEGIN IMMEDIATE transaction, so that
  // concurrent first opens of a new file serialise and the second sees the first's schema.
  write_txn([&] {
    const FileState f = inspect(db_);
    if (f.tables.empty() && f.application_id == 0) {  // new (or zero bytes): ours from now on
      exec(schema_sql());
      exec("INSERT INTO meta VALUES('schema_version','" + std::to_string(kSchemaVersion) + "');");
      exec("PRAGMA application_id=" + std::to_string(kApplicationId) + ";");
      return;
    }
    if (f.application_id != kApplicationId && !legacy_ours(f)) refuse_foreign(f);
    const int from = version_of(f);
    for (const Migration& m : kMigrations)
      if (m.to > from) m.apply(db_, f);
    exec(schema_sql());  // tables and index that a migrated file lacks
    exec("UPDATE meta SET value='" + std::to_string(kSchemaVersion) + "' WHERE key='schema_version';");
    if (f.application_id != kApplicationId) exec("PRAGMA application_id=" + std::to_string(kApplicationId) + ";");
  });
  version_ = kSchemaVersion;
  // WAL only on a file known to be ours. Switching needs every other connection out of the way, and
  // SQLite answers BUSY here without waiting: retry.
  for (int attempt = 0;; ++attempt) {
    try {
      Stmt m(db_, "PRAGMA journal_mode=WAL");
      if (m.step() && m.text(0) == "wal") break;
      if (attempt > 2000) break;  // a file system without WAL support: stay in rollback mode
    } catch (const BusyError&) {
      if (attempt > 2000) throw;
    }
    backoff(attempt);
  }
  exec("PRAGMA synchronous=NORMAL;");
}

Store::~Store() { sqlite().close(db_); }

void Store::exec(const std::string& sql) { exec_sql(db_, sql); }

void Store::write_txn(const std::function<void()>& body) {
  if (read_only_) throw std::logic_error("write to a store opened read-only: '" + path_ + "'");
  if (txn_depth_ > 0) {  // inside transaction(): join it (a BUSY retries the outermost body)
    body();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int attempt = 0;; ++attempt) {
    bool begun = false;
    try {
      exec("BEGIN IMMEDIATE;");
      begun = true;
      ++txn_depth_;
      body();
      --txn_depth_;
      exec("COMMIT;");
      return;
    } catch (const BusyError&) {
      txn_depth_ = 0;
      if (begun) sqlite().exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kBusyRetrySeconds) throw;
      backoff(attempt);
    } catch (...) {
      txn_depth_ = 0;
      if (begun) sqlite().exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
      throw;
    }
  }
}

namespace {

// A kernels row as find_kernel and each_kernel read it.
constexpr auto kKernelColumns = column_list(
    "hash", "family", "direction", "config", "head_dim", "causal", "dtype", "arch", "nvrtc_version", "options",
    "source_hash", "name_expression", "status", "reason", "lowered_name", "registers", "smem_static", "stack_bytes",
    "spill_stores", "spill_loads", "compile_ms", "log", "cubin", "created");

// SELECT ... FROM kernels: the cubin read only when asked for (a read for the tables need not load binaries).
std::string select_kernels(bool with_cubin) {
  return "SELECT " + kKernelColumns.list([&](std::string_view c) {
           return c == "cubin" && !with_cubin ? std::string("NULL") : std::string(c);
         }) + " FROM kernels";
}

// The fields of a kernels row; head_dim and dtype checked first when `checked` (a row from another store).
KernelRecord read_kernel_row(const Stmt& s, bool checked, const std::string& path) {
  constexpr auto& K = kKernelColumns;
  KernelRecord k;
  k.hash = s.text(K["hash"]);
  k.family = s.text(K["family"]); k.direction = s.text(K["direction"]); k.config = s.text(K["config"]);
  if (checked) {
    try {
      const long long d = s.i64(K["head_dim"]);
      if (d < 1 || d > 1024) throw UsageError("head_dim " + std::to_string(d) + " is out of range");
      parse_dtype(s.text(K["dtype"]));
    } catch (const UsageError& e) {
      throw UsageError("'" + path + "': kernel " + brief(k.hash, 40) + ": " + e.what());
    }
  }
  k.head_dim = (int)s.i64(K["head_dim"]); k.causal = s.i64(K["causal"]) != 0; k.dtype = parse_dtype(s.text(K["dtype"]));
  k.arch = s.text(K["arch"]); k.nvrtc_version = s.text(K["nvrtc_version"]); k.options = s.text(K["options"]);
  k.source_hash = s.text(K["source_hash"]); k.name_expression = s.text(K["name_expression"]);
  k.status = s.text(K["status"]); k.reason = s.text(K["reason"]); k.lowered_name = s.text(K["lowered_name"]);
  k.res = {(int)s.i64(K["registers"]), (int)s.i64(K["smem_static"]), (int)s.i64(K["stack_bytes"]),
           (int)s.i64(K["spill_stores"]), (int)s.i64(K["spill_loads"])};
  k.compile_ms = s.f64(K["compile_ms"]); k.log = s.text(K["log"]); k.cubin = s.blob(K["cubin"]);
  k.created = s.text(K["created"]);
  return k;
}

}  // namespace

std::optional<KernelRecord> Store::find_kernel(const std::string& hash, bool with_cubin) {
  Stmt s(db_, select_kernels(with_cubin) + " WHERE hash=?");
  s.bind(1, hash);
  if (!s.step()) return std::nullopt;
  KernelRecord k = read_kernel_row(s, false, path_);
  // A cache entry whose binary was stripped (a committed DB) is not a usable compiled kernel.
  if (with_cubin && k.status == "compiled" && k.cubin.empty()) return std::nullopt;
  return k;
}

namespace {

// `origin` is written NULL for 0 (made in this store), whatever the table.
std::string origin_placeholder(std::string_view c) { return c == "origin" ? "NULLIF(?,0)" : "?"; }

// One kernels row: `verb` "INSERT OR REPLACE" (a compile) or "INSERT OR IGNORE" (a copy); origin 0: NULL.
void insert_kernel_row(sqlite3* db, const char* verb, const KernelRecord& k, const std::string& created,
                       long long origin) {
  static constexpr auto K = column_list(
      "hash", "family", "direction", "config", "head_dim", "causal", "dtype", "arch", "nvrtc_version", "options",
      "source_hash", "name_expression", "status", "reason", "lowered_name", "registers", "smem_static", "stack_bytes",
      "spill_stores", "spill_loads", "compile_ms", "log", "cubin", "created", "origin");
  Stmt s(db, std::string(verb) + " INTO kernels(" + K.list() + ") VALUES(" + K.placeholders(origin_placeholder) + ")");
  s.bind(K["hash"], k.hash).bind(K["family"], k.family).bind(K["direction"], k.direction).bind(K["config"], k.config)
      .bind(K["head_dim"], k.head_dim).bind(K["causal"], (int)k.causal)
      .bind(K["dtype"], std::string(to_string(k.dtype))).bind(K["arch"], k.arch).bind(K["nvrtc_version"], k.nvrtc_version).bind(K["options"], k.options)
      .bind(K["source_hash"], k.source_hash).bind(K["name_expression"], k.name_expression).bind(K["status"], k.status)
      .bind(K["reason"], k.reason).bind(K["lowered_name"], k.lowered_name).bind(K["registers"], k.res.registers)
      .bind(K["smem_static"], k.res.smem_static).bind(K["stack_bytes"], k.res.stack_bytes)
      .bind(K["spill_stores"], k.res.spill_stores).bind(K["spill_loads"], k.res.spill_loads)
      .bind(K["compile_ms"], k.compile_ms).bind(K["log"], k.log).bind_blob(K["cubin"], k.cubin)
      .bind(K["created"], created).bind(K["origin"], origin);
  s.step();
}

// One results row with the device's fields as given; origin 0: NULL.
void insert_result_row(sqlite3* db, const char* verb, const ResultRecord& r, const DeviceInfo& d,
                       const std::string& created, long long origin) {
  static constexpr auto R = column_list(
      "kernel_hash", "family", "direction", "config", "batch", "heads", "seq_q", "seq_k", "head_dim", "dtype", "causal",
      "status", "error", "max_abs", "max_rel", "mse", "ms_median", "ms_p20", "ms_p80", "reps", "tflops", "gbps", "seed",
      "device_name", "arch", "sm_count", "driver_version", "nvrtc_version", "options", "source_hash", "registers",
      "smem_static", "spill_stores", "created", "detail", "inputs", "origin", "heads_k", "varlen", "paged",
      "window_left", "window_right", "softcap", "alibi", "mask_mod");
  Stmt s(db, std::string(verb) + " INTO results(" + R.list() + ") VALUES(" + R.placeholders(origin_placeholder) + ")");
  const Problem& p = r.problem;
  s.bind(R["kernel_hash"], r.kernel_hash).bind(R["family"], r.family).bind(R["direction"], r.direction)
      .bind(R["config"], r.config).bind(R["batch"], p.batch).bind(R["heads"], p.heads).bind(R["seq_q"], p.seq_q)
      .bind(R["seq_k"], p.seq_k).bind(R["head_dim"], p.head_dim).bind(R["dtype"], std::string(to_string(p.dtype)))
      .bind(R["causal"], (int)p.causal).bind(R["status"], r.status).bind(R["error"], r.error)
      .bind(R["max_abs"], r.max_abs).bind(R["max_rel"], r.max_rel).bind(R["mse"], r.mse)
      .bind(R["ms_median"], r.ms_median).bind(R["ms_p20"], r.ms_p20).bind(R["ms_p80"], r.ms_p80)
      .bind(R["reps"], r.reps).bind(R["tflops"], r.tflops).bind(R["gbps"], r.gbps).bind(R["seed"], (long long)r.seed)
      .bind(R["device_name"], d.name).bind(R["arch"], d.arch).bind(R["sm_count"], d.sm_count)
      .bind(R["driver_version"], d.driver_version).bind(R["nvrtc_version"], r.nvrtc_version)
      .bind(R["options"], r.options).bind(R["source_hash"], r.source_hash).bind(R["registers"], r.res.registers)
      .bind(R["smem_static"], r.res.smem_static).bind(R["spill_stores"], r.res.spill_stores)
      .bind(R["created"], created).bind(R["detail"], r.detail).bind(R["inputs"], p.inputs.str())
      .bind(R["origin"], origin).bind(R["heads_k"], p.heads_k).bind(R["varlen"], p.varlen.key())
      .bind(R["paged"], p.paged.key()).bind(R["window_left"], p.window_left).bind(R["window_right"], p.window_right)
      .bind(R["softcap"], p.softcap).bind(R["alibi"], (int)p.alibi).bind(R["mask_mod"], p.mask_mod.key());
  s.step();
}

// The results table's unique key but for the kernel's resources: one measured point (has_result, copy_result).
constexpr auto kResultKey = column_list("kernel_hash", "device_name", "sm_count", "batch", "heads", "seq_q", "seq_k",
                                        "inputs", "heads_k", "varlen", "paged", "window_left", "window_right",
                                        "softcap", "alibi", "mask_mod");

void bind_result_key(Stmt& s, const std::string& kernel_hash, const std::string& device_name, int sm_count,
                     const Problem& p) {
  constexpr auto& K = kResultKey;
  s.bind(K["kernel_hash"], kernel_hash).bind(K["device_name"], device_name).bind(K["sm_count"], sm_count)
      .bind(K["batch"], p.batch).bind(K["heads"], p.heads).bind(K["seq_q"], p.seq_q).bind(K["seq_k"], p.seq_k)
      .bind(K["inputs"], p.inputs.str()).bind(K["heads_k"], p.heads_k).bind(K["varlen"], p.varlen.key())
      .bind(K["paged"], p.paged.key()).bind(K["window_left"], p.window_left).bind(K["window_right"], p.window_right)
      .bind(K["softcap"], p.softcap).bind(K["alibi"], (int)p.alibi).bind(K["mask_mod"], p.mask_mod.key());
}

}  // namespace

void Store::put_kernel(const KernelRecord& k) {
  write_txn([&] { insert_kernel_row(db_, "INSERT OR REPLACE", k, now_iso8601(), 0); });
}

bool Store::has_result(const std::string& kernel_hash, const DeviceInfo& d, const Problem& p) {
  // The same kernel on the same shape with other inputs is another result. A column an older schema (read
  // read-only) lacks compares its one value then.
  Stmt s(db_, "SELECT 1 FROM results WHERE " + kResultKey.equal_to_parameters([&](std::string_view c) {
           if (c == "inputs" && !has_inputs_) return std::string("'normal'");
           if (c == "heads_k" && !has_heads_k_) return std::string("0");
           if ((c == "varlen" && !has_varlen_) || (c == "paged" && !has_paged_)) return std::string("''");
           if ((c == "window_left" || c == "window_right") && !has_mask_) return std::string("-1");
           if (c == "softcap" && !has_mask_) return std::string("0");
           if (c == "alibi" && !has_alibi_) return std::string("0");
           if (c == "mask_mod" && !has_mask_mod_) return std::string("''");
           return std::string(c);
         }));
  bind_result_key(s, kernel_hash, d.name, d.sm_count, p);
  return s.step();
}

void Store::put_result(const ResultRecord& r, const DeviceInfo& d) {
  write_txn([&] { insert_result_row(db_, "INSERT OR REPLACE", r, d, now_iso8601(), 0); });
}

namespace {
// A results row as results() reads it (insert_result_row writes its own list: no id, and origin).
constexpr auto kResultReadColumns = column_list(
    "id", "kernel_hash", "family", "direction", "config", "batch", "heads", "seq_q", "seq_k", "head_dim", "dtype",
    "causal", "status", "error", "max_abs", "max_rel", "mse", "ms_median", "ms_p20", "ms_p80", "reps", "tflops", "gbps",
    "seed", "device_name", "arch", "sm_count", "driver_version", "nvrtc_version", "options", "source_hash", "registers",
    "smem_static", "spill_stores", "created", "detail", "inputs", "heads_k", "varlen", "paged", "window_left",
    "window_right", "softcap", "alibi", "mask_mod");

// The refusal of a read past its budget: rows or stored text.
UsageError over_budget(const std::string& path, const std::string& what, const ReadBudget& b, bool text) {
  return UsageError("'" + path + "': reading its " + what + " would pass " +
                    (text ? std::to_string(kMaxReadTextBytes >> 20) + " MiB of stored text"
                          : std::to_string(kMaxReadRows) + " rows") +
                    ", the most " + b.scope + " holds: " + b.advice);
}

// The rows a query would return, counted in SQL (at most cap + 1 visited): more than cap are refused before
// one is read. `from` is the query from FROM on; bind() binds its parameters.
template <class Bind, class Refuse>
long long count_within(sqlite3* db, const std::string& from, Bind bind, long long cap, Refuse refuse) {
  Stmt c(db, "SELECT count(*) FROM (SELECT 1" + from + " LIMIT " + std::to_string(cap + 1) + ")");
  bind(c);
  const long long n = c.step() ? c.i64(0) : 0;
  if (n > cap) throw refuse();
  return n;
}

// One row read: the row and its text cells (by column) drawn from the budget.
void draw_row(const Stmt& s, std::initializer_list<Column> text_columns, ReadBudget& b, const std::string& path,
              const std::string& what) {
  if (--b.rows < 0) throw over_budget(path, what, b, false);  // rows added since the count
  for (Column c : text_columns) b.text_bytes -= s.bytes(c);
  if (b.text_bytes < 0) throw over_budget(path, what, b, true);
}

}  // namespace

std::vector<ResultRecord> Store::results(const ResultFilter& f, ReadBudget* shared) {
  constexpr auto& R = kResultReadColumns;
  ReadBudget local;
  ReadBudget& budget = shared ? *shared : local;
  const std::string varlen = has_varlen_ ? "varlen" : "''", paged = has_paged_ ? "paged" : "''";
  // A lean read leaves out the long texts; a column an older schema (v1-v7, read read-only) lacks reads as
  // the value its rows had.
  std::string sql = "SELECT " + R.list([&](std::string_view c) -> std::string {
    if (c == "detail" && !has_detail_) return "NULL";
    if (f.lean && (c == "kernel_hash" || c == "error" || c == "nvrtc_version" || c == "options" || c == "detail"))
      return "''";
    if (c == "inputs" && !has_inputs_) return "'normal'";
    if (c == "heads_k" && !has_heads_k_) return "0";
    if (c == "varlen") return varlen;
    if (c == "paged") return paged;
    if ((c == "window_left" || c == "window_right") && !has_mask_) return "-1";
    if (c == "softcap" && !has_mask_) return "0";
    if (c == "alibi" && !has_alibi_) return "0";
    if (c == "mask_mod" && !has_mask_mod_) return "''";
    return std::string(c);
  });
  std::string where = " FROM results WHERE 1=1";
  std::vector<std::string> binds;
  auto add = [&](const std::string& col, const std::string& v) {
    if (v.empty()) return;
    where += " AND " + col + "=?";
    binds.push_back(v);
  };
  add("family", f.family);
  add("device_name", f.device);
  add("dtype", f.dtype);
  add("direction", f.direction);
  if (f.head_dim > 0) add("head_dim", std::to_string(f.head_dim));
  if (f.causal >= 0) add("causal", std::to_string(f.causal));
  if (f.ok_only) where += " AND status='ok'";
  // (A NULL, which no store of ours holds, reads as '' below: the same here.)
  if (f.dense_only) where += " AND coalesce(" + varlen + ",'')=''";
  if (f.paged >= 0) where += " AND coalesce(" + paged + ",'')" + (f.paged ? "!=''" : "=''");
  // Counted first (the index on family, direction, device, head dim, dtype and causal; at most max_rows + 1
  // rows visited): a store with more is refused before a row is read.
  auto too_many = [&] {
    return UsageError("'" + path_ + "' holds more than " + std::to_string(f.max_rows) + " results rows of " +
                      brief(f.family.empty() ? "any family" : f.family) + " on '" + brief(f.device, 60) +
                      "' for this query: at most " + std::to_string(f.max_rows) + " are read");
  };
  // The filter's own bound where it is the tighter, else the budget's.
  const bool own = f.max_rows > 0 && f.max_rows <= budget.rows;
  const long long cap = own ? f.max_rows : std::max(0ll, budget.rows);
  auto refuse = [&] { return own ? too_many() : over_budget(path_, "results rows", budget, false); };
  const long long count = count_within(
      db_, where, [&](Stmt& c) { for (size_t i = 0; i < binds.size(); ++i) c.bind((int)i + 1, binds[i]); }, cap, refuse);
  sql += where + " ORDER BY family, device_name, direction, dtype, head_dim, causal, seq_q, seq_k, batch, heads, " +
         std::string(has_heads_k_ ? "heads_k, " : "") + (has_varlen_ ? "varlen, " : "") + (has_paged_ ? "paged, " : "") +
         (has_mask_ ? "window_left, window_right, softcap, " : "") + (has_alibi_ ? "alibi, " : "") + (has_mask_mod_ ? "mask_mod, " : "") + "id";
  Stmt s(db_, sql);
  for (size_t i = 0; i < binds.size(); ++i) s.bind((int)i + 1, binds[i]);
  std::vector<ResultRecord> out;
  out.reserve((size_t)count);  // counted: no reallocation's second copy at the peak
  long long lengths = 0;  // of packed and paged rows, against kMaxResultLengths
  // The text columns: each cell at most kMaxStoredTextBytes, checked before any is copied or parsed.
  static constexpr Column kText[] = {
      R["kernel_hash"], R["family"], R["direction"], R["config"], R["dtype"], R["status"], R["error"],
      R["device_name"], R["arch"], R["nvrtc_version"], R["options"], R["source_hash"], R["created"],
      R["detail"], R["inputs"], R["varlen"], R["paged"], R["mask_mod"]};
  while (s.step()) {
    if ((long long)out.size() >= cap) throw refuse();  // rows added since the count
    long long row_bytes = 0;
    for (Column c : kText) {
      const long long n = s.bytes(c);
      if (n > kMaxStoredTextBytes)
        throw UsageError("'" + path_ + "': results row " + std::to_string(s.i64(R["id"])) + ": its " +
                         std::string(R.names[c.index]) + " is " +
                         std::to_string(n) + " bytes, over the " + std::to_string(kMaxStoredTextBytes >> 20) +
                         " MiB one stored text may hold");
      row_bytes += n;
    }
    --budget.rows;
    if ((budget.text_bytes -= row_bytes) < 0) throw over_budget(path_, "results rows", budget, true);
    ResultRecord r;
    r.id = s.i64(R["id"]); r.kernel_hash = s.text(R["kernel_hash"]); r.family = s.text(R["family"]);
    r.direction = s.text(R["direction"]); r.config = s.text(R["config"]);
    // Stored strings and numbers are checked as they are read: a row that fails is named.
    try {
      for (Column c : {R["batch"], R["heads"], R["seq_q"], R["seq_k"], R["head_dim"]})
        if (s.i64(c) < 1 || s.i64(c) > (1 << 20))
          throw UsageError("problem dimension " + std::to_string(s.i64(c)) + " is out of range");
      if (r.direction != "fwd" && r.direction != "bwd") throw UsageError("direction '" + brief(r.direction) + "'");
      r.problem = {(int)s.i64(R["batch"]), (int)s.i64(R["heads"]), (int)s.i64(R["seq_q"]), (int)s.i64(R["seq_k"]),
                   (int)s.i64(R["head_dim"]), parse_dtype(s.text(R["dtype"])), s.i64(R["causal"]) != 0, r.direction};
      r.problem.inputs = parse_input_dist(s.text(R["inputs"]));
      const long long hk = s.i64(R["heads_k"]);
      if (hk < 0 || hk > (1 << 16) || (hk > 0 && r.problem.heads % hk))
        throw UsageError("heads_k " + std::to_string(hk) + " does not divide heads " + std::to_string(r.problem.heads));
      r.problem.heads_k = hk == r.problem.heads ? 0 : (int)hk;
      if (const std::string vl = s.text(R["varlen"]); !vl.empty()) {
        // The lengths again from their description; the stored count and longest lengths must agree.
        nlohmann::json pj = to_json(r.problem);
        pj.erase("batch"), pj.erase("seq_q"), pj.erase("seq_k");
        pj["varlen"] = nlohmann::json::parse(vl, nullptr, false);
        if (pj["varlen"].is_discarded()) throw UsageError("varlen '" + brief(vl, 40) + "' is not JSON");
        const Problem vp = problem_from_json(pj);
        if (vp.batch != r.problem.batch || vp.seq_q != r.problem.seq_q || vp.seq_k != r.problem.seq_k)
          throw UsageError("varlen lengths disagree with batch, seq_q, seq_k");
        r.problem = vp;
      }
      if (const std::string pg = s.text(R["paged"]); !pg.empty()) {
        // The cache again from its description; with lengths, the stored count and longest must agree.
        nlohmann::json pj = to_json(r.problem);
        pj["paged"] = nlohmann::json::parse(pg, nullptr, false);
        if (pj["paged"].is_discarded()) throw UsageError("paged '" + brief(pg, 40) + "' is not JSON");
        r.problem = problem_from_json(pj);
      }
      // The window and softcap checked as a problem file's, and in their one spelling (canonicalize_mask).
      const long long wl = s.i64(R["window_left"]), wr = s.i64(R["window_right"]);
      r.problem.window_left = check_window_edge(wl, "window_left");
      r.problem.window_right = check_window_edge(wr, "window_right");
      r.problem.softcap = check_softcap(s.f64(R["softcap"]), "softcap");
      Problem canonical = r.problem;
      canonical.canonicalize_mask();
      if (!(canonical == r.problem)) throw UsageError("window (" + std::to_string(wl) + ", " + std::to_string(wr) + ") is not in its one spelling");
      const long long alibi = s.i64(R["alibi"]);
      if (alibi != 0 && alibi != 1) throw UsageError("alibi " + std::to_string(alibi) + " is not 0 or 1");
      r.problem.alibi = alibi == 1;
      if (const std::string mm = s.text(R["mask_mod"]); !mm.empty()) {
        // The predicate checked as a problem file's (stored text becomes source), its tensors digests alone.
        const nlohmann::json mj = nlohmann::json::parse(mm, nullptr, false);
        if (mj.is_discarded()) throw UsageError("mask_mod '" + brief(mm, 40) + "' is not JSON");
        r.problem.mask_mod = mask_mod_from_json(mj);
        if (r.problem.mask_mod.key() != mm) throw UsageError("mask_mod '" + brief(mm, 40) + "' is not in its one spelling");
        if (!r.problem.varlen.key().empty() || !r.problem.paged.key().empty() || r.problem.windowed())
          throw UsageError("mask_mod goes with dense problems without a window");
      }
    } catch (const UsageError& e) {
      throw UsageError("'" + path_ + "': results row " + std::to_string(r.id) + ": " + e.what());
    }
    lengths += (long long)(r.problem.varlen.seq_lens_q.size() + r.problem.varlen.seq_lens_k.size() +
                           r.problem.paged.seq_lens_k.size());
    if (lengths > kMaxResultLengths)
      throw UsageError("'" + path_ + "': the packed and paged rows read hold more than " +
                       std::to_string(kMaxResultLengths) + " sequence lengths in all (at results row " +
                       std::to_string(r.id) + "): select fewer rows (family, device, dtype, head dim)");
    r.status = s.text(R["status"]); r.error = s.text(R["error"]);
    r.max_abs = s.f64(R["max_abs"]); r.max_rel = s.f64(R["max_rel"]); r.mse = s.f64(R["mse"]);
    r.ms_median = s.f64(R["ms_median"]); r.ms_p20 = s.f64(R["ms_p20"]); r.ms_p80 = s.f64(R["ms_p80"]);
    r.reps = (int)s.i64(R["reps"]); r.tflops = s.f64(R["tflops"]); r.gbps = s.f64(R["gbps"]);
    r.seed = (unsigned long long)s.i64(R["seed"]);
    r.device_name = s.text(R["device_name"]); r.arch = s.text(R["arch"]); r.sm_count = (int)s.i64(R["sm_count"]);
    r.driver_version = (int)s.i64(R["driver_version"]);
    r.nvrtc_version = s.text(R["nvrtc_version"]); r.options = s.text(R["options"]);
    r.source_hash = s.text(R["source_hash"]);
    r.res.registers = (int)s.i64(R["registers"]); r.res.smem_static = (int)s.i64(R["smem_static"]);
    r.res.spill_stores = (int)s.i64(R["spill_stores"]);
    r.created = s.text(R["created"]);
    r.detail = s.text(R["detail"]);
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// One experiment_runs row; its id. origin 0: NULL (begin_experiment's rows leave it out, which is the same).
long long insert_experiment_run(sqlite3* db, const ExperimentRun& r, const std::string& created, long long origin) {
  static constexpr auto E = column_list("experiment", "title", "device_name", "probes", "spec", "created", "origin");
  Stmt s(db, "INSERT INTO experiment_runs(" + E.list() + ") VALUES(" + E.placeholders(origin_placeholder) + ")");
  s.bind(E["experiment"], r.experiment).bind(E["title"], r.title).bind(E["device_name"], r.device_name)
      .bind(E["probes"], r.probes).bind(E["spec"], r.spec).bind(E["created"], created).bind(E["origin"], origin);
  s.step();
  return sqlite().last_insert_rowid(db);
}

// An experiment_rows row as put_experiment_row writes it and experiment_rows reads it.
constexpr auto kExperimentRowColumns = column_list(
    "run_id", "impl", "family", "config", "direction", "dtype", "batch", "heads", "seq_q", "seq_k", "head_dim",
    "causal", "status", "error", "ms_median", "ms_p20", "ms_p80", "reps", "tflops", "gbps", "max_abs", "mean_abs",
    "mse", "max_rel", "peak_bytes", "device", "detail");

}  // namespace

long long Store::begin_experiment(const ExperimentRun& r) {
  long long id = 0;
  write_txn([&] {
    id = insert_experiment_run(db_, r, now_iso8601(), 0);
  });
  return id;
}

void Store::set_experiment_probes(long long run_id, const std::string& probes) {
  write_txn([&] {
  Stmt s(db_, "UPDATE experiment_runs SET probes=? WHERE id=?");
  s.bind(1, probes).bind(2, run_id);
  s.step();
  });
}

void Store::put_experiment_row(const ExperimentRow& r) {
  write_txn([&] {
    constexpr auto& E = kExperimentRowColumns;
    Stmt s(db_, "INSERT INTO experiment_rows(" + E.list() + ") VALUES(" + E.placeholders() + ")");
    const Problem& p = r.problem;
    s.bind(E["run_id"], r.run_id).bind(E["impl"], r.impl).bind(E["family"], r.family).bind(E["config"], r.config)
        .bind(E["direction"], p.direction).bind(E["dtype"], std::string(to_string(p.dtype))).bind(E["batch"], p.batch)
        .bind(E["heads"], p.heads).bind(E["seq_q"], p.seq_q).bind(E["seq_k"], p.seq_k).bind(E["head_dim"], p.head_dim)
        .bind(E["causal"], (int)p.causal).bind(E["status"], r.status).bind(E["error"], r.error)
        .bind(E["ms_median"], r.ms_median).bind(E["ms_p20"], r.ms_p20).bind(E["ms_p80"], r.ms_p80).bind(E["reps"], r.reps)
        .bind(E["tflops"], r.tflops).bind(E["gbps"], r.gbps).bind(E["max_abs"], r.max_abs).bind(E["mean_abs"], r.mean_abs)
        .bind(E["mse"], r.mse).bind(E["max_rel"], r.max_rel).bind(E["peak_bytes"], r.peak_bytes)
        .bind(E["device"], r.device).bind(E["detail"], r.detail);
    s.step();
  });
}

std::vector<ExperimentRun> Store::experiment_runs(const std::string& experiment, ReadBudget* shared) {
  if (!has_experiments_) return {};  // a v1/v2 store read read-only
  static constexpr auto E = column_list("id", "experiment", "title", "device_name", "probes", "spec", "created");
  ReadBudget local;
  ReadBudget& budget = shared ? *shared : local;
  const std::string from = " FROM experiment_runs WHERE ?='' OR experiment=?";
  auto bind = [&](Stmt& st) { st.bind(1, experiment).bind(2, experiment); };
  const long long n = count_within(db_, from, bind, std::max(0ll, budget.rows),
                                   [&] { return over_budget(path_, "experiment runs", budget, false); });
  Stmt s(db_, "SELECT " + E.list() + from + " ORDER BY id");
  bind(s);
  std::vector<ExperimentRun> out;
  out.reserve((size_t)n);
  while (s.step()) {
    draw_row(s, {E["experiment"], E["title"], E["device_name"], E["probes"], E["spec"], E["created"]}, budget, path_,
             "experiment runs");
    ExperimentRun r;
    r.id = s.i64(E["id"]); r.experiment = s.text(E["experiment"]); r.title = s.text(E["title"]);
    r.device_name = s.text(E["device_name"]); r.probes = s.text(E["probes"]); r.spec = s.text(E["spec"]);
    r.created = s.text(E["created"]);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<ExperimentRow> Store::experiment_rows(long long run_id, ReadBudget* shared) {
  if (!has_experiments_) return {};
  constexpr auto& E = kExperimentRowColumns;
  ReadBudget local;
  ReadBudget& budget = shared ? *shared : local;
  const std::string from = " FROM experiment_rows WHERE run_id=?";
  auto bind = [&](Stmt& st) { st.bind(1, run_id); };
  const long long n = count_within(db_, from, bind, std::max(0ll, budget.rows),
                                   [&] { return over_budget(path_, "experiment rows", budget, false); });
  Stmt s(db_, "SELECT " + E.list() + from + " ORDER BY id");
  bind(s);
  std::vector<ExperimentRow> out;
  out.reserve((size_t)n);
  while (s.step()) {
    draw_row(s, {E["impl"], E["family"], E["config"], E["direction"], E["dtype"], E["status"], E["error"], E["device"],
                 E["detail"]}, budget, path_, "experiment rows");
    ExperimentRow r;
    r.run_id = run_id;
    r.impl = s.text(E["impl"]); r.family = s.text(E["family"]); r.config = s.text(E["config"]);
    r.problem = {(int)s.i64(E["batch"]), (int)s.i64(E["heads"]), (int)s.i64(E["seq_q"]), (int)s.i64(E["seq_k"]),
                 (int)s.i64(E["head_dim"]), parse_dtype(s.text(E["dtype"])), s.i64(E["causal"]) != 0,
                 s.text(E["direction"])};
    r.status = s.text(E["status"]); r.error = s.text(E["error"]);
    r.ms_median = s.f64(E["ms_median"]); r.ms_p20 = s.f64(E["ms_p20"]); r.ms_p80 = s.f64(E["ms_p80"]);
    r.reps = (int)s.i64(E["reps"]); r.tflops = s.f64(E["tflops"]); r.gbps = s.f64(E["gbps"]);
    r.max_abs = s.f64(E["max_abs"]); r.mean_abs = s.f64(E["mean_abs"]); r.mse = s.f64(E["mse"]);
    r.max_rel = s.f64(E["max_rel"]); r.peak_bytes = s.i64(E["peak_bytes"]); r.device = s.text(E["device"]);
    r.detail = s.text(E["detail"]);
    out.push_back(std::move(r));
  }
  return out;
}

void Store::drop_cubins() {
  write_txn([&] { exec("UPDATE kernels SET cubin=NULL;"); });
  // VACUUM runs outside a transaction. Then the file leaves WAL mode: a committed store is one
  // self-contained file that read-only readers open without creating -wal/-shm files beside it
  // (the next write verb switches it back to WAL).
  for (int attempt = 0;; ++attempt) {
    try {
      exec("VACUUM;");
      Stmt m(db_, "PRAGMA journal_mode=DELETE");
      if (m.step() && m.text(0) == "delete") return;
      if (attempt > 2000) return;  // another connection holds it open: it stays in WAL mode
    } catch (const BusyError&) {
      if (attempt > 2000) throw;
    }
    backoff(attempt);
  }
}

// --- merge and import -------------------------------------------------------------------

void Store::transaction(const std::function<void()>& body) { write_txn(body); }

void Store::snapshot(const std::function<void()>& body) {
  exec("BEGIN;");  // deferred: the first read takes the snapshot that the rest sees
  try {
    body();
  } catch (...) {
    sqlite().exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
    throw;
  }
  exec("COMMIT;");
}

void Store::each_kernel(const std::function<void(const KernelRecord&)>& fn, bool with_cubin) {
  Stmt s(db_, select_kernels(with_cubin) + " ORDER BY hash");
  while (s.step()) fn(read_kernel_row(s, true, path_));
}

std::set<DeviceSignature> Store::device_signatures() {
  static constexpr auto C = column_list("device_name", "arch", "sm_count", "driver_version");
  Stmt s(db_, "SELECT DISTINCT " + C.list() + " FROM results LIMIT " + std::to_string(kMaxStoreDevices + 1));
  std::set<DeviceSignature> out;
  while (s.step()) {
    if (s.bytes(C["device_name"]) > 256 || s.bytes(C["arch"]) > 256)
      throw UsageError("'" + path_ + "': a results row's device name or arch is over 256 bytes");
    out.insert({s.text(C["device_name"]), s.text(C["arch"]), (int)s.i64(C["sm_count"]),
                (int)s.i64(C["driver_version"])});
  }
  if ((long long)out.size() > kMaxStoreDevices)
    throw UsageError("'" + path_ + "': its results name more than " + std::to_string(kMaxStoreDevices) + " devices");
  return out;
}

namespace {
constexpr auto kProvenanceColumns = column_list("id", "kind", "source", "content_hash", "source_schema", "kernels",
                                                "results", "experiment_runs", "upstream", "created");
Provenance read_provenance(const Stmt& s) {
  constexpr auto& P = kProvenanceColumns;
  Provenance p;
  p.id = s.i64(P["id"]); p.kind = s.text(P["kind"]); p.source = s.text(P["source"]);
  p.content_hash = s.text(P["content_hash"]); p.source_schema = (int)s.i64(P["source_schema"]);
  p.kernels = s.i64(P["kernels"]); p.results = s.i64(P["results"]); p.experiment_runs = s.i64(P["experiment_runs"]);
  p.upstream = s.text(P["upstream"]); p.created = s.text(P["created"]);
  return p;
}
}  // namespace

std::vector<Provenance> Store::provenance(ReadBudget* shared) {
  if (!has_provenance_) return {};  // before schema 5, read read-only
  ReadBudget local;
  ReadBudget& budget = shared ? *shared : local;
  const long long n = count_within(db_, " FROM provenance", [](Stmt&) {}, std::max(0ll, budget.rows),
                                   [&] { return over_budget(path_, "provenance rows", budget, false); });
  Stmt s(db_, "SELECT " + kProvenanceColumns.list() + " FROM provenance ORDER BY id");
  std::vector<Provenance> out;
  out.reserve((size_t)n);
  while (s.step()) {
    constexpr auto& P = kProvenanceColumns;
    draw_row(s, {P["kind"], P["source"], P["content_hash"], P["upstream"], P["created"]}, budget, path_, "provenance rows");
    out.push_back(read_provenance(s));
  }
  return out;
}

std::optional<Provenance> Store::find_provenance(const std::string& content_hash) {
  if (!has_provenance_) return std::nullopt;
  Stmt s(db_, "SELECT " + kProvenanceColumns.list() + " FROM provenance WHERE content_hash=?");
  s.bind(1, content_hash);
  if (!s.step()) return std::nullopt;
  return read_provenance(s);
}

long long Store::add_provenance(const Provenance& p) {
  long long id = 0;
  write_txn([&] {
    static constexpr auto P = column_list("kind", "source", "content_hash", "source_schema", "kernels", "results",
                                      "experiment_runs", "upstream", "created");
    Stmt s(db_, "INSERT INTO provenance(" + P.list() + ") VALUES(" + P.placeholders([](std::string_view c) {
             return c == "source_schema" ? "NULLIF(?,0)" : "?";  // 0: not known
           }) + ")");
    s.bind(P["kind"], p.kind).bind(P["source"], p.source).bind(P["content_hash"], p.content_hash)
        .bind(P["source_schema"], p.source_schema).bind(P["kernels"], p.kernels).bind(P["results"], p.results)
        .bind(P["experiment_runs"], p.experiment_runs).bind(P["upstream"], p.upstream)
        .bind(P["created"], p.created.empty() ? now_iso8601() : p.created);
    s.step();
    id = sqlite().last_insert_rowid(db_);
  });
  return id;
}

void Store::set_provenance_counts(long long id, long long kernels, long long results, long long experiment_runs) {
  write_txn([&] {
    Stmt s(db_, "UPDATE provenance SET kernels=?, results=?, experiment_runs=? WHERE id=?");
    s.bind(1, kernels).bind(2, results).bind(3, experiment_runs).bind(4, id);
    s.step();
  });
}

Copied Store::copy_kernel(const KernelRecord& k, long long origin) {
  Copied out = Copied::added;
  write_txn([&] {
    insert_kernel_row(db_, "INSERT OR IGNORE", k, k.created.empty() ? now_iso8601() : k.created, origin);
    if (sqlite().changes(db_) > 0) return;
    // The same hash is the same source, options, NVRTC and arch: what it compiled to should agree.
    static constexpr auto C = column_list("status", "reason", "registers");
    Stmt s(db_, "SELECT " + C.list([](std::string_view c) {
             return c == "reason" ? std::string("ifnull(reason,'')") : std::string(c);
           }) + " FROM kernels WHERE hash=?");
    s.bind(1, k.hash);
    s.step();
    out = s.text(C["status"]) == k.status && s.text(C["reason"]) == k.reason && s.i64(C["registers"]) == k.res.registers
              ? Copied::present
              : Copied::differs;
  });
  return out;
}

Copied Store::copy_result(const ResultRecord& r, long long origin) {
  Copied out = Copied::added;
  write_txn([&] {
    DeviceInfo d;
    d.name = r.device_name; d.arch = r.arch; d.sm_count = r.sm_count; d.driver_version = r.driver_version;
    insert_result_row(db_, "INSERT OR IGNORE", r, d, r.created.empty() ? now_iso8601() : r.created, origin);
    if (sqlite().changes(db_) > 0) return;
    static constexpr auto C = column_list("status", "ms_median", "config");
    Stmt s(db_, "SELECT " + C.list() + " FROM results WHERE " + kResultKey.equal_to_parameters());
    bind_result_key(s, r.kernel_hash, r.device_name, r.sm_count, r.problem);
    s.step();
    out = s.text(C["status"]) == r.status && s.f64(C["ms_median"]) == r.ms_median && s.text(C["config"]) == r.config
              ? Copied::present
              : Copied::differs;
  });
  return out;
}

std::vector<long long> Store::find_experiment_runs(const ExperimentRun& r) {
  if (!has_experiments_) return {};
  Stmt s(db_, "SELECT id FROM experiment_runs WHERE experiment=? AND device_name=? AND created=? AND "
              "ifnull(spec,'')=? AND ifnull(probes,'')=? ORDER BY id");
  s.bind(1, r.experiment).bind(2, r.device_name).bind(3, r.created).bind(4, r.spec).bind(5, r.probes);
  std::vector<long long> ids;
  while (s.step()) ids.push_back(s.i64(0));
  return ids;
}

long long Store::copy_experiment_run(const ExperimentRun& r, long long origin) {
  long long id = 0;
  write_txn([&] {
    id = insert_experiment_run(db_, r, r.created, origin);
  });
  return id;
}

}  // namespace flashtune
