// Spaces (what to sweep) and problem sets (what to sweep it on), read from JSON files.
// Every value is checked against the family's domain before it reaches a name expression,
// so a space file can never inject source.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tuner/compile.hpp"
#include "tuner/family.hpp"

namespace flashtune {

struct Space {
  const Family* family = nullptr;
  std::vector<std::vector<int>> values;  // per Family::params entry
  std::vector<int> head_dims;
  std::vector<bool> causal;
  std::vector<DType> dtypes;

  std::vector<Config> configs() const;    // the cartesian product of values
  std::vector<Variant> variants() const;  // configs x head_dims x causal x dtypes
};

Space space_from_json(const nlohmann::json&);  // throws UsageError naming the problem
Space load_space(const std::string& path);

// {"problems": [ {...}, ... ]} and/or {"grid": {"tokens":16384, "hidden":2048, "seq":[...],
// "head_dim":[...], "causal":[...], "dtype":[...]}} (B = tokens/S, H = hidden/d).
std::vector<Problem> problems_from_json(const nlohmann::json&);
std::vector<Problem> load_problems(const std::string& path);

nlohmann::json read_json_file(const std::string& path);  // one-line UsageError on failure

}  // namespace flashtune
