// Space files (`flashtune tune`, compile-check): params checked against a family's domain, lists deduplicated,
// sizes bounded before anything is built; the variants of a small space are built and checked too.
#include "tests/fuzz/fuzz.hpp"
#include "tuner/space/space.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return flashtune::fuzz::verdict([&] {
    const flashtune::Space s = flashtune::space_from_json(flashtune::parse_json_bounded(flashtune::fuzz::text(data, size), "fuzz"));
    if (s.size() <= 64)
      for (const auto& v : s.variants()) (void)v;
  });
}
