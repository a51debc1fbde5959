// A prepared problem's host side: the seeded inputs in the kernel's format and the float64 reference (with the
// backward's bounds), for a dense problem with generated inputs -- what GpuRunner::prepare computes before it
// uploads, as one value. The worker computes it itself, or reads it from a file the tuner wrote ahead of the
// GPUs' need (tuner/sweep/prepare_ahead.hpp), once per problem for every worker that shares the problem: the
// same function makes both, so a read problem is the computed one bit for bit. Pure host code (no CUDA).
//
// THE FILE. "FTPREP01", the header's length (u64, little-endian), the header (JSON: the problem, seed, max_rows),
// then the arrays in a fixed order with no sizes of their own: every size follows from the problem (its distinct
// units or heads, its sampled rows, recomputed by the reader), so a file is read as data only. A file is untrusted
// input: read_prepared rejects it (and the worker computes the problem itself) unless its size is exactly the
// one the expected problem implies, its header names that problem, seed and max_rows, and it is a regular file.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "worker/inputs.hpp"
#include "worker/validate.hpp"

namespace flashtune {

struct HostPrepared {
  Problem problem;
  uint64_t seed = 0;
  long long max_rows = 0;
  // Forward: q, k, v of `units` distinct units (forward_distinct_units), tiled over the problem's heads on upload.
  // Backward: q, dout of `distinct_heads` distinct query heads, k, v of `groups` distinct kv heads.
  int units = 0, distinct_heads = 0, groups = 0;
  std::vector<uint8_t> q, k, v, dout;  // the kernel's bytes (dtype)
  FwdReference fwd;                    // forward
  BwdReference bwd;                    // backward
  BwdBounds bounds;                    // backward
  std::vector<float> alibi;            // packed backward with ALiBi: the kernel's slopes, which the reference read
};

// True for what the tuner prepares ahead (prepare_host, read_prepared): a dense problem (not varlen, not paged) without
// a mask_mod (its reference needs the predicate run on a GPU: the worker's prepare_mask). File-backed inputs are the
// caller's to exclude.
bool host_preparable(const Problem&);

// A seeded tensor as prepare_host asks for it: n numbers of `stream` in the dtype, from `dist` (generated_input's
// arguments). The tuner passes one that keeps what it made (shared: prepare_host copies the bytes of a tensor
// someone else holds, and moves them out of one it alone holds): problems of one sweep share their streams.
using InputSource = std::function<std::shared_ptr<HostTensor>(size_t n, uint64_t stream, DType, const InputDist&)>;

// The inputs and the reference of `p` (host_preparable) with generated inputs, as the worker's prepare makes
// them; `lap(phase)` after the inputs ("inputs") and after the reference ("reference"); `source` makes the inputs
// (empty: generated_input on `threads` threads).
// A mask_mod problem's `mask`: its predicate materialised as one [Sq, Sk] mask (GpuRunner::prepare_mask; nullptr
// otherwise), the reference's explicit mask.
HostPrepared prepare_host(const Problem& p, uint64_t seed, long long max_rows, int threads = 0,
                          const std::function<void(const char*)>& lap = {}, const InputSource& source = {},
                          const uint8_t* mask = nullptr);

// A packed backward problem's host side (Problem::varlen, direction "bwd"; prepared apart from prepare_host and
// never to a file), as GpuRunner::prepare_varlen_bwd uploads it: q and dout of `distinct_heads` query heads and k and v
// of `groups` kv heads per token (token-major; the problem's heads repeat them, query head h holding distinct head
// h % distinct_heads), the reference of every element (varlen_backward_reference) with its bounds, and with ALiBi
// the kernel's slopes (varlen_backward_alibi_slopes, [B, H]) in `alibi`. `lap` as prepare_host's.
HostPrepared prepare_varlen_backward_host(const Problem& p, uint64_t seed, int threads = 0,
                                          const std::function<void(const char*)>& lap = {});

// The host work prepare_host does for `p` (host_preparable; 0 otherwise), in float64 multiply-adds: its reference's
// (query, key) pairs times head_dim, times 3 for a backward (a forward pass, then the backward's two passes), plus
// its input elements. A measure for ordering problems (the sweep starts the cheapest first), not a time.
double prepare_cost(const Problem& p, long long max_rows);

// Writes `h` to `path` (a new file: written beside it, then renamed over it). Throws on a failed write.
void write_prepared(const std::string& path, const HostPrepared& h);

// `path` as the prepared problem (p, seed, max_rows); false with `why` when it is not exactly that.
bool read_prepared(const std::string& path, const Problem& p, uint64_t seed, long long max_rows, HostPrepared& out,
                   std::string& why);

}  // namespace flashtune
