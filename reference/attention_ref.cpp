#include "reference/attention_ref.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>

namespace flashtune::ref {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Lambda_ij's weight on |s_ij| + |lse_i| (attention_ref.hpp): up to three fp32 roundings of each, in
// the log2 domain (the scale*log2(e) constant, its product with s, lse rounded to fp32 and times
// log2(e)), i.e. ~3 * 1.44 u32 in log2 units = ~3 u32 of relative error of P.
constexpr double kExponentRoundings = 3;

// Rows (or key rows) handed to a thread at a time. Small enough that causal
// shapes, where row cost varies, still balance; large enough to amortise the
// atomic and the per-chunk scratch allocation.
constexpr int64_t kRowsPerChunk = 16;

// Tile height FlashAttention kernels use along Sq; the last tile is where ragged
// (partial) tiles and their masking bugs live.
constexpr int64_t kTileRows = 128;

void check_shape(const Shape& s) {
  if (s.batch <= 0 || s.heads <= 0 || s.seq_q <= 0 || s.seq_k <= 0 || s.head_dim <= 0) {
    throw std::invalid_argument("flashtune::ref: all Shape dimensions must be positive");
  }
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Runs body(begin, end) over [0, n) in chunks, on up to `threads` std::threads.
// Each index is processed by exactly one thread, and each output element is
// written by the one index that owns it, so results do not depend on threads.
template <class Body>
void parallel_for(int64_t n, int threads, Body body) {
  const int64_t n_chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  const int n_workers = static_cast<int>(std::min<int64_t>(resolve_threads(threads), n_chunks));
  std::atomic<int64_t> next_chunk{0};
  auto worker = [&] {
    for (int64_t c = next_chunk++; c < n_chunks; c = next_chunk++) {
      body(c * kRowsPerChunk, std::min(n, (c + 1) * kRowsPerChunk));
    }
  };
  if (n_workers <= 1) {
    worker();
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(n_workers);
  for (int t = 0; t < n_workers; ++t) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
}

double norm2(const float* a, int d) {
  double acc = 0;
  for (int x = 0; x < d; ++x) acc += static_cast<double>(a[x]) * static_cast<double>(a[x]);
  return std::sqrt(acc);
}

double dot(const float* a, const float* b, int d) {
  double acc = 0;
  for (int x = 0; x < d; ++x) acc += static_cast<double>(a[x]) * static_cast<double>(b[x]);
  return acc;
}

// One query row of the forward pass, the single kernel shared by forward,
// forward_rows and backward (so they agree bit for bit).
// row is a flat index into (B*H*Sq); scores is scratch of at least Sk doubles.
// Writes o_row (d) and *lse; with mag_o / logit_o / mag_lse non-null also the row's magnitudes
// (FwdMagnitudes), in a second pass over the keys once O and lse are known.
void forward_row(const Shape& s, const float* q, const float* k, const float* v, int64_t row,
                 double* o_row, double* lse, double* scores, double* mag_o = nullptr,
                 double* logit_o = nullptr, double* mag_lse = nullptr) {
  const int d = s.head_dim;
  const int64_t bh = row / s.seq_q;  // flat (b, h) pair
  const int64_t i = row % s.seq_q;
  const float* q_row = q + row * d;                          // q is (B, H, Sq, d)
  const float* k_head = k + bh * s.seq_k * d;                // k is (B, H, Sk, d)
  const float* v_head = v + bh * s.seq_k * d;                // v is (B, H, Sk, d)
  const double scale = s.softmax_scale();
  const int64_t n_keys = visible_keys(s, i);

  std::fill(o_row, o_row + d, 0.0);
  if (mag_o) std::fill(mag_o, mag_o + d, 0.0);
  if (logit_o) std::fill(logit_o, logit_o + d, 0.0);
  if (mag_lse) *mag_lse = 0;
  if (n_keys == 0) {  // fully masked: FlashAttention-2 convention
    *lse = kInf;
    return;
  }

  // scores[j] = scale * q_i . k_j; track the max for a stable softmax.
  double row_max = -kInf;
  for (int64_t j = 0; j < n_keys; ++j) {
    scores[j] = scale * dot(q_row, k_head + j * d, d);
    row_max = std::max(row_max, scores[j]);
  }

  // o_i = sum_j exp(s_ij - max) v_j / sum_j exp(s_ij - max)
  double row_sum = 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    const double p = std::exp(scores[j] - row_max);
    row_sum += p;
    const float* v_row = v_head + j * d;
    for (int x = 0; x < d; ++x) o_row[x] += p * static_cast<double>(v_row[x]);
  }
  for (int x = 0; x < d; ++x) o_row[x] /= row_sum;
  *lse = row_max + std::log(row_sum);
  if (!mag_o && !logit_o && !mag_lse) return;

  // Magnitudes: P_ij exactly as above, Lambda_ij as in the header.
  const double q_norm = norm2(q_row, d), root_d = std::sqrt(static_cast<double>(d));
  double lse_acc = 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    const double p = std::exp(scores[j] - row_max) / row_sum;
    const double lambda = kExponentRoundings * (std::fabs(scores[j]) + std::fabs(*lse)) + root_d * scale * q_norm * norm2(k_head + j * d, d);
    lse_acc += p * lambda;
    const float* v_row = v_head + j * d;
    for (int x = 0; x < d; ++x) {
      const double vx = static_cast<double>(v_row[x]);
      if (mag_o) mag_o[x] += p * std::fabs(vx);
      if (logit_o) logit_o[x] += p * lambda * std::fabs(vx - o_row[x]);
    }
  }
  if (mag_lse) *mag_lse = lse_acc;
}

}  // namespace

int64_t visible_keys(const Shape& s, int64_t i) {
  if (!s.causal) return s.seq_k;
  const int64_t last = i + (static_cast<int64_t>(s.seq_k) - s.seq_q);
  return std::clamp<int64_t>(last + 1, 0, s.seq_k);
}

double Shape::softmax_scale() const {
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

// Row n's slice of an optional per-row output (d values per row, or one with d = 1).
static double* row_of(double* base, int64_t n, int d) { return base ? base + n * d : nullptr; }

void forward(const Shape& s, const float* q, const float* k, const float* v, double* o,
             double* lse, int threads, const FwdMagnitudes& mag) {
  check_shape(s);
  const int64_t n_rows = static_cast<int64_t>(s.batch) * s.heads * s.seq_q;
  parallel_for(n_rows, threads, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(s.seq_k);
    for (int64_t r = begin; r < end; ++r) {
      forward_row(s, q, k, v, r, o + r * s.head_dim, lse + r, scores.data(), row_of(mag.o_mag, r, s.head_dim),
                  row_of(mag.o_logit, r, s.head_dim), row_of(mag.lse_mag, r, 1));
    }
  });
}

void forward_rows(const Shape& s, const float* q, const float* k, const float* v,
                  std::span<const int64_t> rows, double* o, double* lse, int threads,
                  const FwdMagnitudes& mag) {
  check_shape(s);
  const int64_t n_rows = static_cast<int64_t>(s.batch) * s.heads * s.seq_q;
  for (int64_t r : rows) {
    if (r < 0 || r >= n_rows) {
      throw std::out_of_range("flashtune::ref::forward_rows: row " + std::to_string(r) +
                              " outside [0, " + std::to_string(n_rows) + ")");
    }
  }
  parallel_for(static_cast<int64_t>(rows.size()), threads, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(s.seq_k);
    for (int64_t n = begin; n < end; ++n) {
      forward_row(s, q, k, v, rows[n], o + n * s.head_dim, lse + n, scores.data(), row_of(mag.o_mag, n, s.head_dim),
                  row_of(mag.o_logit, n, s.head_dim), row_of(mag.lse_mag, n, 1));
    }
  });
}

// Two passes so every output row has exactly one writer and all passes parallelise
// over rows, whatever B*H is:
//   pass 1, over query rows i: recompute o_i and lse_i, D_i = dO_i . o_i, and
//           dQ_i = scale * sum_j dS_ij k_j
//   pass 2, over key rows j:   dV_j = sum_i P_ij dO_i,  dK_j = scale * sum_i dS_ij q_i
// with P_ij = exp(s_ij - lse_i), dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - D_i).
// Pass 2 recomputes s_ij instead of storing P (Sq x Sk per head would not fit for
// long sequences), the same trade FlashAttention makes.
void backward(const Shape& s, const float* q, const float* k, const float* v, const float* dout,
              double* dq, double* dk, double* dv, int threads, const BwdMagnitudes& mag) {
  check_shape(s);
  const int d = s.head_dim;
  const double scale = s.softmax_scale();
  const int64_t n_heads = static_cast<int64_t>(s.batch) * s.heads;
  const int64_t n_q_rows = n_heads * s.seq_q;
  const int64_t n_k_rows = n_heads * s.seq_k;

  std::vector<double> lse(n_q_rows);    // (B, H, Sq)
  std::vector<double> delta(n_q_rows);  // D = rowsum(dO * O), (B, H, Sq)

  // Magnitudes (BwdMagnitudes): row norms of Q, dO, O (per query row) and K, V (per key row).
  const bool mq = mag.dq_mag && mag.dq_logit, mk = mag.dk_mag && mag.dk_logit, mv = mag.dv_mag && mag.dv_logit;
  const bool any_mag = mq || mk || mv;
  const double root_d = std::sqrt(static_cast<double>(d));
  std::vector<double> q_norm, do_norm, o_norm, k_norm, v_norm;
  if (any_mag) {
    q_norm.resize(n_q_rows);
    do_norm.resize(n_q_rows);
    o_norm.resize(n_q_rows);
    k_norm.resize(n_k_rows);
    v_norm.resize(n_k_rows);
    parallel_for(n_q_rows, threads, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        q_norm[r] = norm2(q + r * d, d);
        do_norm[r] = norm2(dout + r * d, d);
      }
    });
    parallel_for(n_k_rows, threads, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        k_norm[r] = norm2(k + r * d, d);
        v_norm[r] = norm2(v + r * d, d);
      }
    });
  }

  // Pass 1: per query row.
  parallel_for(n_q_rows, threads, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(s.seq_k);
    std::vector<double> o_row(d);
    for (int64_t r = begin; r < end; ++r) {
      forward_row(s, q, k, v, r, o_row.data(), &lse[r], scores.data());
      const float* do_row = dout + r * d;  // dout is (B, H, Sq, d)
      double D = 0, o2 = 0;
      for (int x = 0; x < d; ++x) {
        D += static_cast<double>(do_row[x]) * o_row[x];
        o2 += o_row[x] * o_row[x];
      }
      delta[r] = D;
      if (any_mag) o_norm[r] = std::sqrt(o2);
      double* mq_row = mq ? mag.dq_mag + r * d : nullptr;
      double* lq_row = mq ? mag.dq_logit + r * d : nullptr;
      if (mq) {
        std::fill(mq_row, mq_row + d, 0.0);
        std::fill(lq_row, lq_row + d, 0.0);
      }

      const int64_t bh = r / s.seq_q;
      const float* q_row = q + r * d;
      const float* k_head = k + bh * s.seq_k * d;
      const float* v_head = v + bh * s.seq_k * d;
      double* dq_row = dq + r * d;  // dq is (B, H, Sq, d)
      std::fill(dq_row, dq_row + d, 0.0);
      // Masked keys (j >= n_keys) have P = 0 and contribute nothing; a fully
      // masked row has n_keys = 0, so its dQ stays 0.
      const int64_t n_keys = visible_keys(s, r % s.seq_q);
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* k_row = k_head + j * d;
        const double sc = scale * dot(q_row, k_row, d);
        const double p = std::exp(sc - lse[r]);
        const double dp = dot(do_row, v_head + j * d, d);
        const double ds = p * (dp - D);
        for (int x = 0; x < d; ++x) dq_row[x] += scale * ds * static_cast<double>(k_row[x]);
        if (mq) {
          const int64_t kr = bh * s.seq_k + j;
          const double w = do_norm[r] * (v_norm[kr] + o_norm[r]);
          const double lambda = kExponentRoundings * (std::fabs(sc) + std::fabs(lse[r])) + root_d * scale * q_norm[r] * k_norm[kr];
          const double a = scale * p * w, b = scale * lambda * std::fabs(ds);
          for (int x = 0; x < d; ++x) {
            const double kx = std::fabs(static_cast<double>(k_row[x]));
            mq_row[x] += a * kx;
            lq_row[x] += b * kx;
          }
        }
      }
    }
  });

  // Pass 2: per key row.
  const int64_t causal_offset = static_cast<int64_t>(s.seq_k) - s.seq_q;
  parallel_for(n_k_rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t kr = begin; kr < end; ++kr) {
      const int64_t bh = kr / s.seq_k;
      const int64_t j = kr % s.seq_k;
      const float* k_row = k + kr * d;  // k is (B, H, Sk, d)
      const float* v_row = v + kr * d;
      double* dk_row = dk + kr * d;     // dk, dv are (B, H, Sk, d)
      double* dv_row = dv + kr * d;
      std::fill(dk_row, dk_row + d, 0.0);
      std::fill(dv_row, dv_row + d, 0.0);
      double* mk_row = mk ? mag.dk_mag + kr * d : nullptr;
      double* lk_row = mk ? mag.dk_logit + kr * d : nullptr;
      double* mv_row = mv ? mag.dv_mag + kr * d : nullptr;
      double* lv_row = mv ? mag.dv_logit + kr * d : nullptr;
      for (double* m : {mk_row, lk_row, mv_row, lv_row})
        if (m) std::fill(m, m + d, 0.0);
      // Key j is visible to queries i >= j - (Sk - Sq) under the causal mask.
      const int64_t first_query = s.causal ? std::max<int64_t>(0, j - causal_offset) : 0;
      for (int64_t i = first_query; i < s.seq_q; ++i) {
        const int64_t r = bh * s.seq_q + i;
        const float* q_row = q + r * d;
        const float* do_row = dout + r * d;
        const double sc = scale * dot(q_row, k_row, d);
        const double p = std::exp(sc - lse[r]);
        const double dp = dot(do_row, v_row, d);
        const double ds = p * (dp - delta[r]);
        for (int x = 0; x < d; ++x) {
          dv_row[x] += p * static_cast<double>(do_row[x]);
          dk_row[x] += scale * ds * static_cast<double>(q_row[x]);
        }
        if (mk || mv) {
          const double lambda = kExponentRoundings * (std::fabs(sc) + std::fabs(lse[r])) + root_d * scale * q_norm[r] * k_norm[kr];
          const double a = scale * p * do_norm[r] * (v_norm[kr] + o_norm[r]), b = scale * lambda * std::fabs(ds);
          const double pl = p * lambda;
          for (int x = 0; x < d; ++x) {
            const double qx = std::fabs(static_cast<double>(q_row[x])), dox = std::fabs(static_cast<double>(do_row[x]));
            if (mk) {
              mk_row[x] += a * qx;
              lk_row[x] += b * qx;
            }
            if (mv) {
              mv_row[x] += p * dox;
              lv_row[x] += pl * dox;
            }
          }
        }
      }
    }
  });
}

std::vector<int64_t> sample_rows(const Shape& s, int64_t max_rows, uint64_t seed) {
  check_shape(s);
  const int64_t n_heads = static_cast<int64_t>(s.batch) * s.heads;
  const int64_t n_rows = n_heads * s.seq_q;
  std::vector<int64_t> out;
  if (max_rows <= 0) return out;
  if (n_rows <= max_rows) {
    out.resize(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) out[r] = r;
    return out;
  }

  // Own mapping from raw 64-bit draws (not std::uniform_int_distribution, whose
  // algorithm is implementation-defined) so a seed picks the same rows everywhere.
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };

  // Fixed rows, in priority order. (b, h) pairs: last, first, middle, one random.
  const int64_t pairs[] = {n_heads - 1, 0, n_heads / 2, uniform(n_heads)};
  const int64_t last_tile_start = (s.seq_q - 1) / kTileRows * kTileRows;
  const int64_t last_tile_rows = s.seq_q - last_tile_start;
  std::vector<int64_t> must;
  for (int64_t bh : pairs) {
    const int64_t base = bh * s.seq_q;
    must.push_back(base + s.seq_q - 1);                             // last row
    must.push_back(base);                                           // first row
    must.push_back(base + last_tile_start);                         // start of last tile
    must.push_back(base + last_tile_start + last_tile_rows / 2);    // middle of last tile
    must.push_back(base + last_tile_start + uniform(last_tile_rows));  // random in last tile
  }

  std::unordered_set<int64_t> chosen;
  for (int64_t r : must) {
    if (static_cast<int64_t>(out.size()) == max_rows) break;
    if (chosen.insert(r).second) out.push_back(r);
  }

  // Top up with uniformly random rows. Terminates because n_rows > max_rows.
  while (static_cast<int64_t>(out.size()) < max_rows) {
    const int64_t r = uniform(n_rows);
    if (chosen.insert(r).second) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace flashtune::ref
