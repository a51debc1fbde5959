// Opening a store read-only (best, export, emit, merge's source) and reading everything a read-only verb reads.
#include "results/select.hpp"
#include "results/store.hpp"
#include "tests/fuzz/fuzz.hpp"
#include "tests/fuzz/fuzz_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string db = flashtune::fuzz::scratch_dir() + "/in.db";
  flashtune::fuzz::remove_store(db);
  flashtune::fuzz::write_file("in.db", data, size);
  return flashtune::fuzz::verdict([&] {
    flashtune::Store store(db, flashtune::Store::Mode::read_only);
    const auto rows = store.results({});
    (void)flashtune::best_per_problem(rows);
    (void)flashtune::best_per_bucket(rows);
    (void)store.device_signatures();
    (void)store.provenance();
    for (const auto& run : store.experiment_runs()) (void)store.experiment_rows(run.id);
    store.each_kernel([](const flashtune::KernelRecord&) {}, false);
  });
}
