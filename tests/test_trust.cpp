// Issue 34's checks at the edges that are plain functions: which paths are a store's files.
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
