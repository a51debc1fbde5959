#include "tuner/problem.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tuner/util.hpp"

namespace flashtune {

const char* to_string(DType t) {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::fp32;
  if (s == "fp16") return DType::fp16;
  if (s == "bf16") return DType::bf16;
  throw UsageError("unknown dtype '" + s + "' (expected fp32, fp16 or bf16)");
}

std::string InputDist::str() const {
  if (kind == Kind::normal && scale == 1.0) return "normal";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s*%.6g", kind == Kind::normal ? "normal" : "heavy", scale);
  return buf;
}

InputDist make_input_dist(const std::string& kind, double scale) {
  InputDist d;
  if (kind == "normal") d.kind = InputDist::Kind::normal;
  else if (kind == "heavy") d.kind = InputDist::Kind::heavy;
  else throw UsageError("unknown input distribution '" + kind + "' (expected normal or heavy)");
  if (!std::isfinite(scale) || scale < 1e-3 || scale > 1e3)
    throw UsageError("input scale must be a number in [0.001, 1000], got " + std::to_string(scale));
  d.scale = scale;
  return d;
}

InputDist parse_input_dist(const std::string& s) {
  const auto star = s.find('*');
  if (star == std::string::npos) return make_input_dist(s, 1.0);
  const std::string num = s.substr(star + 1);
  char* end = nullptr;
  const double scale = std::strtod(num.c_str(), &end);
  if (num.empty() || *end) throw UsageError("input distribution '" + s + "' is not <normal|heavy>[*<scale>]");
  return make_input_dist(s.substr(0, star), scale);
}

int dtype_bytes(DType t) { return t == DType::fp32 ? 4 : 2; }

double Problem::flops() const {
  double f = 4.0 * batch * heads * (double)seq_q * seq_k * head_dim;
  if (causal) f /= 2;
  return direction == "bwd" ? 2.5 * f : f;
}

double Problem::bytes() const {
  double e = dtype_bytes(dtype);
  // Per query head: Q, O, dO, dQ and LSE; per kv head: K, V, dK, dV.
  const double bh = (double)batch * heads, bhk = (double)batch * kv_heads();
  if (direction == "bwd")  // read Q, K, V, O, dO, LSE; write dQ, dK, dV
    return bh * (e * head_dim * 5.0 * seq_q + 4.0 * seq_q) + bhk * e * head_dim * 4.0 * seq_k;
  return bh * (e * head_dim * 2.0 * seq_q + 4.0 * seq_q) + bhk * e * head_dim * 2.0 * seq_k;
}

int Problem::seq_bucket() const {
  int s = seq_q > seq_k ? seq_q : seq_k, b = 1;
  while (b < s) b *= 2;
  return b;
}

std::string Problem::str() const {
  std::string s = "B" + std::to_string(batch) + " H" + std::to_string(heads) +
                  (heads_k > 0 ? "/" + std::to_string(heads_k) : std::string()) + " Sq" + std::to_string(seq_q) +
                  " Sk" + std::to_string(seq_k) + " d" + std::to_string(head_dim) + " " + to_string(dtype);
  if (causal) s += " causal";
  if (direction != "fwd") s += " " + direction;
  if (!(inputs == InputDist{})) s += " inputs " + inputs.str();
  return s;
}

static int positive_int(const nlohmann::json& j, const char* key, int max) {
  if (!j.contains(key)) throw UsageError(std::string("problem is missing '") + key + "'");
  const auto& v = j.at(key);
  // The full range is checked before converting (an unsigned 2^32 + 64 is not 64).
  const bool ok = v.is_number_unsigned()  ? v.get<unsigned long long>() >= 1 && v.get<unsigned long long>() <= (unsigned)max
                  : v.is_number_integer() ? v.get<long long>() >= 1 && v.get<long long>() <= max
                                          : false;
  if (!ok)
    throw UsageError(std::string("problem field '") + key + "' must be an integer in 1.." + std::to_string(max) +
                     ", got " + brief(v.dump(), 60));
  return (int)v.get<long long>();
}

// {"distribution": "normal" | "heavy", "scale": X}, both optional.
InputDist input_dist_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw UsageError("problem field 'inputs' must be an object like {\"distribution\": \"heavy\", \"scale\": 5}");
  for (auto& [key, _] : j.items())
    if (key != "distribution" && key != "scale") throw UsageError("unknown inputs field '" + key + "'");
  std::string kind = "normal";
  double scale = 1.0;
  if (j.contains("distribution")) {
    if (!j["distribution"].is_string()) throw UsageError("inputs 'distribution' must be \"normal\" or \"heavy\"");
    kind = j["distribution"].get<std::string>();
  }
  if (j.contains("scale")) {
    if (!j["scale"].is_number()) throw UsageError("inputs 'scale' must be a number, got " + brief(j["scale"].dump(), 60));
    scale = j["scale"].get<double>();
  }
  return make_input_dist(kind, scale);
}

nlohmann::json to_json(const InputDist& d) {
  return {{"distribution", d.kind == InputDist::Kind::normal ? "normal" : "heavy"}, {"scale", d.scale}};
}

Problem problem_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw UsageError("a problem must be a JSON object, got " + brief(j.dump(), 60));
  for (auto& [key, _] : j.items())
    if (key != "batch" && key != "heads" && key != "seq_q" && key != "seq_k" && key != "seq" && key != "head_dim" &&
        key != "dtype" && key != "causal" && key != "direction" && key != "inputs" && key != "heads_k")
      throw UsageError("unknown problem field '" + key + "'");
  Problem p;
  p.batch = positive_int(j, "batch", 1 << 20);
  p.heads = positive_int(j, "heads", 1 << 16);
  if (j.contains("heads_k")) {
    p.heads_k = positive_int(j, "heads_k", 1 << 16);
    if (p.heads % p.heads_k)
      throw UsageError("problem field 'heads_k' (" + std::to_string(p.heads_k) + ") must divide 'heads' (" +
                       std::to_string(p.heads) + ")");
    if (p.heads_k == p.heads) p.heads_k = 0;  // multi-head: one spelling, one store key
  }
  if (j.contains("seq")) {
    p.seq_q = p.seq_k = positive_int(j, "seq", 1 << 20);
  } else {
    p.seq_q = positive_int(j, "seq_q", 1 << 20);
    p.seq_k = positive_int(j, "seq_k", 1 << 20);
  }
  p.head_dim = positive_int(j, "head_dim", 1024);
  if (j.contains("dtype")) {
    if (!j["dtype"].is_string()) throw UsageError("problem field 'dtype' must be a string");
    p.dtype = parse_dtype(j["dtype"].get<std::string>());
  }
  if (j.contains("causal")) {
    if (!j["causal"].is_boolean()) throw UsageError("problem field 'causal' must be true or false");
    p.causal = j["causal"].get<bool>();
  }
  if (j.contains("direction")) {
    if (!j["direction"].is_string() || (j["direction"] != "fwd" && j["direction"] != "bwd"))
      throw UsageError("problem field 'direction' must be \"fwd\" or \"bwd\", got " + brief(j["direction"].dump(), 60));
    p.direction = j["direction"].get<std::string>();
  }
  if (j.contains("inputs")) p.inputs = input_dist_from_json(j["inputs"]);
  return p;
}

nlohmann::json to_json(const Problem& p) {
  nlohmann::json j = {{"batch", p.batch}, {"heads", p.heads}, {"seq_q", p.seq_q}, {"seq_k", p.seq_k},
                      {"head_dim", p.head_dim}, {"dtype", to_string(p.dtype)}, {"causal", p.causal},
                      {"direction", p.direction}, {"inputs", to_json(p.inputs)}};
  if (p.heads_k > 0) j["heads_k"] = p.heads_k;  // only for GQA: multi-head problems keep their keys and shards
  return j;
}

}  // namespace flashtune
