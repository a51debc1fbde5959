// Issue 34's checks at the edges that are plain functions: which paths are a store's files, which rows from
// another store or file are taken, which stored text may reach a terminal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "core/util.hpp"
#include "fixture.hpp"
#include "tuner/interop/merge.hpp"

using namespace flashtune;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const char* name) {
  const fs::path d = fixture::scratch_dir() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
void touch(const fs::path& p) { std::ofstream(p) << "x"; }
}  // namespace

// An output is the store, or one of the files SQLite keeps beside it, however either path is spelled and
// whether the companion exists or not; anything else is not.
TEST(Trust, StoreFilesByAnySpelling) {
  const fs::path d = fresh_dir("store_files");
  const fs::path other = fresh_dir("store_files_other");
  const std::string db = (d / "s.db").string();
  touch(db);
  touch(d / "s.db-wal");
  fs::create_hard_link(db, other / "hard.db");
  fs::create_symlink(db, other / "link.db");
  fs::create_directory_symlink(d, other / "dirlink");
  const std::string dot = (d / "." / "s.db").string(), up = (d / ".." / d.filename() / "s.db").string();
  for (const std::string& same : {db, dot, up, (other / "hard.db").string(), (other / "link.db").string(),
                                  (other / "dirlink" / "s.db").string()})
    EXPECT_TRUE(is_store_file(same, db)) << same;
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {  // -wal exists, the others do not (yet)
    EXPECT_TRUE(is_store_file(db + suffix, db)) << suffix;
    EXPECT_TRUE(is_store_file(dot + suffix, db)) << suffix;
    EXPECT_TRUE(is_store_file((other / "dirlink" / "s.db").string() + suffix, db)) << suffix;
    EXPECT_TRUE(is_store_file(db + suffix, (other / "dirlink" / "s.db").string())) << suffix;
    // a store named through a link: SQLite keeps its journals beside the file the link leads to
    EXPECT_TRUE(is_store_file(db + suffix, (other / "link.db").string())) << suffix;
    EXPECT_TRUE(is_store_file((other / "link.db").string() + suffix, (other / "link.db").string())) << suffix;
  }
  // a link to a companion not there yet: writing through it would make the store's journal
  fs::create_symlink(d / "s.db-journal", other / "dangling.cubin");
  EXPECT_TRUE(is_store_file((other / "dangling.cubin").string(), db));
  fs::create_symlink("../store_files/s.db-shm", other / "relative.cubin");
  EXPECT_TRUE(is_store_file((other / "relative.cubin").string(), db));
  fs::create_symlink(other / "dangling.cubin", other / "chain.cubin");
  EXPECT_TRUE(is_store_file((other / "chain.cubin").string(), db));
  fs::create_symlink(other / "loop_b", other / "loop_a");
  fs::create_symlink(other / "loop_a", other / "loop_b");
  EXPECT_FALSE(is_store_file((other / "loop_a").string(), db));  // a loop ends
  // a hard link to the -wal, by another name
  fs::create_hard_link(d / "s.db-wal", other / "wal.json");
  EXPECT_TRUE(is_store_file((other / "wal.json").string(), db));
  for (const std::string& not_it : {(d / "s.db.wal").string(), db + "-wal2", db + "-", (d / "t.db").string(),
                                    (d / "s.db-wal" / "x").string(), (other / "hard.db-wal").string(), std::string()})
    EXPECT_FALSE(is_store_file(not_it, db)) << not_it;
  EXPECT_FALSE(is_store_file(db, ""));
  // a companion's own companion is not the store's
  EXPECT_FALSE(is_store_file(db + "-wal-journal", db));
}

TEST(Trust, UtcTimestampsOnly) {
  for (const char* ok : {"2026-11-28T10:05:00Z", "1999-01-31T23:59:59Z", "2026-06-30T00:00:60Z", "2026-11-28T10:05:00.5Z",
                         "2026-11-28T10:05:00.123456789Z"})
    EXPECT_TRUE(is_utc_timestamp(ok)) << ok;
  for (const char* bad : {"", "yesterday", "2026-11-28 10:05:00", "2026-11-28T10:05:00", "2026-13-01T00:00:00Z",
                          "2026-00-01T00:00:00Z", "2026-11-32T00:00:00Z", "2026-11-00T00:00:00Z", "2026-11-28T24:00:00Z",
                          "2026-11-28T10:60:00Z", "2026-11-28T10:05:61Z", "2026-11-28T10:05:00.Z",
                          "2026-11-28T10:05:00.1234567890Z", "99999-01-01T00:00:00Z", "2026-11-28T10:05:00+01:00",
                          "2026-1a-28T10:05:00Z", "+026-11-28T10:05:00Z", "2026-11-28T10:05:00Zjunk",
                          "2026-11-28t10:05:00z"})
    EXPECT_FALSE(is_utc_timestamp(bad)) << bad;
}

// A result row from another store or file: its figures decide `best` and `run --best`, so they are those a
// T4 import takes, however the row came (merge, import); a failed row's figures may be zero.
TEST(Trust, RowsFromOutsideHaveFiguresInRange) {
  Problem p{4, 16, 4096, 4096, 64, DType::fp32, false};
  ResultRecord ok = fixture::fixture_result("BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2", p, "ok", 10.0);
  ok.device_name = "NVIDIA H100 80GB HBM3";
  ok.sm_count = 132;
  ok.created = "2026-11-28T10:05:00Z";
  EXPECT_NO_THROW(check_result_row(ok));
  ResultRecord failed = ok;
  failed.status = "invalid";
  failed.ms_median = failed.ms_p20 = failed.ms_p80 = failed.tflops = failed.gbps = 0;
  failed.max_abs = std::numeric_limits<double>::infinity();  // an error figure may be inf or NaN
  failed.max_rel = std::nan("");
  EXPECT_NO_THROW(check_result_row(failed));

  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  struct Case {
    const char* what;
    std::function<void(ResultRecord&)> change;
    const char* needle;
  };
  const Case cases[] = {
      {"tflops inf", [&](ResultRecord& r) { r.tflops = inf; }, "tflops"},
      {"tflops 1e300", [](ResultRecord& r) { r.tflops = 1e300; }, "tflops 1e+300 is not a number in 0..10000"},
      {"tflops 2e4", [](ResultRecord& r) { r.tflops = 2e4; }, "tflops"},
      {"tflops nan", [&](ResultRecord& r) { r.tflops = nan; }, "tflops"},
      {"tflops < 0", [](ResultRecord& r) { r.tflops = -1; }, "tflops"},
      {"gbps 1e8", [](ResultRecord& r) { r.gbps = 1e8; }, "gbps"},
      {"ms inf", [&](ResultRecord& r) { r.ms_median = inf; }, "ms_median"},
      {"ms < 0", [](ResultRecord& r) { r.ms_p20 = -0.5; }, "ms_p20"},
      {"ms_p80 nan", [&](ResultRecord& r) { r.ms_p80 = nan; }, "ms_p80"},
      {"ok at 0 ms", [](ResultRecord& r) { r.ms_median = 0; }, "ms_median must be above 0 for status ok"},
      {"reps < 0", [](ResultRecord& r) { r.reps = -3; }, "reps"},
      {"created", [](ResultRecord& r) { r.created = "2026-11-28 10:05:00"; }, "is not a UTC time"},
      {"created empty", [](ResultRecord& r) { r.created = ""; }, "is not a UTC time"},
      {"device NUL", [](ResultRecord& r) { r.device_name = std::string("NVIDIA H100\0x", 13); }, "control characters"},
      {"device C1", [](ResultRecord& r) { r.device_name = "GPU\xc2\x9b" "2J"; }, "control characters"},
  };
  for (const Case& c : cases) {
    ResultRecord r = ok;
    c.change(r);
    try {
      check_result_row(r);
      ADD_FAILURE() << c.what << ": taken";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << c.what << ": " << e.what();
    }
  }
}

// Stored text in a one-line message or a table: no control character reaches a terminal, C1 ones in UTF-8
// (U+009B is CSI) included; other UTF-8 text is kept.
TEST(Trust, BriefLeavesNoControlCharacters) {
  EXPECT_EQ(brief("a\x1b[2Jb\x07\x7f"), "a?[2Jb??");
  EXPECT_EQ(brief("x\xc2\x9b" "31mred\xc2\x80\xc2\x9f"), "x?31mred??");
  EXPECT_EQ(brief("caf\xc3\xa9 \xc2\xa0\xc2\xb5"), "caf\xc3\xa9 \xc2\xa0\xc2\xb5");  // é, NBSP and µ are text
  EXPECT_EQ(brief(std::string("a\0b", 3)), "a?b");
  EXPECT_EQ(brief("abcdef", 3), "abc...");
  EXPECT_EQ(brief("ab\xc2", 80), "ab\xc2");  // a cut sequence is not a control
}
