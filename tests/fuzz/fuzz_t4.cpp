// T4 files (`flashtune import`): the whole document is checked before a new store receives its results.
#include "tests/fuzz/fuzz.hpp"
#include "tests/fuzz/fuzz_files.hpp"
#include "tuner/interop/t4.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = flashtune::fuzz::write_file("in.t4.json", data, size);
  const std::string db = flashtune::fuzz::scratch_dir() + "/t4.db";
  flashtune::fuzz::remove_store(db);
  return flashtune::fuzz::verdict([&] { (void)flashtune::t4_import(file, db); });
}
