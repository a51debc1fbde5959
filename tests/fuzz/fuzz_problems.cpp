// Problem files (`flashtune problems`, tune's second argument): problems, grids, varlen and paged objects.
#include "tests/fuzz/fuzz.hpp"
#include "tuner/space/space.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return flashtune::fuzz::verdict([&] {
    for (const auto& p : flashtune::problems_from_json(flashtune::parse_json_bounded(flashtune::fuzz::text(data, size), "fuzz")))
      (void)p.str(), (void)p.flops(), (void)p.bytes(), (void)flashtune::to_json(p);
  });
}
