#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <functional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "fixture.hpp"
#include "results/store.hpp"

using namespace flashtune;
namespace fs = std::filesystem;

namespace {
std::string temp_db(const char* name) {  // in the process's scratch folder, removed at exit
  auto p = fixture::scratch_dir() / (std::string(name) + ".db");
  fs::remove(p);
  return p.string();
}
}  // namespace

// Packed rows of a few stored bytes that derive 65,535 sequences each: a read holds at most kMaxResultLengths
// lengths in all, refused in one line past it (20,000 such rows would take 10 GB); a filter that leaves them
// out reads the rest.
TEST(Store, ResultsBoundThePackedLengthsTheyHold) {
  const std::string path = temp_db("packed_lengths");
  const Problem p = problem_from_json(
      {{"heads", 1}, {"head_dim", 64}, {"dtype", "bf16"}, {"varlen", {{"lengths", "fixed"}, {"length", 1}, {"total_tokens", 65535}}}});
  ASSERT_EQ(p.varlen.seq_lens_q.size() + p.varlen.seq_lens_k.size(), 131070u);
  const long long over = kMaxResultLengths / 131070 + 1;
  {
    Store s(path);
    s.transaction([&] {
      for (long long i = 0; i < over; ++i) {
        ResultRecord r = fixture::fixture_result("BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2", p, "ok", 1.0);
        r.family = "fa2_mma", r.kernel_hash += std::to_string(i);
        s.put_result(r, fixture::fixture_device());
      }
      s.put_result(fixture::fixture_result("BLOCK_M=64,BLOCK_N=32,TM=4,TN=4,KV_STAGES=2", Problem{1, 2, 64, 64, 64}, "ok", 1.0),
                   fixture::fixture_device());
    });
  }
  Store ro(path, Store::Mode::read_only);
  try {
    ro.results({});
    FAIL() << "read " << over << " rows of 131070 lengths";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("sequence lengths in all"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  ResultFilter dense;
  dense.family = "fa2_simt";
  EXPECT_EQ(ro.results(dense).size(), 1u);
  dense.family = "fa2_mma";
  dense.ok_only = true;
  EXPECT_THROW(ro.results(dense), UsageError);
  // The runtime's narrower read: packed rows left out in SQL (none of their lengths read), the text columns
  // selection does not read left empty, and a row bound checked by counting before any row is read.
  ResultFilter lookup;
  lookup.dense_only = true;
  lookup.paged = 0;
  lookup.lean = true;
  const std::vector<ResultRecord> rows = ro.results(lookup);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].family, "fa2_simt");
  EXPECT_EQ(rows[0].config, "BLOCK_M=64,BLOCK_N=32,TM=4,TN=4,KV_STAGES=2");
  EXPECT_EQ(rows[0].source_hash, "src");
  EXPECT_TRUE(rows[0].kernel_hash.empty() && rows[0].options.empty() && rows[0].nvrtc_version.empty());
  lookup.paged = 1;
  EXPECT_TRUE(ro.results(lookup).empty());
  lookup = ResultFilter{};
  lookup.family = "fa2_mma";
  lookup.max_rows = over - 1;
  try {
    ro.results(lookup);
    FAIL() << "read " << over << " rows past a bound of " << over - 1;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds more than " + std::to_string(over - 1) + " results rows of fa2_mma"),
              std::string::npos) << e.what();
  }
  lookup.max_rows = 1;
  lookup.family = "fa2_simt";
  EXPECT_EQ(ro.results(lookup).size(), 1u);  // exactly the bound: read
  fs::remove(path);
}

// Every read of a store is bounded (ReadBudget): rows counted before one is read, stored text as it is read, one
// results text cell at most kMaxStoredTextBytes; a caller's own budget is drawn down by each read given it (merge:
// all the reads of one input together).
TEST(Store, ReadsStayWithinTheirBudget) {
  const std::string path = temp_db("budget");
  {
    Store s(path);
    fixture::fill_fixture(s);  // 8 results rows
    fixture::fill_experiments(s);
  }
  Store ro(path, Store::Mode::read_only);
  auto refused = [](const std::function<void()>& read, const std::string& needle) {
    try {
      read();
      ADD_FAILURE() << "read past its budget; wanted '" << needle << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  };
  ReadBudget b;
  b.rows = 8;
  EXPECT_EQ(ro.results({}, &b).size(), 8u);  // exactly the budget: read, and drawn down
  EXPECT_EQ(b.rows, 0);
  EXPECT_GT(b.text_bytes, 0);
  EXPECT_LT(b.text_bytes, kMaxReadTextBytes);
  refused([&] { ro.results({}, &b); }, "results rows would pass 250000 rows, the most one read holds");
  b = ReadBudget{};
  b.rows = 7;
  refused([&] { ro.results({}, &b); }, "would pass");
  b = ReadBudget{};
  b.text_bytes = 100;  // fewer than 8 rows' text
  refused([&] { ro.results({}, &b); }, "results rows would pass 256 MiB of stored text");
  // A filter's own tighter bound keeps its message (the runtime's lookup).
  ResultFilter f;
  f.max_rows = 3;
  refused([&] { ro.results(f); }, "holds more than 3 results rows of any family");
  // Experiment runs and rows, provenance: the same budget.
  b = ReadBudget{};
  const auto runs = ro.experiment_runs("", &b);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(b.rows, kMaxReadRows - 5);
  b.rows = 5;
  refused([&] { ro.experiment_rows(runs[1].id, &b); }, "experiment rows would pass");
  b.rows = 6;
  EXPECT_EQ(ro.experiment_rows(runs[1].id, &b).size(), 6u);
  b.scope = "a test's read";
  b.advice = "read less";
  refused([&] { ro.experiment_runs("", &b); }, "experiment runs would pass 250000 rows, the most a test's read holds: read less");
  b = ReadBudget{};
  EXPECT_TRUE(ro.provenance(&b).empty());
  EXPECT_EQ(b.rows, kMaxReadRows);
}

TEST(Store, HugeStoredTextIsRefusedBeforeItIsRead) {
  const std::string path = temp_db("huge_text");
  {
    Store s(path);
    fixture::fill_fixture(s);
    ResultRecord r = fixture::fixture_result("BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=1", Problem{1, 1, 8, 8, 64}, "ok", 1.0);
    r.error = std::string(kMaxStoredTextBytes + 1, 'x');  // stored (under SQLite's 64 MiB), never read back
    s.put_result(r, fixture::fixture_device());
  }
  {
    Store ro(path, Store::Mode::read_only);
    try {
      ro.results({});
      FAIL() << "read a text cell over 4 MiB";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("its error is " + std::to_string(kMaxStoredTextBytes + 1) + " bytes, over the 4 MiB"),
                std::string::npos) << e.what();
    }
    ResultFilter lean;
    lean.lean = true;  // error is not read at all
    EXPECT_EQ(ro.results(lean).size(), 9u);
  }
  {  // A value past SQLite's length limit (written without it): refused before SQLite allocates it.
    sqlite3* db;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE results SET detail=hex(zeroblob(34000000)) WHERE id=1", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  Store ro(path, Store::Mode::read_only);
  ResultFilter lean;
  lean.lean = true;
  EXPECT_EQ(ro.results(lean).size(), 9u);  // detail not read
  try {
    ro.results({});
    FAIL() << "read a value over 64 MiB";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a value over 64 MiB"), std::string::npos) << e.what();
  }
}

// fuzz_store's finding: a damaged 15 KB store whose record SQLite refuses as out of memory is a damaged store
// (UsageError, one line: exit 2), not an error of ours (exit 1).
TEST(Store, DamagedRecordSqliteCallsOutOfMemoryIsBadInput) {
  const std::string path = temp_db("nomem");
  fs::copy_file(std::string(FLASHTUNE_SOURCE_DIR) + "/tests/fuzz/corpus/store/found_nomem_record.db", path);
  try {
    Store ro(path, Store::Mode::read_only);
    ro.results({});
    FAIL() << "read a damaged store";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the database is damaged"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(Store, KernelRoundTripWithCubin) {
  std::string path = temp_db("kernel");
  {
    Store s(path);
    KernelRecord k;
    k.hash = "abc";
    k.family = "fa2_simt";
    k.direction = "fwd";
    k.config = "BLOCK_M=64";
    k.head_dim = 64;
    k.dtype = DType::fp32;
    k.arch = "sm_90";
    k.status = "compiled";
    k.res = {96, 0, 0, 0, 0};
    k.cubin = std::string("\x7f" "ELF\0\1\2", 7);
    s.put_kernel(k);
  }
  Store s(path);  // reopen: persisted
  auto k = s.find_kernel("abc");
  ASSERT_TRUE(k);
  EXPECT_EQ(k->res.registers, 96);
  EXPECT_EQ(k->cubin.size(), 7u);
  EXPECT_FALSE(s.find_kernel("missing"));
  s.drop_cubins();
  EXPECT_FALSE(s.find_kernel("abc")) << "a compiled entry without its binary is no cache hit";
  EXPECT_TRUE(s.find_kernel("abc", false));
  fs::remove(path);
}

TEST(Store, ResultsKeepMetadataAndRerunsSkip) {
  std::string path = temp_db("results");
  Store s(path);
  fixture::fill_fixture(s);
  const DeviceInfo dev = fixture::fixture_device();
  Problem p1{4, 16, 4096, 4096, 64, DType::fp32, false};
  EXPECT_TRUE(s.has_result("hash-BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2-64n", dev, p1));
  Problem other = p1;
  other.batch = 5;
  EXPECT_FALSE(s.has_result("hash-BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2-64n", dev, other));

  auto all = s.results({});
  EXPECT_EQ(all.size(), 8u);
  ResultFilter f;
  f.device = dev.name;
  f.ok_only = true;
  auto ok = s.results(f);
  EXPECT_EQ(ok.size(), 5u);
  for (const auto& r : ok) {
    EXPECT_EQ(r.status, "ok");
    EXPECT_EQ(r.sm_count, 132);
    EXPECT_EQ(r.driver_version, 13000);
    EXPECT_EQ(r.nvrtc_version, "13.0");
    EXPECT_GT(r.tflops, 0);
    EXPECT_FALSE(r.created.empty());
  }
  f.causal = 1;
  EXPECT_EQ(s.results(f).size(), 0u);
  fs::remove(path);
}

TEST(Store, RefusesForeignOrNewerDatabases) {
  std::string path = temp_db("foreign");
  {
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    sqlite3_exec(db, "CREATE TABLE precious(x); INSERT INTO precious VALUES(42);", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  EXPECT_THROW(Store s(path), UsageError);
  {
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    sqlite3_stmt* st;
    sqlite3_prepare_v2(db, "SELECT x FROM precious", -1, &st, nullptr);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    EXPECT_EQ(sqlite3_column_int(st, 0), 42) << "refusing must not alter the file";
    sqlite3_finalize(st);
    sqlite3_close(db);
  }
  fs::remove(path);
  {
    Store s(path);
  }
  {
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    sqlite3_exec(db, "UPDATE meta SET value='99' WHERE key='schema_version'", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  EXPECT_THROW(Store s(path), UsageError);
  fs::remove(path);
}

TEST(Store, MigratesVersion1KeepingResults) {
  std::string path = temp_db("v1");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // turn it back into a version-1 file: no detail column
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE results DROP COLUMN detail; UPDATE meta SET value='1'", nullptr, nullptr,
                           nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  Store s(path);
  EXPECT_EQ(s.results({}).size(), 8u);
  auto r = fixture::fixture_result("BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=1", Problem{1, 1, 8, 8, 64}, "ok", 1.0);
  r.detail = R"({"dq_rel_l2":1e-7})";
  s.put_result(r, fixture::fixture_device());
  bool found = false;
  for (const auto& x : s.results({}))
    if (x.detail == r.detail) found = true;
  EXPECT_TRUE(found);
  fs::remove(path);
}

TEST(Store, ExperimentRowsRoundTripAndLatestRun) {
  std::string path = temp_db("exp");
  {
    Store s(path);
    fixture::fill_experiments(s);
  }
  Store s(path);
  auto runs = s.experiment_runs("classic_shapes");
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_LT(runs[0].id, runs[1].id);
  EXPECT_NE(runs[1].probes.find("matmul_fp32_tflops"), std::string::npos);
  auto rows = s.experiment_rows(runs[1].id);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].impl, "fa2_simt");
  EXPECT_EQ(rows[0].problem, (Problem{2, 8, 1024, 1024, 64, DType::fp32, false, "fwd"}));
  EXPECT_DOUBLE_EQ(rows[0].ms_median, 0.1);
  EXPECT_EQ(rows[0].peak_bytes, 20 << 20);
  EXPECT_EQ(rows[5].status, "invalid");
  EXPECT_EQ(s.experiment_rows(runs[0].id).size(), 1u);
  EXPECT_EQ(s.experiment_runs().size(), 5u);
  fs::remove(path);
}

TEST(Store, MigratesVersion2AddingExperimentTables) {
  std::string path = temp_db("v2");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-2 file: no experiment tables
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db, "DROP TABLE experiment_rows; DROP TABLE experiment_runs; UPDATE meta SET value='2'",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  Store s(path);
  EXPECT_EQ(s.results({}).size(), 8u);
  fixture::fill_experiments(s);
  EXPECT_EQ(s.experiment_runs().size(), 5u);
  fs::remove(path);
}

TEST(Store, MigratesVersion4ToProvenanceReadingIt) {
  std::string path = temp_db("v4");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-4 file: no provenance table, no origin columns
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db, "DROP TABLE provenance; ALTER TABLE results DROP COLUMN origin; "
                               "ALTER TABLE kernels DROP COLUMN origin; ALTER TABLE experiment_runs DROP COLUMN origin; "
                               "UPDATE meta SET value='4'",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  {
    Store ro(path, Store::Mode::read_only);  // read as it is
    EXPECT_EQ(ro.schema_version(), 4);
    EXPECT_TRUE(ro.provenance().empty());
    EXPECT_FALSE(ro.find_provenance("x"));
    EXPECT_EQ(ro.results({}).size(), 8u);
    EXPECT_EQ(ro.device_signatures().size(), 2u);
  }
  Store s(path);  // a write verb migrates
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  Provenance p;
  p.kind = "merge";
  p.source = "/x/a.db";
  p.content_hash = "h1";
  const long long id = s.add_provenance(p);
  s.set_provenance_counts(id, 1, 2, 3);
  auto found = s.find_provenance("h1");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->id, id);
  EXPECT_EQ(found->results, 2);
  EXPECT_EQ(s.provenance().size(), 1u);
  fs::remove(path);
}

// Schema 6: heads_k (grouped-query attention) joined the results' unique key; a v5 file's rows come
// through as multi-head rows, and a GQA row beside a multi-head one of the same kernel and shape is
// another row.
TEST(Store, MigratesVersion5ToGroupedQueryKeys) {
  std::string path = temp_db("v5");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-5 results table: no heads_k column
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    const char* sql = R"sql(
      CREATE TABLE r5(id INTEGER PRIMARY KEY,
        kernel_hash TEXT NOT NULL, family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
        batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, causal INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
        max_abs REAL, max_rel REAL, mse REAL, ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL,
        gbps REAL, seed INTEGER, device_name TEXT NOT NULL, arch TEXT NOT NULL, sm_count INTEGER NOT NULL,
        driver_version INTEGER NOT NULL, nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
        registers INTEGER, smem_static INTEGER, spill_stores INTEGER, created TEXT NOT NULL, detail TEXT,
        inputs TEXT NOT NULL DEFAULT 'normal', origin INTEGER,
        UNIQUE(kernel_hash, device_name, sm_count, batch, heads, seq_q, seq_k, inputs));
      INSERT INTO r5 SELECT id,kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,
        status,error,max_abs,max_rel,mse,ms_median,ms_p20,ms_p80,reps,tflops,gbps,seed,device_name,arch,sm_count,
        driver_version,nvrtc_version,options,source_hash,registers,smem_static,spill_stores,created,detail,inputs,origin
        FROM results;
      DROP TABLE results; ALTER TABLE r5 RENAME TO results; UPDATE meta SET value='5';)sql";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::vector<ResultRecord> before;
  {
    Store ro(path, Store::Mode::read_only);
    EXPECT_EQ(ro.schema_version(), 5);
    before = ro.results({});
    ASSERT_EQ(before.size(), 8u);
    for (const auto& r : before) EXPECT_EQ(r.problem.heads_k, 0);
  }
  Store s(path);
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  const std::vector<ResultRecord> after = s.results({});
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_EQ(after[i].problem, before[i].problem);
    EXPECT_EQ(after[i].ms_median, before[i].ms_median);
  }
  // The same kernel and shape with 8 kv heads for the fixture's query heads: a row of its own.
  ResultRecord gqa = after[0];
  gqa.problem.heads = 8;
  ResultRecord mha = gqa;
  gqa.problem.heads_k = 2;
  gqa.ms_median = 0.5;
  DeviceInfo d;
  d.name = gqa.device_name; d.arch = gqa.arch; d.sm_count = gqa.sm_count; d.driver_version = gqa.driver_version;
  s.put_result(mha, d);
  s.put_result(gqa, d);
  EXPECT_TRUE(s.has_result(gqa.kernel_hash, d, gqa.problem));
  int found_gqa = 0, found_mha = 0;
  for (const auto& r : s.results({}))
    if (r.kernel_hash == gqa.kernel_hash && r.problem.heads == 8) {
      found_gqa += r.problem.heads_k == 2 && r.ms_median == 0.5;
      found_mha += r.problem.heads_k == 0;
    }
  EXPECT_EQ(found_gqa, 1);
  EXPECT_EQ(found_mha, 1);
  fs::remove(path);
}

// Schema 7: varlen (packed variable-length batches) joined the results' unique key; a v6 file's rows come
// through as dense rows, and two packed batches with the same count and longest lengths are two rows.
TEST(Store, MigratesVersion6ToVarlenKeys) {
  std::string path = temp_db("v6");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-6 results table: no varlen column
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    const char* sql = R"sql(
      CREATE TABLE r6(id INTEGER PRIMARY KEY,
        kernel_hash TEXT NOT NULL, family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
        batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, causal INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
        max_abs REAL, max_rel REAL, mse REAL, ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL,
        gbps REAL, seed INTEGER, device_name TEXT NOT NULL, arch TEXT NOT NULL, sm_count INTEGER NOT NULL,
        driver_version INTEGER NOT NULL, nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
        registers INTEGER, smem_static INTEGER, spill_stores INTEGER, created TEXT NOT NULL, detail TEXT,
        inputs TEXT NOT NULL DEFAULT 'normal', origin INTEGER, heads_k INTEGER NOT NULL DEFAULT 0,
        UNIQUE(kernel_hash, device_name, sm_count, batch, heads, heads_k, seq_q, seq_k, inputs));
      INSERT INTO r6 SELECT id,kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,
        status,error,max_abs,max_rel,mse,ms_median,ms_p20,ms_p80,reps,tflops,gbps,seed,device_name,arch,sm_count,
        driver_version,nvrtc_version,options,source_hash,registers,smem_static,spill_stores,created,detail,inputs,origin,
        heads_k FROM results;
      DROP TABLE results; ALTER TABLE r6 RENAME TO results; UPDATE meta SET value='6';)sql";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::vector<ResultRecord> before;
  {
    Store ro(path, Store::Mode::read_only);
    EXPECT_EQ(ro.schema_version(), 6);
    before = ro.results({});
    ASSERT_EQ(before.size(), 8u);
    for (const auto& r : before) EXPECT_FALSE(r.problem.varlen.enabled());
  }
  Store s(path);
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  const std::vector<ResultRecord> after = s.results({});
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_EQ(after[i].problem, before[i].problem);
  }
  // Packed batches of 3 sequences, longest 300 (the batch and lengths columns alike), lengths differing:
  // rows of their own, beside the dense row of the same kernel and (B, Sq, Sk), and read back whole.
  auto packed = [&](std::vector<int> lens) {
    ResultRecord r = after[0];
    nlohmann::json j = to_json(r.problem);
    for (const char* k : {"batch", "seq_q", "seq_k"}) j.erase(k);
    j["varlen"] = {{"seq_lens", lens}};
    r.problem = problem_from_json(j);
    return r;
  };
  ResultRecord a = packed({300, 1, 17}), b = packed({300, 2, 17}), dense = after[0];
  ASSERT_EQ(a.problem.batch, 3);
  ASSERT_EQ(a.problem.seq_q, 300);
  dense.problem.batch = 3, dense.problem.seq_q = dense.problem.seq_k = 300;
  a.ms_median = 0.25, b.ms_median = 0.5;
  DeviceInfo d;
  d.name = a.device_name; d.arch = a.arch; d.sm_count = a.sm_count; d.driver_version = a.driver_version;
  EXPECT_FALSE(s.has_result(a.kernel_hash, d, a.problem));
  s.put_result(dense, d);
  EXPECT_FALSE(s.has_result(a.kernel_hash, d, a.problem));
  s.put_result(a, d);
  s.put_result(b, d);
  EXPECT_TRUE(s.has_result(a.kernel_hash, d, a.problem));
  EXPECT_TRUE(s.has_result(b.kernel_hash, d, b.problem));
  int found = 0;
  for (const auto& r : s.results({}))
    if (r.kernel_hash == a.kernel_hash && r.problem.batch == 3) {
      if (r.problem == a.problem) {
        found += 1;
        EXPECT_EQ(r.ms_median, 0.25);
      }
      if (r.problem == b.problem) {
        found += 10;
        EXPECT_EQ(r.ms_median, 0.5);
      }
      if (r.problem == dense.problem) found += 100;
    }
  EXPECT_EQ(found, 111);
  // A row whose lengths disagree with its batch column is named, not read as something else.
  s.put_result(a, d);
  {
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE results SET batch=4 WHERE ms_median=0.25", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  try {
    s.results({});
    ADD_FAILURE() << "a row with inconsistent varlen lengths was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("varlen lengths disagree"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

// Schema 8: paged (paged K/V caches) joined the results' unique key; a v7 file's rows come through as
// contiguous-cache rows, and a paged problem is a row of its own beside the dense one of the same shape.
TEST(Store, MigratesVersion7ToPagedKeys) {
  std::string path = temp_db("v7");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-7 results table: no paged column
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    const char* sql = R"sql(
      CREATE TABLE r7(id INTEGER PRIMARY KEY,
        kernel_hash TEXT NOT NULL, family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
        batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, causal INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
        max_abs REAL, max_rel REAL, mse REAL, ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL,
        gbps REAL, seed INTEGER, device_name TEXT NOT NULL, arch TEXT NOT NULL, sm_count INTEGER NOT NULL,
        driver_version INTEGER NOT NULL, nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
        registers INTEGER, smem_static INTEGER, spill_stores INTEGER, created TEXT NOT NULL, detail TEXT,
        inputs TEXT NOT NULL DEFAULT 'normal', origin INTEGER, heads_k INTEGER NOT NULL DEFAULT 0,
        varlen TEXT NOT NULL DEFAULT '',
        UNIQUE(kernel_hash, device_name, sm_count, batch, heads, heads_k, seq_q, seq_k, inputs, varlen));
      INSERT INTO r7 SELECT id,kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,
        status,error,max_abs,max_rel,mse,ms_median,ms_p20,ms_p80,reps,tflops,gbps,seed,device_name,arch,sm_count,
        driver_version,nvrtc_version,options,source_hash,registers,smem_static,spill_stores,created,detail,inputs,origin,
        heads_k,varlen FROM results;
      DROP TABLE results; ALTER TABLE r7 RENAME TO results; UPDATE meta SET value='7';)sql";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::vector<ResultRecord> before;
  {
    Store ro(path, Store::Mode::read_only);
    EXPECT_EQ(ro.schema_version(), 7);
    before = ro.results({});
    ASSERT_EQ(before.size(), 8u);
    for (const auto& r : before) EXPECT_FALSE(r.problem.paged.enabled());
  }
  Store s(path);
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  const std::vector<ResultRecord> after = s.results({});
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_EQ(after[i].problem, before[i].problem);
  }
  // Paged caches of 3 sequences, longest 300 (the batch and seq_k columns alike), lengths or seeds differing:
  // rows of their own beside the dense row of the same kernel and shape, read back whole.
  auto paged = [&](const nlohmann::json& desc) {
    ResultRecord r = after[0];
    nlohmann::json j = to_json(r.problem);
    j["batch"] = 3, j["seq_k"] = 300, j["paged"] = desc;
    r.problem = problem_from_json(j);
    return r;
  };
  ResultRecord a = paged({{"page_size", 64}, {"seq_lens_k", {300, 1, 17}}}),
               b = paged({{"page_size", 64}, {"seq_lens_k", {300, 2, 17}}}),
               c = paged({{"page_size", 64}, {"seed", 5}}), dense = after[0];
  dense.problem.batch = 3, dense.problem.seq_k = 300;
  ASSERT_EQ(a.problem.seq_k, dense.problem.seq_k);
  a.ms_median = 0.25, b.ms_median = 0.5, c.ms_median = 0.75;
  DeviceInfo d;
  d.name = a.device_name; d.arch = a.arch; d.sm_count = a.sm_count; d.driver_version = a.driver_version;
  s.put_result(dense, d);
  EXPECT_FALSE(s.has_result(a.kernel_hash, d, a.problem));
  for (const ResultRecord* r : {&a, &b, &c}) s.put_result(*r, d);
  for (const ResultRecord* r : {&a, &b, &c, &dense}) EXPECT_TRUE(s.has_result(r->kernel_hash, d, r->problem));
  int found = 0;
  for (const auto& r : s.results({}))
    if (r.kernel_hash == a.kernel_hash && r.problem.batch == 3) {
      for (const auto& [want, ms, tag] : {std::tuple{&a, 0.25, 1}, std::tuple{&b, 0.5, 10}, std::tuple{&c, 0.75, 100}})
        if (r.problem == want->problem) {
          found += tag;
          EXPECT_EQ(r.ms_median, ms);
        }
      if (r.problem == dense.problem) found += 1000;
    }
  EXPECT_EQ(found, 1111);
  // A row whose lengths disagree with its batch column is named, not read as something else.
  {
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE results SET batch=4 WHERE ms_median=0.25", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  try {
    s.results({});
    ADD_FAILURE() << "a row with inconsistent paged lengths was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("but the paged seq_lens_k give 3"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(Store, MigratesVersion8ToWindowAndSoftcapKeys) {
  std::string path = temp_db("v8");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-8 results table: no window_left, window_right, softcap
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    const char* sql = R"sql(
      CREATE TABLE r8(id INTEGER PRIMARY KEY,
        kernel_hash TEXT NOT NULL, family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
        batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, causal INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
        max_abs REAL, max_rel REAL, mse REAL, ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL,
        gbps REAL, seed INTEGER, device_name TEXT NOT NULL, arch TEXT NOT NULL, sm_count INTEGER NOT NULL,
        driver_version INTEGER NOT NULL, nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
        registers INTEGER, smem_static INTEGER, spill_stores INTEGER, created TEXT NOT NULL, detail TEXT,
        inputs TEXT NOT NULL DEFAULT 'normal', origin INTEGER, heads_k INTEGER NOT NULL DEFAULT 0,
        varlen TEXT NOT NULL DEFAULT '', paged TEXT NOT NULL DEFAULT '',
        UNIQUE(kernel_hash, device_name, sm_count, batch, heads, heads_k, seq_q, seq_k, inputs, varlen, paged));
      INSERT INTO r8 SELECT id,kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,
        status,error,max_abs,max_rel,mse,ms_median,ms_p20,ms_p80,reps,tflops,gbps,seed,device_name,arch,sm_count,
        driver_version,nvrtc_version,options,source_hash,registers,smem_static,spill_stores,created,detail,inputs,origin,
        heads_k,varlen,paged FROM results;
      DROP TABLE results; ALTER TABLE r8 RENAME TO results; UPDATE meta SET value='8';)sql";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::vector<ResultRecord> before;
  {  // read read-only as it is: every row unwindowed, uncapped
    Store ro(path, Store::Mode::read_only);
    EXPECT_EQ(ro.schema_version(), 8);
    before = ro.results({});
    ASSERT_EQ(before.size(), 8u);
    for (const auto& r : before) EXPECT_FALSE(r.problem.windowed() || r.problem.softcapped());
  }
  Store s(path);
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  const std::vector<ResultRecord> after = s.results({});
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_EQ(after[i].problem, before[i].problem);  // every old row means what it meant: no window, no cap
    EXPECT_EQ(after[i].problem.window_left, -1);
    EXPECT_EQ(after[i].problem.window_right, -1);
    EXPECT_EQ(after[i].problem.softcap, 0.0);
  }
  // The same kernel and shape with windows and softcaps: rows of their own beside the plain row, read back whole.
  auto with = [&](int l, int r, double c, bool causal = false) {
    ResultRecord x = after[0];
    x.problem.causal = causal;
    x.problem.window_left = l, x.problem.window_right = r, x.problem.softcap = c;
    x.problem.canonicalize_mask();
    return x;
  };
  ResultRecord a = with(128, 7, 0, true), b = with(128, 4, 0), c = with(-1, -1, 30), e = with(1, 1, 0.5);
  a.ms_median = 0.25, b.ms_median = 0.5, c.ms_median = 0.75, e.ms_median = 1.25;
  DeviceInfo d;
  d.name = a.device_name; d.arch = a.arch; d.sm_count = a.sm_count; d.driver_version = a.driver_version;
  EXPECT_EQ(a.problem.window_right, -1);  // causal is the right edge: one spelling
  EXPECT_FALSE(s.has_result(a.kernel_hash, d, a.problem));
  for (const ResultRecord* r : {&a, &b, &c, &e}) s.put_result(*r, d);
  const ResultRecord* all[] = {&a, &b, &c, &e, &after[0]};
  for (const ResultRecord* r : all) EXPECT_TRUE(s.has_result(r->kernel_hash, d, r->problem));
  int found = 0;
  for (const auto& r : s.results({}))
    if (r.kernel_hash == a.kernel_hash)
      for (const auto& [want, ms, tag] : {std::tuple{&a, 0.25, 1}, std::tuple{&b, 0.5, 10}, std::tuple{&c, 0.75, 100},
                                          std::tuple{&e, 1.25, 1000}})
        if (r.problem == want->problem) {
          found += tag;
          EXPECT_EQ(r.ms_median, ms);
        }
  EXPECT_EQ(found, 1111);
  // A stored window outside the range, or not in its one spelling, is named rather than read as another problem.
  for (const char* bad : {"UPDATE results SET window_left=-7 WHERE ms_median=0.25",
                          "UPDATE results SET window_right=0, causal=0 WHERE ms_median=0.25"}) {
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db, "SAVEPOINT x", nullptr, nullptr, nullptr), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, bad, nullptr, nullptr, nullptr), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "RELEASE x", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
    try {
      s.results({});
      ADD_FAILURE() << "a bad stored window was read: " << bad;
    } catch (const UsageError& err) {
      EXPECT_NE(std::string(err.what()).find("window"), std::string::npos) << err.what();
    }
    sqlite3_open(path.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE results SET window_left=128, window_right=-1, causal=1 WHERE ms_median=0.25",
                           nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  fs::remove(path);
}

TEST(Store, CopiesKeepStoredRowsAndRollBackTogether) {
  std::string path = temp_db("copy");
  Store s(path);
  auto r = fixture::fixture_result("BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2", Problem{1, 1, 8, 8, 64}, "ok", 1.0);
  r.device_name = "NVIDIA H200";
  r.sm_count = 132;
  r.driver_version = 13000;
  r.created = "2020-01-01T00:00:00Z";
  EXPECT_EQ(s.copy_result(r, 0), Copied::added);
  EXPECT_EQ(s.copy_result(r, 0), Copied::present);
  auto other = r;
  other.ms_median = 2.0;
  EXPECT_EQ(s.copy_result(other, 0), Copied::differs);
  auto stored = s.results({});
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].ms_median, 1.0);  // the stored row is kept
  EXPECT_EQ(stored[0].created, r.created);  // with its own time

  // A throw inside transaction() undoes every copy and put made in it.
  auto r2 = r;
  r2.kernel_hash = "another";
  EXPECT_THROW(s.transaction([&] {
    s.copy_result(r2, 0);
    s.put_result(r2, fixture::fixture_device());
    throw UsageError("refused");
  }),
               UsageError);
  EXPECT_EQ(s.results({}).size(), 1u);
  s.transaction([&] { EXPECT_EQ(s.copy_result(r2, 0), Copied::added); });
  EXPECT_EQ(s.results({}).size(), 2u);
  fs::remove(path);
}

// Every field written and read back by its column's name: distinct values everywhere, so that two columns
// read into each other's fields (ms_p20 and ms_p80, registers and smem_static) cannot pass.
TEST(Store, EveryFieldRoundTripsByName) {
  const std::string path = temp_db("every_field");
  Store s(path);
  KernelRecord k;
  k.hash = "h1"; k.family = "fa2_mma"; k.direction = "bwd"; k.config = "BLOCK_M=64"; k.head_dim = 96;
  k.causal = true; k.dtype = DType::bf16; k.arch = "sm_90a"; k.nvrtc_version = "13.1"; k.options = "-O3";
  k.source_hash = "src"; k.name_expression = "ne"; k.status = "compiled"; k.reason = "why"; k.lowered_name = "ln";
  k.res = {101, 102, 103, 104, 105}; k.compile_ms = 1.5; k.log = "log"; k.cubin = std::string("\0\1\2", 3);
  s.put_kernel(k);
  auto same_kernel = [&](const KernelRecord& g) {
    EXPECT_EQ(std::tie(g.hash, g.family, g.direction, g.config, g.head_dim, g.causal, g.dtype, g.arch, g.nvrtc_version,
                       g.options, g.source_hash, g.name_expression, g.status, g.reason, g.lowered_name, g.log, g.cubin),
              std::tie(k.hash, k.family, k.direction, k.config, k.head_dim, k.causal, k.dtype, k.arch, k.nvrtc_version,
                       k.options, k.source_hash, k.name_expression, k.status, k.reason, k.lowered_name, k.log, k.cubin));
    EXPECT_EQ(std::tie(g.res.registers, g.res.smem_static, g.res.stack_bytes, g.res.spill_stores, g.res.spill_loads),
              std::tie(k.res.registers, k.res.smem_static, k.res.stack_bytes, k.res.spill_stores, k.res.spill_loads));
    EXPECT_DOUBLE_EQ(g.compile_ms, k.compile_ms);
    EXPECT_FALSE(g.created.empty());
  };
  auto found = s.find_kernel("h1");
  ASSERT_TRUE(found);
  same_kernel(*found);
  int kernels = 0;
  s.each_kernel([&](const KernelRecord& g) {
    same_kernel(g);
    ++kernels;
  }, true);
  EXPECT_EQ(kernels, 1);

  ResultRecord r;
  r.kernel_hash = "h1"; r.family = "fa2_mma"; r.direction = "bwd"; r.config = "BLOCK_M=64";
  r.problem = {3, 8, 100, 200, 96, DType::bf16, true, "bwd"};
  r.problem.heads_k = 2;
  r.status = "ok"; r.error = "err"; r.max_abs = 0.25; r.max_rel = 0.5; r.mse = 0.125; r.detail = R"({"a":1})";
  r.ms_median = 2.0; r.ms_p20 = 1.75; r.ms_p80 = 2.25; r.reps = 7; r.tflops = 11.0; r.gbps = 12.0; r.seed = 13;
  r.nvrtc_version = "13.1"; r.options = "-O3"; r.source_hash = "src"; r.res = {101, 102, 0, 104, 0};
  DeviceInfo d;
  d.name = "GPU X"; d.arch = "sm_90"; d.sm_count = 132; d.driver_version = 13000;
  s.put_result(r, d);
  const auto rows = s.results({});
  ASSERT_EQ(rows.size(), 1u);
  const ResultRecord& g = rows[0];
  EXPECT_GT(g.id, 0);
  EXPECT_EQ(std::tie(g.kernel_hash, g.family, g.direction, g.config, g.problem, g.status, g.error, g.detail, g.reps,
                     g.seed, g.nvrtc_version, g.options, g.source_hash),
            std::tie(r.kernel_hash, r.family, r.direction, r.config, r.problem, r.status, r.error, r.detail, r.reps,
                     r.seed, r.nvrtc_version, r.options, r.source_hash));
  EXPECT_EQ(g.problem.heads_k, 2);
  EXPECT_EQ(std::tie(g.max_abs, g.max_rel, g.mse, g.ms_median, g.ms_p20, g.ms_p80, g.tflops, g.gbps),
            std::tie(r.max_abs, r.max_rel, r.mse, r.ms_median, r.ms_p20, r.ms_p80, r.tflops, r.gbps));
  EXPECT_EQ(std::tie(g.device_name, g.arch, g.sm_count, g.driver_version),
            std::tie(d.name, d.arch, d.sm_count, d.driver_version));
  EXPECT_EQ(std::tie(g.res.registers, g.res.smem_static, g.res.spill_stores), std::tie(r.res.registers,
            r.res.smem_static, r.res.spill_stores));
  EXPECT_FALSE(g.created.empty());
  EXPECT_EQ(s.device_signatures(), (std::set<DeviceSignature>{{d.name, d.arch, d.sm_count, d.driver_version}}));
  ResultFilter lean;
  lean.lean = true;  // the long texts read as '', the rest as stored
  const auto lean_rows = s.results(lean);
  ASSERT_EQ(lean_rows.size(), 1u);
  EXPECT_EQ(std::tie(lean_rows[0].kernel_hash, lean_rows[0].error, lean_rows[0].detail, lean_rows[0].options,
                     lean_rows[0].nvrtc_version), std::make_tuple("", "", "", "", ""));
  EXPECT_EQ(std::tie(lean_rows[0].config, lean_rows[0].problem, lean_rows[0].ms_p80, lean_rows[0].source_hash),
            std::tie(r.config, r.problem, r.ms_p80, r.source_hash));
  EXPECT_EQ(s.copy_result(g, 0), Copied::present);
  EXPECT_EQ(s.copy_kernel(k, 0), Copied::present);

  const long long run = s.begin_experiment({0, "exp", "Title", "GPU X", R"({"p":1})", R"({"s":2})", ""});
  ExperimentRow e;
  e.run_id = run; e.impl = "torch_flash"; e.family = "fam"; e.config = "cfg";
  e.problem = {2, 4, 64, 128, 64, DType::fp16, true, "fwd"};
  e.status = "ok"; e.error = "err"; e.ms_median = 1.0; e.ms_p20 = 0.5; e.ms_p80 = 1.5; e.reps = 9; e.tflops = 3.0;
  e.gbps = 4.0; e.max_abs = 0.1; e.mean_abs = 0.2; e.mse = 0.3; e.max_rel = 0.4; e.peak_bytes = 1ll << 33;
  e.device = "GPU X"; e.detail = "{}";
  s.put_experiment_row(e);
  const auto runs = s.experiment_runs("exp");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(std::tie(runs[0].id, runs[0].experiment, runs[0].title, runs[0].device_name, runs[0].probes, runs[0].spec),
            std::make_tuple(run, "exp", "Title", "GPU X", R"({"p":1})", R"({"s":2})"));
  const auto erows = s.experiment_rows(run);
  ASSERT_EQ(erows.size(), 1u);
  const ExperimentRow& h = erows[0];
  EXPECT_EQ(std::tie(h.run_id, h.impl, h.family, h.config, h.problem, h.status, h.error, h.reps, h.peak_bytes, h.device,
                     h.detail),
            std::tie(e.run_id, e.impl, e.family, e.config, e.problem, e.status, e.error, e.reps, e.peak_bytes, e.device,
                     e.detail));
  EXPECT_EQ(std::tie(h.ms_median, h.ms_p20, h.ms_p80, h.tflops, h.gbps, h.max_abs, h.mean_abs, h.mse, h.max_rel),
            std::tie(e.ms_median, e.ms_p20, e.ms_p80, e.tflops, e.gbps, e.max_abs, e.mean_abs, e.mse, e.max_rel));

  Provenance p;
  p.kind = "merge"; p.source = "/a.db"; p.content_hash = "ch"; p.upstream = "[]"; p.created = "2025-01-01T00:00:00Z";
  p.source_schema = 7; p.kernels = 21; p.results = 22; p.experiment_runs = 23;
  p.id = s.add_provenance(p);
  const auto prov = s.find_provenance("ch");
  ASSERT_TRUE(prov);
  EXPECT_EQ(std::tie(prov->id, prov->kind, prov->source, prov->content_hash, prov->upstream, prov->created,
                     prov->source_schema, prov->kernels, prov->results, prov->experiment_runs),
            std::tie(p.id, p.kind, p.source, p.content_hash, p.upstream, p.created, p.source_schema, p.kernels,
                     p.results, p.experiment_runs));
  EXPECT_EQ(s.provenance().size(), 1u);
  fs::remove(path);
}

// Schema 10: results.alibi in the unique key. A version-9 table (no alibi column) is read read-only with every row
// plain, migrated with every row keeping its meaning, and an ALiBi row of the same kernel and shape is a row of its
// own, read back whole; a stored alibi other than 0 or 1 is named.
TEST(Store, MigratesVersion9ToAlibiKey) {
  std::string path = temp_db("v9");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-9 results table: the v10 table without its alibi column
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    const char* rebuild = R"sql(
      CREATE TABLE r9(id INTEGER PRIMARY KEY,
        kernel_hash TEXT NOT NULL, family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
        batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, causal INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
        max_abs REAL, max_rel REAL, mse REAL, ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL,
        gbps REAL, seed INTEGER, device_name TEXT NOT NULL, arch TEXT NOT NULL, sm_count INTEGER NOT NULL,
        driver_version INTEGER NOT NULL, nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
        registers INTEGER, smem_static INTEGER, spill_stores INTEGER, created TEXT NOT NULL, detail TEXT,
        inputs TEXT NOT NULL DEFAULT 'normal', origin INTEGER, heads_k INTEGER NOT NULL DEFAULT 0,
        varlen TEXT NOT NULL DEFAULT '', paged TEXT NOT NULL DEFAULT '',
        window_left INTEGER NOT NULL DEFAULT -1, window_right INTEGER NOT NULL DEFAULT -1, softcap REAL NOT NULL DEFAULT 0,
        UNIQUE(kernel_hash, device_name, sm_count, batch, heads, heads_k, seq_q, seq_k, inputs, varlen, paged,
               window_left, window_right, softcap));
      INSERT INTO r9 SELECT id,kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,
        status,error,max_abs,max_rel,mse,ms_median,ms_p20,ms_p80,reps,tflops,gbps,seed,device_name,arch,sm_count,
        driver_version,nvrtc_version,options,source_hash,registers,smem_static,spill_stores,created,detail,inputs,origin,
        heads_k,varlen,paged,window_left,window_right,softcap FROM results;
      DROP TABLE results; ALTER TABLE r9 RENAME TO results; UPDATE meta SET value='9';)sql";
    ASSERT_EQ(sqlite3_exec(db, rebuild, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::vector<ResultRecord> before;
  {
    Store ro(path, Store::Mode::read_only);
    EXPECT_EQ(ro.schema_version(), 9);
    before = ro.results({});
    ASSERT_EQ(before.size(), 8u);
    for (const auto& r : before) EXPECT_FALSE(r.problem.alibi);
  }
  Store s(path);
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  const std::vector<ResultRecord> after = s.results({});
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_EQ(after[i].problem, before[i].problem);
  }
  ResultRecord a = after[0];
  a.problem.alibi = true;
  a.ms_median = 0.125;
  DeviceInfo d;
  d.name = a.device_name; d.arch = a.arch; d.sm_count = a.sm_count; d.driver_version = a.driver_version;
  EXPECT_FALSE(s.has_result(a.kernel_hash, d, a.problem));
  s.put_result(a, d);
  EXPECT_TRUE(s.has_result(a.kernel_hash, d, a.problem));
  EXPECT_TRUE(s.has_result(after[0].kernel_hash, d, after[0].problem));
  int found = 0;
  for (const auto& r : s.results({}))
    if (r.kernel_hash == a.kernel_hash && r.problem == a.problem) {
      ++found;
      EXPECT_EQ(r.ms_median, 0.125);
    }
  EXPECT_EQ(found, 1);
  sqlite3* db;
  sqlite3_open(path.c_str(), &db);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE results SET alibi=2 WHERE ms_median=0.125", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  try {
    s.results({});
    ADD_FAILURE() << "a stored alibi of 2 was read";
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("alibi"), std::string::npos) << err.what();
  }
}

// Schema 11: results.mask_mod in the unique key. A version-10 table (no mask_mod column) is read read-only with every
// row unmasked, migrated with every row keeping its meaning, and a mask_mod row of the same kernel and shape is a
// row of its own, read back with its predicate and digests; a stored predicate is checked as a problem file's.
TEST(Store, MigratesVersion10ToMaskModKey) {
  std::string path = temp_db("v10");
  {
    Store s(path);
    fixture::fill_fixture(s);
  }
  {  // a version-10 results table: the v11 table without its mask_mod column
    sqlite3* db;
    sqlite3_open(path.c_str(), &db);
    const char* rebuild = R"sql(
      CREATE TABLE r10(id INTEGER PRIMARY KEY,
        kernel_hash TEXT NOT NULL, family TEXT NOT NULL, direction TEXT NOT NULL, config TEXT NOT NULL,
        batch INTEGER NOT NULL, heads INTEGER NOT NULL, seq_q INTEGER NOT NULL, seq_k INTEGER NOT NULL,
        head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, causal INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
        max_abs REAL, max_rel REAL, mse REAL, ms_median REAL, ms_p20 REAL, ms_p80 REAL, reps INTEGER, tflops REAL,
        gbps REAL, seed INTEGER, device_name TEXT NOT NULL, arch TEXT NOT NULL, sm_count INTEGER NOT NULL,
        driver_version INTEGER NOT NULL, nvrtc_version TEXT NOT NULL, options TEXT NOT NULL, source_hash TEXT NOT NULL,
        registers INTEGER, smem_static INTEGER, spill_stores INTEGER, created TEXT NOT NULL, detail TEXT,
        inputs TEXT NOT NULL DEFAULT 'normal', origin INTEGER, heads_k INTEGER NOT NULL DEFAULT 0,
        varlen TEXT NOT NULL DEFAULT '', paged TEXT NOT NULL DEFAULT '',
        window_left INTEGER NOT NULL DEFAULT -1, window_right INTEGER NOT NULL DEFAULT -1, softcap REAL NOT NULL DEFAULT 0,
        alibi INTEGER NOT NULL DEFAULT 0,
        UNIQUE(kernel_hash, device_name, sm_count, batch, heads, heads_k, seq_q, seq_k, inputs, varlen, paged,
               window_left, window_right, softcap, alibi));
      INSERT INTO r10 SELECT id,kernel_hash,family,direction,config,batch,heads,seq_q,seq_k,head_dim,dtype,causal,
        status,error,max_abs,max_rel,mse,ms_median,ms_p20,ms_p80,reps,tflops,gbps,seed,device_name,arch,sm_count,
        driver_version,nvrtc_version,options,source_hash,registers,smem_static,spill_stores,created,detail,inputs,origin,
        heads_k,varlen,paged,window_left,window_right,softcap,alibi FROM results;
      DROP TABLE results; ALTER TABLE r10 RENAME TO results; UPDATE meta SET value='10';)sql";
    ASSERT_EQ(sqlite3_exec(db, rebuild, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::vector<ResultRecord> before;
  {
    Store ro(path, Store::Mode::read_only);
    EXPECT_EQ(ro.schema_version(), 10);
    before = ro.results({});
    ASSERT_EQ(before.size(), 8u);
    for (const auto& r : before) EXPECT_FALSE(r.problem.mask_mod.enabled());
  }
  Store s(path);
  EXPECT_EQ(s.schema_version(), kSchemaVersion);
  const std::vector<ResultRecord> after = s.results({});
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_EQ(after[i].problem, before[i].problem);
  }
  ResultRecord a = after[0];
  a.problem.mask_mod = mask_mod_from_json(nlohmann::json::parse(
      R"({"predicate": "doc[q_idx] == doc[kv_idx]", "tensors": {"doc": {"segments": [3, 5]}}})"));
  a.ms_median = 0.25;
  DeviceInfo d;
  d.name = a.device_name; d.arch = a.arch; d.sm_count = a.sm_count; d.driver_version = a.driver_version;
  EXPECT_FALSE(s.has_result(a.kernel_hash, d, a.problem));
  s.put_result(a, d);
  EXPECT_TRUE(s.has_result(a.kernel_hash, d, a.problem));
  EXPECT_TRUE(s.has_result(after[0].kernel_hash, d, after[0].problem));
  int found = 0;
  for (const auto& r : s.results({}))
    if (r.kernel_hash == a.kernel_hash && r.problem.mask_mod.enabled()) {
      ++found;
      EXPECT_EQ(r.problem, a.problem);  // the predicate and the digest: its identity (the values are not stored)
      EXPECT_FALSE(r.problem.mask_mod.has_values());
      EXPECT_EQ(r.ms_median, 0.25);
    }
  EXPECT_EQ(found, 1);
  // Another document layout under the same predicate is another problem.
  ResultRecord b = a;
  b.problem.mask_mod = mask_mod_from_json(nlohmann::json::parse(
      R"({"predicate": "doc[q_idx] == doc[kv_idx]", "tensors": {"doc": {"segments": [4, 4]}}})"));
  EXPECT_FALSE(s.has_result(b.kernel_hash, d, b.problem));
  sqlite3* db;
  sqlite3_open(path.c_str(), &db);
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE results SET mask_mod='{\"predicate\":\"#include <x>\",\"tensors\":{}}' "
                         "WHERE ms_median=0.25",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  try {
    s.results({});
    ADD_FAILURE() << "a stored predicate with a directive was read";
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("may not hold '#'"), std::string::npos) << err.what();
  }
}
