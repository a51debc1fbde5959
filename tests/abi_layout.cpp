// Prints the C ABI's struct sizes and field offsets (runtime/include/flashtune/attention.h) as JSON, so
// that tests/test_python_unit.py can compare them with python/flashtune/_lib.py's ctypes mirrors.
#include <cstddef>
#include <cstdio>

#include "flashtune/attention.h"

#define FIELD(T, f) std::printf("%s\"%s\": %zu", first ? "" : ", ", #f, offsetof(T, f)), first = false
#define STRUCT(T, ...)                                                            \
  do {                                                                            \
    bool first = true;                                                            \
    std::printf("%s\"%s\": {\"sizeof\": %zu, \"fields\": {", sep, #T, sizeof(T)); \
    __VA_ARGS__;                                                                  \
    std::printf("}}");                                                            \
    sep = ", ";                                                                   \
  } while (0)

int main() {
  const char* sep = "";
  std::printf("{");
  STRUCT(ft_tensor, FIELD(ft_tensor, data); FIELD(ft_tensor, stride));
  STRUCT(ft_mods, FIELD(ft_mods, window); FIELD(ft_mods, window_left); FIELD(ft_mods, window_right);
         FIELD(ft_mods, softcap); FIELD(ft_mods, alibi_slopes); FIELD(ft_mods, alibi_batch_stride));
  STRUCT(ft_forward_args, FIELD(ft_forward_args, batch); FIELD(ft_forward_args, heads); FIELD(ft_forward_args, seq_q);
         FIELD(ft_forward_args, seq_k); FIELD(ft_forward_args, head_dim); FIELD(ft_forward_args, dtype);
         FIELD(ft_forward_args, causal); FIELD(ft_forward_args, scale); FIELD(ft_forward_args, q);
         FIELD(ft_forward_args, k); FIELD(ft_forward_args, v); FIELD(ft_forward_args, o); FIELD(ft_forward_args, lse);
         FIELD(ft_forward_args, heads_k); FIELD(ft_forward_args, mods); FIELD(ft_forward_args, mask_mod));
  STRUCT(ft_backward_args, FIELD(ft_backward_args, batch); FIELD(ft_backward_args, heads);
         FIELD(ft_backward_args, seq_q); FIELD(ft_backward_args, seq_k); FIELD(ft_backward_args, head_dim);
         FIELD(ft_backward_args, dtype); FIELD(ft_backward_args, causal); FIELD(ft_backward_args, scale);
         FIELD(ft_backward_args, q); FIELD(ft_backward_args, k); FIELD(ft_backward_args, v); FIELD(ft_backward_args, o);
         FIELD(ft_backward_args, dout); FIELD(ft_backward_args, lse); FIELD(ft_backward_args, dq);
         FIELD(ft_backward_args, dk); FIELD(ft_backward_args, dv); FIELD(ft_backward_args, workspace);
         FIELD(ft_backward_args, workspace_bytes); FIELD(ft_backward_args, heads_k);
         FIELD(ft_backward_args, deterministic); FIELD(ft_backward_args, mods); FIELD(ft_backward_args, mask_mod));
  STRUCT(ft_mask_mod, FIELD(ft_mask_mod, struct_size); FIELD(ft_mask_mod, predicate); FIELD(ft_mask_mod, num_tensors);
         FIELD(ft_mask_mod, names); FIELD(ft_mask_mod, tensors); FIELD(ft_mask_mod, lengths); FIELD(ft_mask_mod, versions));
  STRUCT(ft_packed_tensor, FIELD(ft_packed_tensor, data); FIELD(ft_packed_tensor, stride));
#define VARLEN_HEAD(T)                                                                                     \
  FIELD(T, batch); FIELD(T, heads); FIELD(T, heads_k); FIELD(T, head_dim); FIELD(T, total_q); FIELD(T, total_k); \
  FIELD(T, max_seqlen_q); FIELD(T, max_seqlen_k); FIELD(T, cu_seqlens_q); FIELD(T, cu_seqlens_k); FIELD(T, dtype); \
  FIELD(T, causal); FIELD(T, scale)
  STRUCT(ft_varlen_forward_args, VARLEN_HEAD(ft_varlen_forward_args); FIELD(ft_varlen_forward_args, q);
         FIELD(ft_varlen_forward_args, k); FIELD(ft_varlen_forward_args, v); FIELD(ft_varlen_forward_args, o);
         FIELD(ft_varlen_forward_args, lse); FIELD(ft_varlen_forward_args, mods));
  STRUCT(ft_varlen_backward_args, VARLEN_HEAD(ft_varlen_backward_args); FIELD(ft_varlen_backward_args, q);
         FIELD(ft_varlen_backward_args, k); FIELD(ft_varlen_backward_args, v); FIELD(ft_varlen_backward_args, o);
         FIELD(ft_varlen_backward_args, dout); FIELD(ft_varlen_backward_args, lse); FIELD(ft_varlen_backward_args, dq);
         FIELD(ft_varlen_backward_args, dk); FIELD(ft_varlen_backward_args, dv);
         FIELD(ft_varlen_backward_args, workspace); FIELD(ft_varlen_backward_args, workspace_bytes);
         FIELD(ft_varlen_backward_args, deterministic); FIELD(ft_varlen_backward_args, mods));
  STRUCT(ft_paged_forward_args, FIELD(ft_paged_forward_args, batch); FIELD(ft_paged_forward_args, heads);
         FIELD(ft_paged_forward_args, heads_k); FIELD(ft_paged_forward_args, seq_q); FIELD(ft_paged_forward_args, head_dim);
         FIELD(ft_paged_forward_args, num_pages); FIELD(ft_paged_forward_args, page_size);
         FIELD(ft_paged_forward_args, max_pages); FIELD(ft_paged_forward_args, max_seqlen_k);
         FIELD(ft_paged_forward_args, dtype); FIELD(ft_paged_forward_args, causal); FIELD(ft_paged_forward_args, scale);
         FIELD(ft_paged_forward_args, block_table); FIELD(ft_paged_forward_args, cache_seqlens);
         FIELD(ft_paged_forward_args, q); FIELD(ft_paged_forward_args, k_pages); FIELD(ft_paged_forward_args, v_pages);
         FIELD(ft_paged_forward_args, o); FIELD(ft_paged_forward_args, lse); FIELD(ft_paged_forward_args, layout));
  STRUCT(ft_explanation, FIELD(ft_explanation, family); FIELD(ft_explanation, config); FIELD(ft_explanation, source);
         FIELD(ft_explanation, cache); FIELD(ft_explanation, device); FIELD(ft_explanation, arch));
  // The enums' values and size: ctypes passes them as int.
  std::printf(", \"enums\": {\"sizeof_ft_status\": %zu, \"sizeof_ft_dtype\": %zu, \"FT_OK\": %d, "
              "\"FT_INVALID_ARGUMENT\": %d, \"FT_UNSUPPORTED\": %d, \"FT_NO_GPU\": %d, \"FT_CUDA_ERROR\": %d, "
              "\"FT_COMPILE_ERROR\": %d, \"FT_FP32\": %d, \"FT_FP16\": %d, \"FT_BF16\": %d, \"FT_PAGES_HND\": %d, "
              "\"FT_PAGES_NHD\": %d}}\n",
              sizeof(ft_status), sizeof(ft_dtype), FT_OK, FT_INVALID_ARGUMENT, FT_UNSUPPORTED, FT_NO_GPU, FT_CUDA_ERROR,
              FT_COMPILE_ERROR, FT_FP32, FT_FP16, FT_BF16, FT_PAGES_HND, FT_PAGES_NHD);
  return 0;
}
