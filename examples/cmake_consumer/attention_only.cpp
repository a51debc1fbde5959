// The smallest consumer: flashtune::attention alone (no tuner, so no SQLite3, NVRTC or JSON headers at
// build time). One fp32 causal forward and backward on a ragged shape; O and dV checked against a
// float64 computation written out here, and the explain() line of each call.
// Exit codes: 0 passed, or no GPU (one line "no GPU: <reason>"); 1 a check failed.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "flashtune/attention.hpp"

namespace rt = flashtune::runtime;

int main() {
  std::printf("flashtune %s (attention only)\n", rt::version().c_str());
  if (rt::Status s = rt::device_available(); !s) {
    std::printf("no GPU: %s\n", s.message.c_str());
    return 0;
  }
  const int B = 1, H = 2, Sq = 65, Sk = 100, D = 64;
  const size_t nq = (size_t)B * H * Sq * D, nk = (size_t)B * H * Sk * D;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> q = random(nq), k = random(nk), v = random(nk), dout = random(nq);

  // Device buffers: q, k, v, dout in; o, lse, dq, dk, dv out.
  float *dq_in, *dk_in, *dv_in, *ddout, *d_o, *d_lse, *d_dq, *d_dk, *d_dv;
  const std::pair<float**, size_t> buffers[] = {{&dq_in, nq}, {&dk_in, nk}, {&dv_in, nk}, {&ddout, nq}, {&d_o, nq},
                                                {&d_lse, (size_t)B * H * Sq}, {&d_dq, nq}, {&d_dk, nk}, {&d_dv, nk}};
  for (auto [p, n] : buffers)
    if (cudaMalloc(p, n * sizeof(float)) != cudaSuccess) return std::printf("FAIL cudaMalloc\n"), 1;
  cudaMemcpy(dq_in, q.data(), nq * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dk_in, k.data(), nk * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dv_in, v.data(), nk * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(ddout, dout.data(), nq * 4, cudaMemcpyHostToDevice);

  rt::ForwardArgs f;
  f.batch = B, f.heads = H, f.seq_q = Sq, f.seq_k = Sk, f.head_dim = D, f.dtype = FT_FP32, f.causal = true;
  f.q = rt::Tensor::bhsd(dq_in, B, H, Sq, D), f.k = rt::Tensor::bhsd(dk_in, B, H, Sk, D);
  f.v = rt::Tensor::bhsd(dv_in, B, H, Sk, D), f.o = rt::Tensor::bhsd(d_o, B, H, Sq, D), f.lse = d_lse;
  std::printf("fwd: %s\n", rt::explain(f).c_str());
  if (rt::Status s = rt::forward(f); !s) return std::printf("FAIL forward: %s\n", s.message.c_str()), 1;
  rt::BackwardArgs b;
  b.batch = B, b.heads = H, b.seq_q = Sq, b.seq_k = Sk, b.head_dim = D, b.dtype = FT_FP32, b.causal = true;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.dout = rt::Tensor::bhsd(ddout, B, H, Sq, D), b.lse = d_lse;
  b.dq = rt::Tensor::bhsd(d_dq, B, H, Sq, D), b.dk = rt::Tensor::bhsd(d_dk, B, H, Sk, D);
  b.dv = rt::Tensor::bhsd(d_dv, B, H, Sk, D);
  std::printf("bwd: %s\n", rt::explain(b).c_str());
  if (rt::Status s = rt::backward(b); !s) return std::printf("FAIL backward: %s\n", s.message.c_str()), 1;
  std::vector<float> o(nq), dv(nk);
  cudaMemcpy(o.data(), d_o, nq * 4, cudaMemcpyDeviceToHost);  // synchronises: the calls ran on stream 0
  cudaMemcpy(dv.data(), d_dv, nk * 4, cudaMemcpyDeviceToHost);

  // float64: P = softmax(scale Q K^T), causal bottom-right (query i sees keys j <= i + Sk - Sq);
  // O = P V, dV = P^T dO.
  const double scale = 1 / std::sqrt((double)D);
  double err_o = 0, err_dv = 0;
  std::vector<double> dv_ref(nk, 0.0);
  for (int h = 0; h < B * H; ++h)
    for (int i = 0; i < Sq; ++i) {
      const float* qi = &q[((size_t)h * Sq + i) * D];
      std::vector<double> p(Sk, 0.0);
      double m = -INFINITY, sum = 0;
      const int last = i + Sk - Sq;
      for (int j = 0; j <= last && j < Sk; ++j) {
        double s = 0;
        for (int c = 0; c < D; ++c) s += (double)qi[c] * k[((size_t)h * Sk + j) * D + c];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      for (int j = 0; j <= last && j < Sk; ++j) sum += p[j] = std::exp(p[j] - m);
      for (int c = 0; c < D; ++c) {
        double acc = 0;
        for (int j = 0; j <= last && j < Sk; ++j) acc += p[j] / sum * v[((size_t)h * Sk + j) * D + c];
        err_o = std::max(err_o, std::fabs(acc - o[((size_t)h * Sq + i) * D + c]));
      }
      for (int j = 0; j <= last && j < Sk; ++j)
        for (int c = 0; c < D; ++c) dv_ref[((size_t)h * Sk + j) * D + c] += p[j] / sum * dout[((size_t)h * Sq + i) * D + c];
    }
  for (size_t i = 0; i < nk; ++i) err_dv = std::max(err_dv, std::fabs(dv_ref[i] - dv[i]));
  const bool ok = err_o < 1e-4 && err_dv < 1e-4;  // fp32 kernels: errors of order 1e-6 here
  std::printf("%s fp32 causal B%d H%d Sq%d Sk%d d%d: max |O - ref| %.2e, max |dV - ref| %.2e\n", ok ? "PASS" : "FAIL",
              B, H, Sq, Sk, D, err_o, err_dv);
  for (float* p : {dq_in, dk_in, dv_in, ddout, d_o, d_lse, d_dq, d_dk, d_dv}) cudaFree(p);
  return ok ? 0 : 1;
}
