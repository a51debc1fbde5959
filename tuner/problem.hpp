// A problem: one attention shape to tune for (what the kernel is run on, not how).
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace flashtune {

enum class DType { fp32, fp16, bf16 };
const char* to_string(DType);
DType parse_dtype(const std::string&);  // throws UsageError
int dtype_bytes(DType);

struct Problem {
  int batch = 1, heads = 1, seq_q = 1, seq_k = 1, head_dim = 64;
  DType dtype = DType::fp32;
  bool causal = false;
  std::string direction = "fwd";

  // FlashAttention's convention: forward 4*B*H*Sq*Sk*d, halved when causal; backward 2.5x that.
  double flops() const;
  // Lower bound: forward reads Q, K, V and writes O, LSE once; backward reads Q, K, V, O, dO, LSE
  // and writes dQ, dK, dV once.
  double bytes() const;
  // Sequence bucket for selection: the smallest power of two >= max(Sq, Sk).
  int seq_bucket() const;
  std::string str() const;  // "B4 H16 Sq4096 Sk4096 d128 fp32 causal"
  bool operator==(const Problem&) const = default;
};

Problem problem_from_json(const nlohmann::json&);  // validated; throws UsageError
nlohmann::json to_json(const Problem&);

}  // namespace flashtune
