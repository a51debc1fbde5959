// bench_validate [THREADS]: the worker's CPU work per evaluation and per problem at the multi-GPU sweep's
// largest sizes, on synthetic data, without a GPU: the backward's comparison of 1x32x16384x64 bf16 dQ, dK, dV
// (33.5 M elements each, one distinct head) and the forward's scan of a 16x32x1024x64 bf16 O, each fast
// (worker/validate.cpp) and straightforward (validate_plain.hpp: what the worker did before); and the
// seeded input generation (worker/inputs.hpp) of one such tensor. Prints ms and ns per element; THREADS
// (default 1) is the fast paths' thread budget. Not a test: run it by hand (build/tests/bench_validate).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "core/dtype_convert.hpp"
#include "tests/validate_plain.hpp"
#include "worker/inputs.hpp"
#include "worker/validate.hpp"

using namespace flashtune;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The fastest of `reps` timings of f(), in ms.
template <class F>
double best_ms(int reps, F f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, ms_since(t0));
  }
  return best;
}

void report(const char* what, double ms, size_t elements) {
  std::printf("%-44s %8.1f ms  %6.2f ns/element\n", what, ms, ms * 1e6 / (double)elements);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  std::printf("fast paths on %d thread(s); the straightforward ones on one\n", threads);
  std::mt19937 gen(1);
  std::normal_distribution<double> nd;
  const DType t = DType::bf16;

  // Backward: one distinct head of 16384 x 64 tiled over 32 heads; outputs within their bounds except a few.
  const size_t per_head = 16384 * 64, n = 32 * per_head;
  Problem p;
  p.batch = 1, p.heads = 32, p.seq_q = p.seq_k = 16384, p.head_dim = 64, p.dtype = t, p.direction = "bwd";
  BwdReference ref;
  ref.shape = ref::Shape{1, 1, 16384, 16384, 64};
  for (auto* v : {&ref.dq, &ref.dk, &ref.dv}) {
    v->resize(per_head);
    for (double& x : *v) x = nd(gen);
  }
  for (auto* v : {&ref.dq_mag, &ref.dk_mag, &ref.dv_mag, &ref.dq_logit, &ref.dk_logit, &ref.dv_logit}) {
    v->resize(per_head);
    for (double& x : *v) x = 1 + std::fabs(nd(gen));
  }
  ref.max_abs_q = ref.max_abs_k = ref.max_abs_do = ref.max_abs_v = 4;
  std::vector<std::vector<uint8_t>> out(3);
  const std::vector<double>* wants[] = {&ref.dq, &ref.dk, &ref.dv};
  for (int g = 0; g < 3; ++g) {
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = (float)((*wants[g])[i % per_head] * (1 + 1e-3 * (double)((i * 7) % 5)));
    out[g] = to_device_format(f, t);
  }
  const OutputTensor dq{out[0].data(), n, t}, dk{out[1].data(), n, t}, dv{out[2].data(), n, t};
  BwdBounds bounds;
  const double bounds_ms = best_ms(3, [&] { bounds = backward_bounds(p, ref); });
  Verdict fast, plain;
  const double fast_ms = best_ms(3, [&] { fast = validate_backward(p, ref, bounds, dq, dk, dv, threads); });
  const double plain_ms = best_ms(1, [&] { plain = plain::validate_backward(p, ref, bounds, dq, dk, dv); });
  auto same = [&] { return fast.error == plain.error && fast.mse == plain.mse ? "equal" : "DIFFER"; };
  std::printf("backward 3 x %zu bf16 (verdicts %s: %s)\n", n, same(), fast.error.substr(0, 60).c_str());
  report("  bounds, once per problem", bounds_ms, 3 * per_head);
  report("  straightforward (convert, then add)", plain_ms, 3 * n);
  report("  fast", fast_ms, 3 * n);

  // Forward: every O element scanned, 512 rows of 64 compared.
  Problem pf = p;
  pf.batch = 16, pf.seq_q = pf.seq_k = 1024, pf.direction = "fwd";
  FwdReference fr;
  fr.shape = ref::Shape{16, 32, 1024, 1024, 64};
  for (int r = 0; r < 512; ++r) fr.rows.push_back((int64_t)r * 1021);
  fr.o.assign(512 * 64, 0.5), fr.o_mag.assign(512 * 64, 1.0), fr.o_logit.assign(512 * 64, 1.0);
  fr.lse.assign(512, 3.0), fr.lse_mag.assign(512, 1.0), fr.max_abs_v = 4;
  std::vector<float> of(n, 0.5f), lse(16 * 32 * 1024, 3.0f);
  const std::vector<uint8_t> ob = to_device_format(of, t);
  const OutputTensor o{ob.data(), n, t}, l{lse.data(), lse.size(), DType::fp32};
  const double ffast = best_ms(3, [&] { fast = validate_forward(pf, fr, o, l, threads); });
  const double fplain = best_ms(1, [&] { plain = plain::validate_forward(pf, fr, o, l); });
  std::printf("forward O %zu bf16 (verdicts %s)\n", n, same());
  report("  straightforward (convert, then scan)", fplain, n);
  report("  fast", ffast, n);

  // Inputs: one 33.5 M-element bf16 tensor, as the forward's prepare makes three.
  const double gen_ms = best_ms(2, [&] { generated_input(n, splitmix64(1), t, InputDist{}, threads); });
  std::printf("inputs %zu normal bf16\n", n);
  report("  generated", gen_ms, n);
  return 0;
}
