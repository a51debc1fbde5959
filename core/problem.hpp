// A problem: one attention shape to tune for (what the kernel is run on, not how).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/mask_mod.hpp"
#include "templates/attention_params.h"

#ifndef FLASHTUNE_NO_JSON  // a build without nlohmann_json (the runtime alone): no JSON in or out, no key()/str()
#include <nlohmann/json_fwd.hpp>
#endif

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

// A packed variable-length batch (FlashAttention's varlen layout): sequence b owns query tokens
// [cu_q[b], cu_q[b+1]) and keys [cu_k[b], cu_k[b+1]) of token-major tensors, Q and O (total_q, H, d),
// K and V (total_k, Hk, d), LSE (H, total_q). A problem file describes the lengths (README, "Packed
// variable-length batches"):
//   {"lengths": "uniform", "min": A, "max": B, "total_tokens": T, "seed": S}  lengths drawn uniformly
//       in [A, B] (seeded, splitmix64: the same lengths on every machine) until they reach T tokens;
//       the last one is cut so that they sum to exactly T (it may be shorter than A)
//   {"lengths": "fixed", "length": L, "total_tokens": T}   T / L sequences of L, a shorter last one
//   {"seq_lens": [..], "seq_lens_k": [..]}                 given lengths (0 allowed); keys default to
//       the queries' (self-attention)
// Part of a problem's identity: key() is its canonical text (the store's `varlen` column).
struct Varlen {
  std::string lengths;  // "" (a dense problem), "uniform", "fixed" or "list"
  int min = 0, max = 0;  // uniform: bounds; fixed: max is the length
  int total_tokens = 0;  // uniform, fixed
  unsigned long long seed = 0;  // uniform
  std::vector<int> seq_lens_q, seq_lens_k;  // the lengths, derived (list: as given); k == q for self-attention

  bool enabled() const { return !lengths.empty(); }
#ifndef FLASHTUNE_NO_JSON
  // The description as written in problem files, canonical (lists: seq_lens_k only when it differs).
  nlohmann::json description() const;
  std::string key() const;    // compact description() text; "" when dense
  std::string str() const;    // "uniform 256-4096 x16384 seed 0", "[1,17,128]", "[64 seqs, 16384 tokens #1a2b3c4d]"
#endif
  long long total_q() const;  // sum of the query lengths
  long long total_k() const;
  std::vector<int> cu_seqlens_q() const;  // batch + 1 offsets from 0
  std::vector<int> cu_seqlens_k() const;
  bool operator==(const Varlen&) const = default;
};
// A Varlen from its description (the "varlen" object of a problem file), lengths derived and checked:
// at most kMaxVarlenSeqs sequences, lengths in 0..2^20 (uniform and fixed: >= 1), totals in 1..2^24.
// Throws UsageError naming the field.
#ifndef FLASHTUNE_NO_JSON
Varlen varlen_from_json(const nlohmann::json&);
#endif
inline constexpr int kMaxVarlenSeqs = 65535;        // the grid's z dimension: one CTA row per sequence
inline constexpr int kMaxVarlenTokens = 1 << 24;    // per packed tensor
inline constexpr long long kMaxVarlenElements = (1ll << 31) - 1;  // total * heads * head_dim, per tensor

// A paged K/V cache (vLLM's PagedAttention, FlashAttention's flash_attn_with_kvcache(block_table=...)), for
// decoding: K and V are pools of pages, (num_pages, Hk, page_size, d), and sequence b's logical page j (its keys
// [j*page_size, (j+1)*page_size)) is physical page block_table[b][j]; sequence b holds seq_lens_k[b] keys
// (cache_seqlens), so the sequences of a batch differ in length. Q, O and LSE stay dense (B, H, Sq, ...).
// A problem file's "paged" object: {"page_size": P, "seed": S, "seq_lens_k": [..], "layout": "nhd"} (seed,
// lengths and layout optional; without lengths every sequence has seq_k keys). The pages a batch uses,
// sum_b ceil(len_b / P), are numbered in a seeded random order (block_table()), so the physical order is never
// the logical one. "layout": "hnd" (the default) pools (num_pages, Hk, page_size, d), "nhd" FlashAttention's and
// vLLM's (num_pages, page_size, Hk, d) (templates/attention_params.h's PageLayout: the kernels' token-major form).
// Part of a problem's identity: key() is its canonical text (the store's `paged` column; "layout" written only
// for nhd, so that a head-major problem keeps the key it had before layouts existed).
struct Paged {
  int page_size = 0;            // 0: dense (contiguous K/V); else a multiple of 16 in 16..2^20
  unsigned long long seed = 0;  // the page permutation's
  std::vector<int> seq_lens_k;  // per sequence, as given (the cache lengths); empty: every sequence seq_k long
  PageLayout layout = PageLayout::hnd;  // the pools' layout

  bool enabled() const { return page_size > 0; }
#ifndef FLASHTUNE_NO_JSON
  nlohmann::json description() const;  // as written in problem files, canonical
  std::string key() const;             // compact description() text; "" when dense
  std::string str() const;             // "page 256 seed 0", "page 64 seed 3 lens [300,1,4133]", "page 256 seed 0 nhd"
#endif
  // Sequence b's keys (the problem's seq_k when no lengths are given).
  int seq_len(int b, int seq_k) const { return seq_lens_k.empty() ? seq_k : seq_lens_k[(size_t)b]; }
  bool operator==(const Paged&) const = default;
};
// A Paged from its description (the "paged" object of a problem file), checked: page_size a multiple of 16
// in 16..2^20, seed 0..2^53, lengths 0..2^20, at most kMaxVarlenSeqs of them, layout "hnd" or "nhd". Throws
// UsageError naming the field.
#ifndef FLASHTUNE_NO_JSON
Paged paged_from_json(const nlohmann::json&);
#endif
// "hnd", "nhd"; and back (nullopt for another string).
const char* to_string(PageLayout);
std::optional<PageLayout> page_layout_from_string(const std::string&);
// The block table and the pool it indexes, for a batch of `batch` sequences of at most `seq_k` keys.
struct PageTable {
  int max_pages = 0;              // ceil(seq_k / page_size): the table's row stride
  int num_pages = 0;              // pages used by the batch: the pool's first dimension
  std::vector<int> table;         // (batch, max_pages): the physical page of each logical page, -1 past a sequence's
  std::vector<int> cache_seqlens; // (batch): each sequence's keys
};
// Deterministic in (seed, lengths, page size): a Fisher-Yates shuffle of the pages (splitmix64 of the seed), the
// same on every machine, and never the identity when the batch uses two pages or more.
PageTable page_table(const Paged&, int batch, int seq_k);
// Block table entries a problem may have at most (batch x max_pages; 64 MiB of int32).
inline constexpr long long kMaxPageTableEntries = 1ll << 24;

// A mask_mod (issue 32, part 3; docs/kernels.md, "mask_mod"): the user's predicate and the named int32 tensors it
// reads. A problem file's "mask_mod" object: {"predicate": "<body of bool mask(int b, int h, int q_idx, int
// kv_idx)>", "tensors": {"<name>": <values>}}, each tensor's values one of
//   "path.bin"                 raw little-endian int32, 1..2^24 of them (relative to the working directory)
//   [0, 0, 1, ...]             inline, 1..2^20 int32 values
//   {"segments": [L0, L1, ..]} a document id per position: L0 zeros, L1 ones, ... (1..2^24 in all)
//   {"digest": "<32 hex>"}     identity only (a stored row's): no values, so nothing runs it
// Identity: the predicate (normalised, with its tensors' names: MaskPredicate) and each tensor's content digest, so
// that two documents layouts under one predicate are two problems (their work differs); the values ride along.
struct MaskMod {
  MaskPredicate predicate;                 // !enabled(): no mask_mod
  std::vector<std::string> digests;        // per predicate.names entry: content_hash of the int32 values' bytes
  std::vector<std::string> sources;        // per name: the JSON the problem gave (compact), for to_json
  std::vector<std::shared_ptr<const std::vector<int32_t>>> values;  // per name: null where not loaded (a digest)

  bool enabled() const { return predicate.enabled(); }
  bool has_values() const;  // every tensor's values are here
#ifndef FLASHTUNE_NO_JSON
  nlohmann::json description() const;  // {"predicate": ..., "tensors": {name: source}}
  std::string key() const;   // canonical JSON of the identity ({"predicate":...,"tensors":{name: digest}}); "" when none
  std::string str() const;   // "mask_mod 1a2b3c4d5e6f7a8b(doc)"
#endif
  bool operator==(const MaskMod& o) const { return predicate == o.predicate && digests == o.digests; }
};
inline constexpr long long kMaxMaskTensorValues = 1ll << 24;        // a file's or the segments' int32 values
inline constexpr long long kMaxMaskTensorInline = 1ll << 20;        // a JSON list's
#ifndef FLASHTUNE_NO_JSON
// The "mask_mod" object of a problem file (or of a stored key, whose tensors are digests), checked: the predicate by
// make_mask_predicate, the tensors read and digested. Throws UsageError (one line).
MaskMod mask_mod_from_json(const nlohmann::json&);
#endif

// A sequence length's bucket for selection and the runtime's lookup: the smallest power of two >= seq (1 for seq <= 1).
int seq_bucket_of(int seq);

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
  // A packed variable-length batch when varlen.enabled(): batch is then the number of sequences and
  // seq_q, seq_k the longest query and key lengths (the launch grid's), derived from it.
  Varlen varlen;
  // A paged K/V cache when paged.enabled() (forward only, never with varlen): seq_k is then the longest cache
  // length (derived when the lengths are given), batch the number of sequences.
  Paged paged;
  // Sliding-window attention (FlashAttention's window_size): query i sees key j iff
  //   j >= i + (Sk - Sq) - window_left  and  j <= i + (Sk - Sq) + window_right,
  // bottom-right aligned like causal (varlen, paged: to each sequence's own lengths); -1 is unbounded. One
  // spelling per mask (problem_from_json, canonical()): causal is (-1, 0), so a right edge of 0 is `causal`,
  // and causal keeps window_right at -1 (FlashAttention's causal overrides the right edge).
  int window_left = -1, window_right = -1;
  // Logit softcapping (Gemma-2, Grok): the scaled scores s become softcap * tanh(s / softcap) before the
  // softmax; 0 is off.
  double softcap = 0;
  // ALiBi (FlashAttention's alibi_slopes): each query head's scaled (and capped) scores get a bias
  // -slope_h |i + Sk - Sq - j| before the softmax. The slopes are data (the caller's, or seeded inputs: FlashAttention's
  // geometric 2^(-8 (h + 1) / H)), not identity: a problem says only whether it has them.
  bool alibi = false;
  // A user's mask predicate (MaskMod; dense only, never with a window): ANDed with causal.
  MaskMod mask_mod;

  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  bool softcapped() const { return softcap > 0; }
  // The keys query i (of a sequence of seq_q queries and seq_k keys) sees: [first, end), end <= first when
  // none. Causal and the window together; a dense problem's every row when neither.
  std::pair<long long, long long> visible_keys(long long i, long long seq_q, long long seq_k) const;
  // The one spelling of the mask: non-causal window_right 0 becomes causal, causal drops window_right.
  void canonicalize_mask();

  // FlashAttention's convention: forward 4*B*H*Sq*Sk*d, halved when causal; backward 2.5x that.
  // Varlen and paged: the same per sequence, summed (4*H*Lq_b*Lk_b*d, halved when causal).
  // Windowed: the (query, key) pairs the mask leaves visible, counted exactly (a window's work scales with it).
  double flops() const;
  // Lower bound: forward reads Q, K, V and writes O, LSE once; backward reads Q, K, V, O, dO, LSE
  // and writes dQ, dK, dV once. Varlen: of the packed tensors (total tokens). Paged: the keys the sequences hold
  // (sum of their lengths), not the pool's padding past each sequence's last key.
  double bytes() const;
  long long rows_q() const;  // query rows of all heads: B*H*Sq, or total_q*H when varlen
  // Sequence bucket for selection: seq_bucket_of(max(Sq, Sk)).
  int seq_bucket() const;
  int kv_heads() const { return heads_k > 0 ? heads_k : heads; }
  // batch x kv heads: the (sequence, kv head) pairs, a decoding family's second bucket key (results/select.hpp).
  long long batch_kv_heads() const { return (long long)batch * kv_heads(); }
  int group() const { return heads / kv_heads(); }  // query heads per kv head
  // The grouped-query key of the tables and buckets (tuned::Entry::group, results/select.hpp): group() of a
  // grouped-query problem up to 255 (the runtime's plan key holds a byte), else 0: multi-head, or a group no bucket
  // keys (it takes the multi-head ones).
  int group_key() const { return heads_k > 0 && group() > 1 && group() <= 255 ? group() : 0; }
#ifndef FLASHTUNE_NO_JSON
  // "B4 H16 Sq4096 Sk4096 d128 fp32 causal" (GQA: "H32/8"; varlen: "... varlen <Varlen::str>"; paged: "... paged <Paged::str>";
  // "... window 1024,-1", "... softcap 30", "... alibi", "... mask_mod 1a2b3c4d5e6f7a8b(doc)")
  std::string str() const;
#endif
  bool operator==(const Problem&) const = default;
};

// A window edge (-1 or 0..2^30) and a softcap (finite, 0 or in [1e-3, 1e6]), checked as problem fields,
// `run --window L,R` / `--softcap C` and the runtime's ft_mods are; `what` names the field in the one-line UsageError.
int check_window_edge(long long v, const std::string& what);
double check_softcap(double c, const std::string& what);
#ifndef FLASHTUNE_NO_JSON
Problem problem_from_json(const nlohmann::json&);  // validated; throws UsageError
nlohmann::json to_json(const Problem&);
InputDist input_dist_from_json(const nlohmann::json&);  // {"distribution": ..., "scale": ...}
nlohmann::json to_json(const InputDist&);
#endif

}  // namespace flashtune
