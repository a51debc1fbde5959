// How long the harness's CPU stages take: the float64 reference rows validated per problem,
// and one NVRTC compile of a representative variant. These bound a sweep's overhead.
#include <benchmark/benchmark.h>

#include <random>

#include "core/compile.hpp"
#include "reference/attention_ref.hpp"

using namespace flashtune;

static void BM_ReferenceRows(benchmark::State& state) {
  const int S = (int)state.range(0), d = 128;
  ref::Shape shape{1, 2, S, S, d, false};
  std::vector<float> q((size_t)2 * S * d), k(q.size()), v(q.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = n(rng);
  auto rows = ref::sample_rows(shape, 512, 7);
  std::vector<double> o(rows.size() * d), lse(rows.size());
  for (auto _ : state) {
    ref::forward_rows(shape, q.data(), k.data(), v.data(), rows, o.data(), lse.data());
    benchmark::DoNotOptimize(o.data());
  }
  state.SetItemsProcessed(state.iterations() * (int64_t)rows.size());
}
BENCHMARK(BM_ReferenceRows)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);

static void BM_NvrtcCompileFa2Simt(benchmark::State& state) {
  const Family& f = find_family("fa2_simt");
  Compiler c("sm_90");
  for (auto _ : state) {
    auto k = c.compile(Variant{&f, {128, 64, 8, 4, 2}, 128, false, DType::fp32});
    benchmark::DoNotOptimize(k.cubin.data());
  }
}
BENCHMARK(BM_NvrtcCompileFa2Simt)->Unit(benchmark::kMillisecond)->Iterations(3);

BENCHMARK_MAIN();
