// A problem: one attention shape to tune for (what the kernel is run on, not how).
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace flashtune {

enum class DType { fp32, fp16, bf16 };
const char* to_string(DType);
DType parse_dtype(const std::string&);  // throws UsageError
int dtype_bytes(DType);

// What a problem's generated inputs are drawn from: seeded standard normal numbers times `scale`
// (trained models' q and k reach |x| of 10-30, which makes the softmax near one-hot), or a
// heavy-tailed Student-t (3 degrees of freedom) times `scale`. Part of a result's identity.
struct InputDist {
  enum class Kind { normal, heavy };
  Kind kind = Kind::normal;
  double scale = 1.0;
  // "normal" for the default; otherwise "<kind>*<scale>" ("normal*30", "heavy*1").
  std::string str() const;
  bool operator==(const InputDist&) const = default;
};
// Inverse of InputDist::str(); throws UsageError naming the problem.
InputDist parse_input_dist(const std::string&);
// --input-dist NAME and --input-scale X (or a problem file's "inputs" object) as one InputDist;
// scale must be finite, in [1e-3, 1e3]. Throws UsageError.
InputDist make_input_dist(const std::string& kind, double scale);

struct Problem {
  int batch = 1, heads = 1, seq_q = 1, seq_k = 1, head_dim = 64;
  DType dtype = DType::fp32;
  bool causal = false;
  std::string direction = "fwd";
  InputDist inputs;  // what the generated inputs are drawn from
  int heads_k = 0;   // grouped-query attention: K and V have heads_k heads (a divisor of heads); 0: heads
  // Not the problem but the device it is launched on: its SM count, for the launch geometry that depends
  // on it (a persistent grid: Family::launches). Whoever launches sets it on a copy just before calling
  // `launches` (the sweep's GpuSession, the runtime library), from the device attribute; everywhere else
  // it stays 0, "unknown", and such a family falls back to its plain grid. So the identity of a problem
  // (==, str, JSON, the store's columns) never sees it. Chosen over an argument of `launches`: one
  // family needs it, and every family's launches and every caller stay as they are.
  int sm_count = 0;

  // FlashAttention's convention: forward 4*B*H*Sq*Sk*d, halved when causal; backward 2.5x that.
  double flops() const;
  // Lower bound: forward reads Q, K, V and writes O, LSE once; backward reads Q, K, V, O, dO, LSE
  // and writes dQ, dK, dV once.
  double bytes() const;
  // Sequence bucket for selection: the smallest power of two >= max(Sq, Sk).
  int seq_bucket() const;
  int kv_heads() const { return heads_k > 0 ? heads_k : heads; }
  int group() const { return heads / kv_heads(); }  // query heads per kv head
  std::string str() const;  // "B4 H16 Sq4096 Sk4096 d128 fp32 causal" (GQA: "H32/8")
  bool operator==(const Problem&) const = default;
};

Problem problem_from_json(const nlohmann::json&);  // validated; throws UsageError
nlohmann::json to_json(const Problem&);
InputDist input_dist_from_json(const nlohmann::json&);  // {"distribution": ..., "scale": ...}
nlohmann::json to_json(const InputDist&);

}  // namespace flashtune
