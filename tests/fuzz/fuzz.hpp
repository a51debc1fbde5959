// What every fuzz target shares: the input's verdict. A refusal the CLI turns into one line and exit 2
// (UsageError, a JSON type error) is a pass; anything else that escapes (std::out_of_range, bad_alloc,
// a "sqlite:" runtime_error: exit 1 or an abort in the CLI) is a finding, so it aborts and the fuzzer
// (or the corpus replay, tests/fuzz/replay_main.cpp) reports the input.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/util.hpp"

namespace flashtune::fuzz {

template <class Body>
int verdict(Body&& body) {
  try {
    body();
  } catch (const UsageError&) {
  } catch (const nlohmann::json::exception&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception the CLI does not expect: %s\n", e.what());
    std::abort();
  }
  return 0;
}

inline std::string_view text(const uint8_t* data, size_t size) { return {(const char*)data, size}; }

}  // namespace flashtune::fuzz
