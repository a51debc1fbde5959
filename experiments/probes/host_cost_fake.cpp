// The runtime library's host cost per call, without a GPU: ft_attention_forward (and backward) on the fake
// driver (tests/fake_driver: launches recorded, not run), so what is timed is the library's own work between
// the call and the driver's launch (checks, the plan lookup, argument packing, scratch), not the driver's.
// The plan alone (which family and config, the kernels' key: what runtime/src/attention.cpp's plan cache
// answers) is timed through ft_backward_workspace_bytes (checks, context, plan, scratch layout; no launch) and
// ft_explain_forward (checks, plan, where the kernel would come from, the explanation's fields).
// Built with the tests (FT_FAKE_CUDA names the fake libcuda.so.1).
//   host_cost_fake [calls]   -> one line per case: ns per call (median of 7 rounds)
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/util.hpp"
#include "fake_driver/load.hpp"
#include "flashtune/attention.h"

namespace {
constexpr int B = 1, H = 2, S = 64, D = 32;

ft_tensor bhsd(float* p) { return ft_tensor{p, {(int64_t)H * S * D, (int64_t)S * D, D, 1}}; }

template <class F>
double ns_per_call(int calls, F&& call) {
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    fake().launches.clear();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i)
      if (call() != FT_OK) {
        std::fprintf(stderr, "host_cost_fake: %s\n", ft_last_error());
        std::exit(1);
      }
    const auto t1 = std::chrono::steady_clock::now();
    rounds.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[3];
}
}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (calls <= 0) {
    std::fprintf(stderr, "usage: host_cost_fake [calls > 0]\n");
    return 2;
  }
  setenv("FLASHTUNE_CACHE_DIR", flashtune::make_private_tmpdir("ft-host-cost").c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  fake();  // loaded before the runtime's first driver call
  if (ft_device_available() != FT_OK) {
    std::fprintf(stderr, "host_cost_fake: %s\n", ft_last_error());
    return 1;
  }
  std::vector<float> q(B * H * S * D + 4, 1.f), k(q), v(q), o(q), dout(q), dq(q), dk(q), dv(q), lse(B * H * S + 4);
  ft_forward_args f{};
  f.batch = B, f.heads = H, f.seq_q = S, f.seq_k = S, f.head_dim = D, f.dtype = FT_FP32;
  f.q = bhsd(q.data()), f.k = bhsd(k.data()), f.v = bhsd(v.data()), f.o = bhsd(o.data());
  // The driver work one call asks for (what the fake counts): context pushes, stream-ordered allocations, launches.
  auto driver_calls = [&](const char* what, auto&& call) {
    FakeState& st = fake();
    const int pushes = st.pushes;
    const size_t allocs = st.allocated.size();
    st.launches.clear();
    call();
    std::printf("%-36s %d context push(es), %zu allocation(s), %zu launch(es)\n", what, st.pushes - pushes,
                st.allocated.size() - allocs, st.launches.size());
  };
  driver_calls("forward, no lse:", [&] { return ft_attention_forward(&f, nullptr); });
  std::printf("forward, no lse:       %8.0f ns per call\n", ns_per_call(calls, [&] { return ft_attention_forward(&f, nullptr); }));
  f.lse = lse.data();
  driver_calls("forward, lse given:", [&] { return ft_attention_forward(&f, nullptr); });
  std::printf("forward, lse given:    %8.0f ns per call\n", ns_per_call(calls, [&] { return ft_attention_forward(&f, nullptr); }));
  ft_backward_args b{};
  b.batch = B, b.heads = H, b.seq_q = S, b.seq_k = S, b.head_dim = D, b.dtype = FT_FP32;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.dout = bhsd(dout.data()), b.lse = lse.data();
  b.dq = bhsd(dq.data()), b.dk = bhsd(dk.data()), b.dv = bhsd(dv.data());
  driver_calls("backward:", [&] { return ft_attention_backward(&b, nullptr); });
  std::printf("backward, workspace by the library: %8.0f ns per call\n",
              ns_per_call(calls / 4, [&] { return ft_attention_backward(&b, nullptr); }));
  size_t bytes = 0;
  std::printf("plan: ft_backward_workspace_bytes: %8.0f ns per call\n",
              ns_per_call(calls, [&] { return ft_backward_workspace_bytes(&b, &bytes); }));
  ft_explanation e{};
  std::printf("plan: ft_explain_forward:        %8.0f ns per call\n",
              ns_per_call(calls, [&] { return ft_explain_forward(&f, &e); }));
  return 0;
}
