/* flashtune runtime: tuned FlashAttention kernels for the GPU in front of you, as a library.
 *
 * The C ABI (for ctypes and other languages); flashtune/attention.hpp is the C++17 interface over it.
 * Tensors are [B, H, S, d] with explicit element strides, so PyTorch's contiguous [B, H, S, d] and its
 * transposed [B, S, H, d] layouts both work (the latter is packed to contiguous scratch on the stream).
 * Grouped-query attention (GQA, MQA): heads_k > 0 gives k, v (dk, dv) heads_k heads, a divisor of
 * heads; query head h reads kv head h / (heads / heads_k), and dk, dv sum over each kv head's group.
 * heads_k = 0 (a zero-initialised struct) means heads_k = heads. fp16 and bf16 only.
 * Every call runs on the caller's stream (a CUstream / cudaStream_t; NULL: the legacy default stream)
 * in the CUDA context current on the calling thread, else the primary context of q's device.
 * Kernels are compiled with NVRTC for exactly this GPU at first use and cached on disk
 * ($FLASHTUNE_CACHE_DIR, else $XDG_CACHE_HOME/flashtune, else ~/.cache/flashtune), unless built ahead
 * of time. Configs come from the generated tables (device name -> arch -> family default) or, when
 * $FLASHTUNE_DB names a results store, from its best valid rows first.
 * Errors are values: every function returns FT_OK or an ft_status, and ft_last_error() holds one line
 * saying why (per thread). */
#ifndef FLASHTUNE_ATTENTION_H
#define FLASHTUNE_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FT_OK = 0,
  FT_INVALID_ARGUMENT = 1, /* a null pointer, a non-positive size, a stride that overlaps, ... */
  FT_UNSUPPORTED = 2,      /* a head dim, dtype or shape no family supports on this GPU */
  FT_NO_GPU = 3,           /* no driver or no CUDA device */
  FT_CUDA_ERROR = 4,       /* a CUDA driver call failed (message names it) */
  FT_COMPILE_ERROR = 5     /* NVRTC failed for the chosen config */
} ft_status;

typedef enum { FT_FP32 = 0, FT_FP16 = 1, FT_BF16 = 2 } ft_dtype;

/* One [B, H, S, d] tensor: device pointer and strides in elements (not bytes). */
typedef struct {
  void* data;
  int64_t stride[4];
} ft_tensor;

typedef struct {
  int batch, heads, seq_q, seq_k, head_dim;
  ft_dtype dtype;
  int causal;      /* bottom-right aligned (query i sees keys j <= i + Sk - Sq), as FlashAttention */
  float scale;     /* softmax scale; <= 0 means 1/sqrt(head_dim) */
  ft_tensor q, k, v; /* inputs, q [B,H,Sq,d], k and v [B,Hk,Sk,d] */
  ft_tensor o;     /* output [B,H,Sq,d] */
  float* lse;      /* output [B,H,Sq] contiguous fp32, natural log; +inf for a fully masked row; may be NULL */
  int heads_k;     /* kv heads (grouped-query attention); 0: heads */
} ft_forward_args;

typedef struct {
  int batch, heads, seq_q, seq_k, head_dim;
  ft_dtype dtype;
  int causal;
  float scale;
  ft_tensor q, k, v, o, dout; /* the forward's inputs and output, and dL/dO (k, v [B,Hk,Sk,d]) */
  const float* lse;           /* the forward's [B,H,Sq] contiguous fp32 LSE */
  ft_tensor dq, dk, dv;       /* outputs (dk, dv [B,Hk,Sk,d]) */
  void* workspace;            /* NULL: the library allocates on the stream and frees after */
  size_t workspace_bytes;     /* at least ft_backward_workspace_bytes() when workspace is given */
  int heads_k;                /* kv heads (grouped-query attention); 0: heads */
} ft_backward_args;

/* Which kernel a call runs, and where the choice came from. */
typedef struct {
  char family[32];   /* "fa2_mma" */
  char config[160];  /* "BLOCK_M=128,BLOCK_N=64,WARPS=4,STAGES=2" */
  char source[16];   /* "db", "device", "arch" or "default" */
  char cache[16];    /* "memory", "disk", "jit" (compiled now, or would be) or "aot" (embedded in the library) */
  char device[96];   /* the GPU's name */
  char arch[16];     /* "sm_90" */
} ft_explanation;

ft_status ft_attention_forward(const ft_forward_args* args, void* stream);
ft_status ft_attention_backward(const ft_backward_args* args, void* stream);
ft_status ft_backward_workspace_bytes(const ft_backward_args* args, size_t* bytes);
ft_status ft_explain_forward(const ft_forward_args* args, ft_explanation* out);
ft_status ft_explain_backward(const ft_backward_args* args, ft_explanation* out);
/* The same choice as one line for logs: "fa2_mma BLOCK_M=128,... (config: device, kernel: disk) on
 * NVIDIA H100 80GB HBM3 (sm_90)", plus "; <note>" when a tabled or stored config was not usable (the
 * family's check rejects it for this head dim, or it did not compile) and the default ran instead.
 * Truncated to size - 1 characters. */
ft_status ft_explain_forward_text(const ft_forward_args* args, char* buf, size_t size);
ft_status ft_explain_backward_text(const ft_backward_args* args, char* buf, size_t size);
/* FT_OK when a CUDA device is usable, else FT_NO_GPU with the reason in ft_last_error(). */
ft_status ft_device_available(void);
/* The last error of this thread, one line; "" after a success. */
const char* ft_last_error(void);
/* "0.1.0" */
const char* ft_version(void);

#ifdef __cplusplus
}
#endif
#endif
