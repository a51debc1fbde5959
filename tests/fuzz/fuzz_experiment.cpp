// Experiment definitions (experiments/*.json, `flashtune experiment --dry-run`); file references resolve
// against a folder that does not exist, so only inline problems are read.
#include "tests/fuzz/fuzz.hpp"
#include "tuner/experiments/experiment.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return flashtune::fuzz::verdict([&] {
    const auto spec = flashtune::experiment_from_json(flashtune::parse_json_bounded(flashtune::fuzz::text(data, size), "fuzz"),
                                                      "/nonexistent/flashtune-fuzz");
    (void)flashtune::experiment_plan(spec);
  });
}
