// decode_splitkv without a GPU: its partitioning, emulated on the host from the family's own launch
// geometry and workspace size and the traits' functions, against the float64 reference. Each CTA of the
// partial kernel (split, row tile, kv head, batch) is emulated as decode_splitkv.cuh computes it: its
// group rows, its key range cut to what the tile's rows can see, the blocks it skips the mask on, the
// warps' key slices and their merge, the workspace indices it writes; then the combine, reading the
// workspace as the combine kernel does. Outputs and workspace start as NaN (the worker's 0xFF fill), so
// an element read before it is written, or never written, fails. What this cannot check is the device
// code's MMA fragments and pipelines (fa2_mma's, validated on the GPU); it checks the arithmetic around
// them on every committed ragged decoding shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "core/family.hpp"
#include "reference/attention_ref.hpp"
#include "results/select.hpp"
#include "templates/attention_params.h"
#include "templates/decode_splitkv_traits.h"
#include "tuner/space/space.hpp"
#include "tuner/sweep/sweep.hpp"
#include "worker/validate.hpp"

using namespace flashtune;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Outputs {
  std::vector<double> o, lse;
};

// Deterministic inputs in [-2, 2): enough to give every row a distinct softmax.
std::vector<float> inputs(size_t n, unsigned seed) {
  std::vector<float> x(n);
  unsigned s = seed * 2654435761u + 1;
  for (auto& e : x) {
    s = s * 1664525u + 1013904223u;
    e = (float)((s >> 8) & 0xffff) / 16384.f - 2.f;
  }
  return x;
}

// One warp's running softmax over its keys (exact, in double).
struct Running {
  double m = -kInf, l = 0;
  std::vector<double> o;
};

// A paged cache as the worker builds it (worker/gpu_runner.cpp): the logical K/V ((B, Hk, Sk, d), every kv head
// its own) scattered into pools of (num_pages, Hk, page_size, d) pages (Paged::layout nhd: (num_pages, page_size,
// Hk, d)) in the block table's order, the rows of a page past its sequence's length NaN (read, they would show).
struct Pools {
  PageTable t;
  std::vector<float> k, v;
};
Pools make_pools(const Problem& p, const std::vector<float>& k, const std::vector<float>& v) {
  Pools pl{page_table(p.paged, p.batch, p.seq_k), {}, {}};
  const int P = p.paged.page_size, Hk = p.kv_heads(), d = p.head_dim;
  const size_t page_elems = (size_t)Hk * P * d;
  pl.k.assign(pl.t.num_pages * page_elems, NAN);
  pl.v.assign(pl.t.num_pages * page_elems, NAN);
  for (int b = 0; b < p.batch; ++b)
    for (int j = 0; j * P < pl.t.cache_seqlens[b]; ++j) {
      const int page = pl.t.table[(size_t)b * pl.t.max_pages + j], rows = std::min(P, pl.t.cache_seqlens[b] - j * P);
      for (int h = 0; h < Hk; ++h)
        for (int r = 0; r < rows; ++r) {
          const size_t src = (((size_t)b * Hk + h) * p.seq_k + (size_t)j * P + r) * d;
          const size_t dst = (size_t)paged_key_offset(p.paged.layout, page, Hk, P, h, r, d);
          std::copy_n(k.begin() + src, (size_t)d, pl.k.begin() + dst);
          std::copy_n(v.begin() + src, (size_t)d, pl.v.begin() + dst);
        }
    }
  return pl;
}

// pools: a paged problem's cache (k and v are then unused): each CTA's keys are its sequence's own (the cache
// length from the table), a block's rows found through the block table as decode_splitkv.cuh's block_at and
// load_kv find them.
Outputs emulate(const Family& f, const Config& cfg, const Problem& p, const float* q, const float* k, const float* v,
                const Pools* pools = nullptr) {
  const int splits = cfg[0], bn = cfg[1], warps = cfg[2];
  const int B = p.batch, H = p.heads, Hk = p.kv_heads(), Sq = p.seq_q, Sk = p.seq_k, d = p.head_dim;
  const int group = p.group(), group_rows = group * Sq, row_tiles = decode_splitkv_row_tiles(group_rows);
  const int kw = decode_splitkv_keys_per_warp(bn, warps);
  const double scale = 1.0 / std::sqrt((double)d);
  const long long total_rows = (long long)B * H * Sq;

  const std::vector<Launch> ls = f.launches(cfg, p);
  EXPECT_EQ(ls.size(), splits == 1 ? 1u : 2u);
  EXPECT_EQ(ls[0].grid[0], (unsigned)(splits * row_tiles));
  EXPECT_EQ(ls[0].grid[1], (unsigned)Hk);
  EXPECT_EQ(ls[0].grid[2], (unsigned)B);
  const size_t ws_bytes = f.workspace_bytes(cfg, p);
  EXPECT_EQ(ws_bytes, splits == 1 ? size_t{0} : (size_t)splits * total_rows * (d + 1) * 4);
  std::vector<double> ws(ws_bytes / 4, kNaN);
  Outputs out{std::vector<double>((size_t)total_rows * d, kNaN), std::vector<double>((size_t)total_rows, kNaN)};

  // Partial kernel: blockIdx = (x, y, z).
  for (unsigned z = 0; z < ls[0].grid[2]; ++z)
    for (unsigned y = 0; y < ls[0].grid[1]; ++y)
      for (unsigned x = 0; x < ls[0].grid[0]; ++x) {
        const int split = (int)x / row_tiles, row0 = (int)x % row_tiles * kDecodeRows;
        const int rows_here = std::min(kDecodeRows, group_rows - row0);
        const int kv_head = (int)y, batch = (int)z;
        const long long group_first = ((long long)batch * H + (long long)kv_head * group) * Sq;
        const long long bh_kv = (long long)batch * Hk + kv_head;
        const int seq_k = pools ? pools->t.cache_seqlens[batch] : Sk;  // the sequence's keys
        const int k_begin = decode_splitkv_key_begin(seq_k, splits, bn, split);
        const int k_end = std::min(seq_k, decode_splitkv_key_begin(seq_k, splits, bn, split + 1));
        const int causal_offset = seq_k - Sq;
        int kv_end = k_end, full_end = k_end;
        if (p.causal) {
          int i_lo = Sq, i_hi = -1;
          for (int r = 0; r < rows_here; ++r) {
            const int i = (row0 + r) % Sq;
            i_lo = std::min(i_lo, i);
            i_hi = std::max(i_hi, i);
          }
          kv_end = std::min(k_end, i_hi + causal_offset + 1);
          full_end = std::min(k_end, i_lo + causal_offset + 1);
        }
        const int num_kv_blocks = kv_end > k_begin ? ceil_div(kv_end - k_begin, bn) : 0;
        for (int r = 0; r < rows_here; ++r) {  // padding rows past the group are never stored
          const int i = (row0 + r) % Sq;
          const int lim = p.causal ? std::min(kv_end, i + causal_offset + 1) : kv_end;
          const long long row = group_first + row0 + r;
          const float* qr = q + row * d;
          std::vector<Running> wr(warps);
          for (auto& w : wr) w.o.assign(d, 0.0);
          for (int nb = 0; nb < num_kv_blocks; ++nb) {
            const int n0 = k_begin + nb * bn;
            const bool masked = n0 + bn > full_end;
            // Paged: the block's page (block_at): an entry of the sequence's own, the block inside the page.
            int page = -1, row_in_page = 0;
            if (pools) {
              const int P = p.paged.page_size, j = n0 / P;
              EXPECT_LT(j, ceil_div(seq_k, P)) << "a block-table entry past the sequence's pages";
              EXPECT_LE(n0 - j * P + bn, P) << "a block across pages";
              page = pools->t.table[(size_t)batch * pools->t.max_pages + j];
              row_in_page = n0 - j * P;
              EXPECT_GE(page, 0);
            }
            for (int j = n0; j < n0 + bn; ++j) {
              const bool visible = j < lim;
              if (!masked) {  // the kernel applies no mask here: every key must be real and visible
                EXPECT_TRUE(visible && j < seq_k) << "unmasked key " << j << " row " << row;
              }
              if (!visible) continue;
              EXPECT_LT(j, kv_end);  // loaded, not zero-filled
              const long long at = pools ? paged_key_offset(p.paged.layout, page, Hk, p.paged.page_size, kv_head,
                                                            row_in_page + (j - n0), d)
                                         : (bh_kv * Sk + j) * d;
              const float* kj = (pools ? pools->k.data() : k) + at;
              const float* vj = (pools ? pools->v.data() : v) + at;
              double s = 0;
              for (int c = 0; c < d; ++c) s += (double)qr[c] * kj[c];
              s *= scale;
              Running& w = wr[(j - n0) / kw];
              const double m_new = std::max(w.m, s), alpha = std::exp(w.m - m_new), pj = std::exp(s - m_new);
              w.l = w.l * alpha + pj;
              for (int c = 0; c < d; ++c) w.o[c] = w.o[c] * alpha + pj * vj[c];
              w.m = m_new;
            }
          }
          // The warps' merge.
          double mx = -kInf;
          for (const auto& w : wr) mx = std::max(mx, w.m);
          double lsum = 0;
          for (const auto& w : wr) lsum += mx == -kInf ? 0.0 : w.l * std::exp(w.m - mx);
          std::vector<double> o(d, 0.0);
          for (const auto& w : wr)
            if (lsum > 0 && w.m > -kInf)
              for (int c = 0; c < d; ++c) o[c] += std::exp(w.m - mx) / lsum * w.o[c];
          const double lse = lsum > 0 ? mx + std::log(lsum) : (splits == 1 ? kInf : -kInf);
          if (splits == 1) {
            std::copy(o.begin(), o.end(), out.o.begin() + row * d);
            out.lse[row] = lse;
          } else {
            std::copy(o.begin(), o.end(), ws.begin() + ((long long)split * total_rows + row) * d);
            ws[(size_t)splits * total_rows * d + row * splits + split] = lse;
          }
        }
      }
  if (splits == 1) return out;

  // Combine kernel: a warp per (batch, head, row).
  EXPECT_EQ(ls[1].threads, (unsigned)decode_splitkv_combine_threads());
  for (unsigned z = 0; z < ls[1].grid[2]; ++z)
    for (unsigned x = 0; x < ls[1].grid[0]; ++x)
      for (int warp = 0; warp < kDecodeCombineWarps; ++warp) {
        const int rb = (int)x * kDecodeCombineWarps + warp;
        if (rb >= H * Sq) continue;
        const long long row = (long long)z * H * Sq + rb;
        const double* lse_s = ws.data() + (size_t)splits * total_rows * d + row * splits;
        double mx = -kInf;
        for (int s = 0; s < splits; ++s) mx = std::max(mx, lse_s[s]);  // NaN (unwritten) -> caught below
        for (int s = 0; s < splits; ++s) EXPECT_FALSE(std::isnan(lse_s[s])) << "LSE_s unwritten, split " << s;
        std::vector<double> o(d, 0.0);
        double lse = kInf;
        if (mx != -kInf) {
          double sum = 0;
          for (int s = 0; s < splits; ++s) sum += std::exp(lse_s[s] - mx);
          for (int s = 0; s < splits; ++s) {
            const double w = std::exp(lse_s[s] - mx);
            if (w > 0)
              for (int c = 0; c < d; ++c) o[c] += w * ws[((size_t)s * total_rows + row) * d + c];
          }
          for (auto& e : o) e /= sum;
          lse = mx + std::log(sum);
        }
        std::copy(o.begin(), o.end(), out.o.begin() + row * d);
        out.lse[row] = lse;
      }
  return out;
}

}  // namespace

TEST(DecodeSplitkv, EmulatedPartitionMatchesReferenceOnRaggedShapes) {
  const Family& f = find_family("decode_splitkv");
  const std::vector<Problem> problems =
      load_problems(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/problems/ragged_decode.json");
  ASSERT_FALSE(problems.empty());
  // SPLITS 1 (no combine), a few splits, more splits than blocks (empty splits), splits that do not divide the
  // blocks (uneven by one block); 2 to 8 warps' key slices of 16 to 128 keys; the smallest and largest blocks.
  const std::vector<Config> configs = {{1, 64, 4, 2},    {2, 32, 2, 1}, {16, 64, 4, 2}, {128, 256, 8, 2},
                                       {8, 256, 2, 1},   {9, 32, 2, 1}, {33, 64, 4, 2}};
  int cases = 0;
  for (const Problem& p : problems) {
    const size_t nq = (size_t)p.batch * p.heads * p.seq_q * p.head_dim;
    const size_t nk = (size_t)p.batch * p.kv_heads() * p.seq_k * p.head_dim;
    const auto q = inputs(nq, 1), k = inputs(nk, 2), v = inputs(nk, 3);
    ref::Shape shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal};
    shape.heads_k = p.heads_k;
    std::vector<double> o_ref(nq), lse_ref((size_t)p.batch * p.heads * p.seq_q);
    ref::forward(shape, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data());
    for (const Config& c : configs) {
      ASSERT_EQ(f.check(c, p.head_dim), nullptr) << f.config_string(c);
      SCOPED_TRACE(p.str() + (p.causal ? "" : " non-causal") + " " + f.config_string(c));
      const Outputs got = emulate(f, c, p, q.data(), k.data(), v.data());
      double worst = 0;
      for (size_t e = 0; e < nq; ++e) worst = std::max(worst, std::isnan(got.o[e]) ? kInf : std::abs(got.o[e] - o_ref[e]));
      EXPECT_LT(worst, 1e-9) << "O";
      for (size_t r = 0; r < lse_ref.size(); ++r) {
        if (std::isinf(lse_ref[r])) EXPECT_EQ(got.lse[r], lse_ref[r]) << "row " << r;  // +inf: no visible key
        else EXPECT_NEAR(got.lse[r], lse_ref[r], 1e-9) << "row " << r;
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, (int)(problems.size() * configs.size()));
}

// The paged form, emulated on every committed ragged paged problem with the configs whose BLOCK_N divides its
// page size: per-sequence key ranges and causal limits, blocks found through the seeded block table (never an
// entry past a sequence's pages, never a block across pages, never a key past the cache length: those rows
// are NaN), against the reference on the logical cache (paged_forward_reference, what the worker validates).
// Both pool layouts: head-major pages and token-major ones (FlashAttention's and vLLM's), each read where its
// offsets put a key.
TEST(DecodeSplitkv, EmulatedPagedFormMatchesReference) {
  const Family& f = find_family("decode_splitkv");
  const std::vector<Problem> problems =
      load_problems(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/problems/ragged_decode_paged.json");
  ASSERT_FALSE(problems.empty());
  const std::vector<Config> configs = {{1, 32, 2, 2}, {2, 32, 2, 1}, {16, 64, 4, 2},   {9, 64, 2, 1},
                                       {33, 128, 8, 1}, {8, 256, 2, 1}, {128, 256, 8, 2}};
  int cases = 0;
  std::set<int> page_sizes;
  bool empty_sequence = false;
  for (const Problem& problem : problems)
  for (PageLayout layout : {PageLayout::hnd, PageLayout::nhd}) {
    Problem p = problem;
    p.paged.layout = layout;
    ASSERT_TRUE(p.paged.enabled()) << p.str();
    page_sizes.insert(p.paged.page_size);
    const int bhk = p.batch * p.kv_heads();
    const size_t nq = (size_t)p.rows_q() * p.head_dim, nk = (size_t)bhk * p.seq_k * p.head_dim;
    const auto q = inputs(nq, 1), k = inputs(nk, 2), v = inputs(nk, 3);
    const Pools pools = make_pools(p, k, v);
    for (int len : pools.t.cache_seqlens) empty_sequence |= len == 0;
    ref::Shape shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal};
    std::vector<int64_t> rows(shape.q_rows());
    for (size_t r = 0; r < rows.size(); ++r) rows[r] = (int64_t)r;
    const FwdReference ref = paged_forward_reference(p, bhk, q.data(), k.data(), v.data(), rows);
    for (const Config& c : configs) {
      if (f.paged_check(c, p.paged.page_size)) continue;
      SCOPED_TRACE(p.str() + (p.causal ? "" : " non-causal") + " " + f.config_string(c));
      const Outputs got = emulate(f, c, p, q.data(), nullptr, nullptr, &pools);
      double worst = 0;
      for (size_t e = 0; e < nq; ++e) worst = std::max(worst, std::isnan(got.o[e]) ? kInf : std::abs(got.o[e] - ref.o[e]));
      EXPECT_LT(worst, 1e-9) << "O";
      for (size_t r = 0; r < ref.lse.size(); ++r) {
        if (std::isinf(ref.lse[r])) EXPECT_EQ(got.lse[r], ref.lse[r]) << "row " << r;  // +inf: no visible key
        else EXPECT_NEAR(got.lse[r], ref.lse[r], 1e-9) << "row " << r;
      }
      ++cases;
    }
  }
  EXPECT_GE(cases, (int)problems.size() * 4);
  EXPECT_TRUE(empty_sequence);  // the set holds a sequence without keys
  EXPECT_GE(page_sizes.size(), 4u);
}

TEST(DecodeSplitkv, GeometryAndConstraints) {
  const Family& f = find_family("decode_splitkv");
  EXPECT_TRUE(f.gqa);
  EXPECT_TRUE(f.workspace_written);
  // Each warp needs 16 keys of a block at least.
  EXPECT_EQ(f.check({16, 64, 4, 2}, 128), nullptr);
  ASSERT_NE(f.check({16, 32, 4, 2}, 128), nullptr);
  EXPECT_NE(std::string(f.check({16, 32, 4, 2}, 128)).find("16*WARPS"), std::string::npos);
  ASSERT_NE(f.check({16, 64, 4, 2}, 96), nullptr);
  // d = 256 with 128 keys per warp: 192 accumulators, the most allowed (its shared memory is over every limit).
  EXPECT_EQ(f.check({16, 256, 2, 1}, 256), nullptr);
  EXPECT_EQ(f.check({16, 128, 2, 1}, 256), nullptr);
  // Splits share the blocks out evenly: whole blocks, one block apart at most, in order, covering every key.
  EXPECT_EQ(decode_splitkv_key_begin(4096, 16, 64, 1), 256);  // 64 blocks, 4 a split
  EXPECT_EQ(decode_splitkv_key_begin(32768, 9, 256, 1), 14 * 256);  // 128 blocks: 14 or 15 a split
  EXPECT_EQ(decode_splitkv_key_begin(32768, 9, 256, 9), 32768);
  for (int sk : {1, 255, 256, 4133, 32768, 131072})
    for (int splits : {1, 2, 9, 17, 33, 66, 128})
      for (int bn : {32, 256}) {
        const int nb = ceil_div(sk, bn);
        EXPECT_EQ(decode_splitkv_key_begin(sk, splits, bn, 0), 0);
        EXPECT_GE(decode_splitkv_key_begin(sk, splits, bn, splits), sk);
        for (int s = 0; s < splits; ++s) {
          const int b0 = decode_splitkv_key_begin(sk, splits, bn, s), b1 = decode_splitkv_key_begin(sk, splits, bn, s + 1);
          EXPECT_EQ(b0 % bn, 0);
          EXPECT_GE(b1 - b0, nb / splits * bn) << sk << " " << splits << " " << bn << " " << s;
          EXPECT_LE(b1 - b0, (nb / splits + 1) * bn) << sk << " " << splits << " " << bn << " " << s;
        }
      }
  // Llama-3 8B decoding at B = 1: 8 kv heads alone are 8 CTAs; SPLITS multiplies them.
  Problem p;
  p.batch = 1;
  p.heads = 32;
  p.heads_k = 8;
  p.seq_q = 1;
  p.seq_k = 4096;
  p.head_dim = 128;
  p.dtype = DType::bf16;
  auto ls = f.launches({16, 64, 4, 2}, p);
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0].grid[0] * ls[0].grid[1] * ls[0].grid[2], 128u);
  EXPECT_EQ(ls[0].threads, 128u);
  EXPECT_EQ(ls[1].grid[0] * ls[1].grid[2], 8u);  // 32 rows, 4 a CTA
  // 16 rows a CTA: Hq 64 on 8 kv heads with Sq 4 is 32 group rows, two row tiles.
  p.heads = 64;
  p.seq_q = 4;
  EXPECT_EQ(f.launches({1, 64, 4, 2}, p).at(0).grid[0], 2u);
  EXPECT_EQ(f.launches({1, 64, 4, 2}, p).size(), 1u);  // one split: no combine, no workspace
  EXPECT_EQ(f.workspace_bytes({1, 64, 4, 2}, p), 0u);
  EXPECT_EQ(f.workspace_bytes({4, 64, 4, 2}, p), 4u * 1 * 64 * 4 * 129 * 4);
  // Shared memory: Q tile + max(K/V stages, the warps' fp32 O tiles) + per-warp row statistics.
  EXPECT_EQ(decode_splitkv_smem_bytes(128, 64, 4, 2), 16 * 256 + 2 * 2 * 64 * 256 + 2 * 4 * 4 * 16);  // swizzled rows: 2*D bytes
  EXPECT_EQ(decode_splitkv_smem_bytes(256, 32, 2, 1), 16 * 512 + 2 * 16 * 264 * 4 + 2 * 4 * 2 * 16);  // O tiles win
}

// The query-length range: decode_splitkv serves Sq <= max_seq_q. A space matches no problem past it
// (tune), selection never picks a row past it (a store imported from elsewhere), and the shapes the
// committed problem sets give it are all inside it.
TEST(DecodeSplitkv, ServesDecodingShapesOnly) {
  const Family& f = find_family("decode_splitkv");
  ASSERT_GT(f.max_seq_q, 0);
  for (const char* file : {"ragged_decode.json", "decode_bf16.json", "ragged_decode_paged.json", "decode_paged_bf16.json",
                           "ragged_decode_paged_nhd.json", "decode_paged_nhd_bf16.json"})
    for (const Problem& p : load_problems(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/problems/" + file))
      EXPECT_EQ(f.shape_reason(p), "") << file << " " << p.str();
  Problem p;
  p.batch = 2, p.heads = 8, p.heads_k = 2, p.seq_k = 4096, p.head_dim = 128, p.dtype = DType::bf16;
  p.seq_q = f.max_seq_q;
  EXPECT_EQ(f.shape_reason(p), "");
  p.seq_q = f.max_seq_q + 1;
  EXPECT_NE(f.shape_reason(p).find("Sq <= " + std::to_string(f.max_seq_q)), std::string::npos) << f.shape_reason(p);
  // Families without a range serve any Sq; a GQA problem only where gqa.
  EXPECT_EQ(find_family("fa2_mma").shape_reason(p), "");
  EXPECT_NE(find_family("fa2_simt").shape_reason(p).find("grouped-query"), std::string::npos);

  const Space space = load_space(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/decode_splitkv.json");
  Problem decode = p, prefill = p;
  decode.seq_q = 1;
  prefill.seq_q = prefill.seq_k;
  EXPECT_FALSE(variants_for(space, {decode}).empty());
  EXPECT_TRUE(variants_for(space, {prefill}).empty());

  // A row past the range (as an import could bring) never becomes a bucket's pick; one inside does.
  auto row = [&](const Problem& q, double tflops) {
    ResultRecord r;
    r.family = f.name, r.direction = f.direction, r.config = f.config_string(f.default_config);
    r.problem = q, r.status = "ok", r.reps = kFullTimingReps, r.tflops = tflops;
    r.device_name = "GPU A", r.arch = "sm_90";
    return r;
  };
  decode.heads_k = prefill.heads_k = 0;
  EXPECT_TRUE(best_per_bucket({row(prefill, 500)}).empty());
  const auto choices = best_per_bucket({row(decode, 1), row(prefill, 500)});
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].tflops, 1);

  // Grouped-query rows make a bucket for the decoding family (the shapes it is tuned on: decode_bf16.json
  // is all GQA), keyed by batch x kv heads and not by the group; a general family's GQA row makes one keyed by
  // its group (Select.GroupedQueryBucketsByGroup), its multi-head row one without.
  Problem gqa = decode;
  gqa.heads_k = 2;
  const auto gqa_choices = best_per_bucket({row(gqa, 3)});
  ASSERT_EQ(gqa_choices.size(), 1u);
  EXPECT_EQ(gqa_choices[0].family, f.name);
  EXPECT_DOUBLE_EQ(gqa_choices[0].tflops, 3);
  EXPECT_EQ(gqa_choices[0].group, 0);
  ResultRecord general = row(gqa, 3);
  const Family& g = find_family("fa2_mma");
  ASSERT_EQ(g.max_seq_q, 0);
  general.family = g.name, general.config = g.config_string(g.default_config);
  const auto grouped = best_per_bucket({general});
  ASSERT_EQ(grouped.size(), 1u);
  EXPECT_EQ(grouped[0].group, gqa.heads / gqa.heads_k);
  EXPECT_EQ(grouped[0].batch_heads, 0);
  general.problem.heads_k = 0;
  const auto mha = best_per_bucket({general});
  ASSERT_EQ(mha.size(), 1u);
  EXPECT_EQ(mha[0].group, 0);
}
