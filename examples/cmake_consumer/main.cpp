// A separate project using the installed flashtune package: forward and backward through
// flashtune::attention on a ragged causal shape (B=2, H=3, Sq=130, Sk=200, d=64) in bf16 and fp32,
// checked against the float64 reference with the tuner's bounds, and the explain() line of each call.
// Exit codes: 0 all checks passed, or no GPU (one line "no GPU: <reason>"); 1 a check failed.
#include <cstdio>

#include "attention_check.hpp"

int main() {
  namespace rt = flashtune::runtime;
  std::printf("flashtune %s\n", rt::version().c_str());
  if (rt::Status s = rt::device_available(); !s) {
    std::printf("no GPU: %s\n", s.message.c_str());
    return 0;
  }
  int failed = 0;
  for (ft_dtype t : {FT_BF16, FT_FP32}) {
    attention_check::Case c;  // B=2 H=3 Sq=130 Sk=200 d=64 causal
    c.dtype = t;
    const attention_check::Result r = attention_check::run_case(c);
    std::printf("%s %s: %s\n  fwd: %s\n  bwd: %s\n", r.ok ? "PASS" : "FAIL", c.str().c_str(),
                r.ok ? "forward and backward within the float64 reference's bounds" : r.error.c_str(),
                r.fwd_explain.c_str(), r.bwd_explain.c_str());
    failed += !r.ok;
  }
  return failed ? 1 : 0;
}
