/* flashtune runtime: tuned FlashAttention kernels for the GPU in front of you, as a library.
 *
 * The C ABI (for ctypes and other languages); flashtune/attention.hpp is the C++17 interface over it.
 * Tensors are [B, H, S, d] with explicit element strides, so PyTorch's contiguous [B, H, S, d] and its
 * transposed [B, S, H, d] layouts both work (the latter is packed to contiguous scratch on the stream).
 * Grouped-query attention (GQA, MQA): heads_k > 0 gives k, v (dk, dv) heads_k heads, a divisor of
 * heads; query head h reads kv head h / (heads / heads_k), and dk, dv sum over each kv head's group.
 * heads_k = 0 (a zero-initialised struct) means heads_k = heads. fp16 and bf16 only.
 * Decoding (Sq <= 16, a K/V cache) needs nothing of its own: the forward runs the split-KV family
 * decode_splitkv there when the tables (or $FLASHTUNE_DB) hold a config of it for the call's bucket, else
 * the family it would run for a longer query; ft_explain_forward says which.
 * Packed variable-length batches (FlashAttention's flash_attn_varlen_func layout): the ft_*varlen*
 * functions below. Decoding from a paged K/V cache (vLLM's PagedAttention): the ft_*paged* functions.
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
  FT_COMPILE_ERROR = 5     /* NVRTC failed for the chosen config, or no NVRTC could be loaded */
} ft_status;

typedef enum { FT_FP32 = 0, FT_FP16 = 1, FT_BF16 = 2 } ft_dtype;

/* One [B, H, S, d] tensor: device pointer and strides in elements (not bytes). A dense call whose tensors pass
 * 2^31 - 1 elements (or whose backward's dQ accumulator, B H Sq d floats, would) runs as chunks of its batch
 * that each fit, one after the other on the stream; it is refused when one batch alone does not fit or a stride
 * passes 2^31 - 1. Explain and ft_backward_workspace_bytes describe the first (largest) chunk; a workspace that
 * size serves every chunk. Packed (varlen) tensors stay within 2^31 - 1 elements. */
typedef struct {
  void* data;
  int64_t stride[4];
} ft_tensor;

/* Score modifications (FlashAttention's window_size, softcap and alibi_slopes), the last field of the dense and
 * packed args structs (ABI 0.6: alibi_slopes and alibi_batch_stride added); a zero-initialised one is none.
 * Families that have them (the forwards fa3_wgmma on sm_90 and fa2_mma on every GPU, the Hopper backward
 * fa3_wgmma_bwd) run such a call with the config
 * of the unmodified call's bucket; a call no family runs with them is FT_UNSUPPORTED, naming what is missing. */
typedef struct {
  int window;       /* 1: the sliding window below applies; 0: none (then window_left/right are ignored) */
  int window_left;  /* query i sees key j iff i + Sk - Sq - window_left <= j <= i + Sk - Sq + window_right */
  int window_right; /* (bottom-right aligned like causal; -1: unbounded; causal keeps its right edge, the diagonal) */
  float softcap;    /* > 0: the scaled scores s become softcap * tanh(s / softcap) before the softmax; 0: off */
  /* ALiBi: non-NULL, fp32 device slopes; query head h of batch b (sequence b when packed) adds
   * -alibi_slopes[b * alibi_batch_stride + h] * |i + Sk - Sq - j| to its scaled (and capped) scores, as
   * FlashAttention's alibi_slopes (the LSE includes it). alibi_batch_stride: 0 for slopes [H], >= heads for [B, H]
   * (elements). The slopes are read while the call's kernels run on the stream. */
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
} ft_mods;

/* A mask predicate (mask_mod, ABI 0.8; docs/kernels.md, "mask_mod"), the last field of the dense args structs: the
 * body of `bool mask(int b, int h, int q_idx, int kv_idx)`, true where query q_idx (a position in the sequence) of query
 * head h in batch entry b sees key kv_idx, ANDed with causal; statements with a return, or one expression. It may read
 * up to FT_MAX_MASK_TENSORS named int32 tensors as name[i] (0 outside [0, length)). The text becomes source: it is
 * checked (no '#', '\', literals, asm, __ or ft_ names; brackets balanced; at most 4000 bytes) and compiled by NVRTC
 * with the call's kernels at first use (cached by its hash, as every kernel); a text that fails either is
 * FT_INVALID_ARGUMENT with one line naming the error (ft_check_mask_mod checks it without a call). Hopper families,
 * dense calls only, not with a window nor with deterministic; FT_UNSUPPORTED otherwise.
 * The block summary (which key blocks each query block sees) is computed on the call's stream from the tensors, and
 * reused by later calls on the same stream while the predicate, each tensor's pointer, length and version, the
 * shape (B, H, Hk, Sq, Sk, causal) and the kernel's blocks are the same: a caller that rewrites a tensor in place
 * must change its version (flashtune.torch passes the tensor's _version), and the tensors are read while the call's
 * kernels run. ft_release_scratch frees the summaries. */
#define FT_MAX_MASK_TENSORS 4
typedef struct {
  size_t struct_size;                          /* sizeof(ft_mask_mod) as the caller compiled it */
  const char* predicate;                       /* NUL-terminated */
  int num_tensors;                             /* 0..FT_MAX_MASK_TENSORS */
  const char* names[FT_MAX_MASK_TENSORS];      /* NUL-terminated C identifiers, as the predicate reads them */
  const int32_t* tensors[FT_MAX_MASK_TENSORS]; /* device memory, contiguous int32, 4-byte aligned */
  int64_t lengths[FT_MAX_MASK_TENSORS];        /* elements, 1..2^31 - 1 */
  uint64_t versions[FT_MAX_MASK_TENSORS];      /* the caller's version of each tensor's contents (the summary's key) */
} ft_mask_mod;

typedef struct {
  int batch, heads, seq_q, seq_k, head_dim;
  ft_dtype dtype;
  int causal;      /* bottom-right aligned (query i sees keys j <= i + Sk - Sq), as FlashAttention */
  float scale;     /* softmax scale; <= 0 means 1/sqrt(head_dim) */
  ft_tensor q, k, v; /* inputs, q [B,H,Sq,d], k and v [B,Hk,Sk,d] */
  ft_tensor o;     /* output [B,H,Sq,d] */
  float* lse;      /* output [B,H,Sq] contiguous fp32, natural log; +inf for a fully masked row; may be NULL */
  int heads_k;     /* kv heads (grouped-query attention); 0: heads */
  ft_mods mods;    /* sliding window, softcap; zero: none */
  const ft_mask_mod* mask_mod; /* ABI 0.8: a mask predicate; NULL: none */
} ft_forward_args;

typedef struct {
  int batch, heads, seq_q, seq_k, head_dim;
  ft_dtype dtype;
  int causal;
  float scale;
  ft_tensor q, k, v, o, dout; /* the forward's inputs and output, and dL/dO (k, v [B,Hk,Sk,d]) */
  const float* lse;           /* the forward's [B,H,Sq] contiguous fp32 LSE */
  ft_tensor dq, dk, dv;       /* outputs (dk, dv [B,Hk,Sk,d]) */
  void* workspace;            /* NULL: scratch as ft_set_scratch_allocator says (allocated on the stream, freed
                                 after); else 256-byte aligned device memory the call may use until its work ends */
  size_t workspace_bytes;     /* at least ft_backward_workspace_bytes() when workspace is given */
  int heads_k;                /* kv heads (grouped-query attention); 0: heads */
  int deterministic;          /* 1: dq, dk, dv bitwise equal from run to run (only configs whose additions run in
                                 a fixed order: the tables' deterministic picks); 0: the fastest config */
  ft_mods mods;               /* the forward's */
  const ft_mask_mod* mask_mod; /* ABI 0.8: the forward's mask predicate; NULL: none */
} ft_backward_args;

/* Packed variable-length batches (varlen): `batch` sequences packed token after token, as
 * flash_attn_varlen_func takes them. Sequence b owns query tokens [cu_seqlens_q[b], cu_seqlens_q[b+1])
 * and key tokens [cu_seqlens_k[b], cu_seqlens_k[b+1]); q, o, dout and dq are [total_q, heads, d], k, v,
 * dk and dv [total_k, heads_k, d]; lse is [heads, total_q] fp32 (FlashAttention's softmax_lse layout).
 * causal is per sequence, bottom-right aligned. fp16 and bf16; grouped-query heads as above.
 * Checked on the host (FT_INVALID_ARGUMENT, one line): pointers, sizes and their ranges (batch <= 65535,
 * total tokens <= 2^24, total * heads * head_dim < 2^31), total_q <= batch * max_seqlen_q (likewise k),
 * strides, overlapping outputs, alignment of cu_seqlens and lse. Trusted, as FlashAttention trusts them
 * (they live in device memory, and reading them would synchronise the stream): the offsets start at 0,
 * never decrease, end at total_q (total_k), and no sequence is longer than max_seqlen_q (max_seqlen_k).
 * A call that breaks these reads or writes outside the tensors or leaves rows unwritten. */

/* One packed [total, heads, d] tensor: device pointer and element strides (token, head, head dim). */
typedef struct {
  void* data;
  int64_t stride[3];
} ft_packed_tensor;

typedef struct {
  int batch;                  /* sequences: cu_seqlens_q and cu_seqlens_k hold batch + 1 offsets */
  int heads, heads_k, head_dim; /* heads_k: kv heads (grouped-query attention); 0: heads */
  int total_q, total_k;       /* tokens: cu_seqlens_q[batch], cu_seqlens_k[batch] */
  int max_seqlen_q, max_seqlen_k; /* at least the longest sequence's lengths (the launch grid's) */
  const int32_t* cu_seqlens_q; /* device memory, int32, batch + 1 non-decreasing offsets from 0 */
  const int32_t* cu_seqlens_k;
  ft_dtype dtype;             /* FT_FP16 or FT_BF16 */
  int causal;                 /* per sequence, bottom-right aligned */
  float scale;                /* <= 0: 1/sqrt(head_dim) */
  ft_packed_tensor q, k, v;   /* q [total_q, heads, d], k and v [total_k, heads_k, d] */
  ft_packed_tensor o;         /* output [total_q, heads, d] */
  float* lse;                 /* output [heads, total_q] contiguous fp32, natural log; may be NULL */
  ft_mods mods;               /* sliding window (aligned to each sequence's own lengths), softcap; zero: none */
} ft_varlen_forward_args;

typedef struct {
  int batch;
  int heads, heads_k, head_dim;
  int total_q, total_k;
  int max_seqlen_q, max_seqlen_k;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  ft_dtype dtype;
  int causal;
  float scale;
  ft_packed_tensor q, k, v, o, dout; /* the forward's inputs and output, and dL/dO */
  const float* lse;                  /* the forward's [heads, total_q] contiguous fp32 LSE */
  ft_packed_tensor dq, dk, dv;       /* outputs (dk, dv [total_k, heads_k, d]) */
  void* workspace;                   /* as ft_backward_args' */
  size_t workspace_bytes;            /* at least ft_varlen_backward_workspace_bytes() when given */
  int deterministic;                 /* as ft_backward_args' */
  ft_mods mods;                      /* the forward's */
} ft_varlen_backward_args;

/* The layout of a paged cache's pools (ft_paged_forward_args.layout, ABI 0.7). */
typedef enum {
  FT_PAGES_HND = 0, /* [num_pages, heads_k, page_size, d]: each kv head's keys of a page adjacent (0: a zeroed
                       struct, the only layout before ABI 0.7) */
  FT_PAGES_NHD = 1  /* [num_pages, page_size, heads_k, d]: each key's kv heads adjacent, FlashAttention's k_cache
                       (flash_attn_with_kvcache) and vLLM's; read in place as well (the same configs and bytes) */
} ft_page_layout;

/* Paged K/V caches (decoding from a serving engine's cache, as vLLM's PagedAttention and FlashAttention's
 * flash_attn_with_kvcache(block_table=...)): K and V are pools of pages, [num_pages, heads_k, page_size, d]
 * (layout FT_PAGES_HND: each page holds page_size consecutive keys of every kv head, head-major inside the
 * page) or [num_pages, page_size, heads_k, d] (FT_PAGES_NHD: FlashAttention's and vLLM's block layout),
 * contiguous and 16-byte aligned; they are read in place, never copied. Sequence b's logical page j (its keys [j*page_size, (j+1)*page_size)) is physical
 * page block_table[b*max_pages + j]; it holds cache_seqlens[b] keys. q, o [B, H, Sq, d] and lse [B, H, Sq]
 * are dense as in ft_forward_args (any strides for q and o). causal is bottom-right aligned to each
 * sequence's own length (query i sees keys j <= i + cache_seqlens[b] - Sq); a sequence without keys gets
 * O = 0, LSE = +inf. Sq 1..16 (decoding, speculative decoding), fp16 and bf16, grouped-query heads as above;
 * the split-KV family decode_splitkv runs it, with a config whose BLOCK_N divides page_size.
 * Checked on the host (one line each): pointers, sizes and their ranges (batch <= 65535, max_pages *
 * page_size <= 2^30 keys, max_seqlen_k <= that), the pools' layout and alignment, q and o as in the dense
 * forward, the alignment of block_table, cache_seqlens and lse (FT_INVALID_ARGUMENT); fp32, a head dim,
 * Sq > 16 or a page size no kernel reads (FT_UNSUPPORTED, naming the smallest page it reads). Trusted (device
 * memory; reading it would synchronise the stream): each cache_seqlens[b] in 0..max_pages * page_size and the
 * block table's first ceil(cache_seqlens[b] / page_size) entries of row b in 0..num_pages - 1; entries past
 * them are never read. */
typedef struct {
  int batch, heads, heads_k, seq_q, head_dim; /* heads_k: kv heads of the pools (grouped-query); 0: heads */
  int num_pages;    /* the pools' first dimension */
  int page_size;    /* keys per page */
  int max_pages;    /* the block table's columns (its row stride) */
  int max_seqlen_k; /* the longest cache_seqlens, for the config's sequence bucket only (any value gives the
                       same result); 0: max_pages * page_size, the capacity, as flash_attn_with_kvcache uses */
  ft_dtype dtype;   /* FT_FP16 or FT_BF16 */
  int causal;       /* per sequence, bottom-right aligned */
  float scale;      /* <= 0: 1/sqrt(head_dim) */
  const int32_t* block_table;   /* device memory, int32 [batch, max_pages] */
  const int32_t* cache_seqlens; /* device memory, int32 [batch] */
  ft_tensor q;                  /* [B, H, Sq, d] */
  ft_tensor k_pages, v_pages;   /* [num_pages, heads_k, page_size, d] (FT_PAGES_NHD: [num_pages, page_size,
                                   heads_k, d]), contiguous; the strides are those of that 4-D view */
  ft_tensor o;                  /* output [B, H, Sq, d] */
  float* lse;                   /* output [B, H, Sq] contiguous fp32, natural log; may be NULL */
  int layout;                   /* ABI 0.7: an ft_page_layout, FT_PAGES_HND (0) or FT_PAGES_NHD; another value is
                                   FT_INVALID_ARGUMENT */
} ft_paged_forward_args;

/* Which kernel a call runs, and where the choice came from. */
typedef struct {
  char family[32];   /* "fa2_mma" */
  char config[160];  /* "BLOCK_M=128,BLOCK_N=64,WARPS=4,STAGES=2" */
  char source[16];   /* "user" (the user's store), "db" ($FLASHTUNE_DB), "device", "arch" or "default" */
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
/* Packed variable-length batches: the same as the dense functions, through each family's packed form
 * (forward fa2_mma or, on Hopper, fa3_wgmma; backward fa2_mma_bwd or, on Hopper, fa2_wgmma_bwd), with the
 * config of the dense bucket of max(max_seqlen_q, max_seqlen_k). */
ft_status ft_attention_varlen_forward(const ft_varlen_forward_args* args, void* stream);
ft_status ft_attention_varlen_backward(const ft_varlen_backward_args* args, void* stream);
ft_status ft_varlen_backward_workspace_bytes(const ft_varlen_backward_args* args, size_t* bytes);
ft_status ft_explain_varlen_forward(const ft_varlen_forward_args* args, ft_explanation* out);
ft_status ft_explain_varlen_backward(const ft_varlen_backward_args* args, ft_explanation* out);
ft_status ft_explain_varlen_forward_text(const ft_varlen_forward_args* args, char* buf, size_t size);
ft_status ft_explain_varlen_backward_text(const ft_varlen_backward_args* args, char* buf, size_t size);
/* Paged K/V caches: decode_splitkv's paged form, its config from the tables' (or $FLASHTUNE_DB's) paged entries
 * for the bucket, else the dense decoding pick, else the default, the first whose BLOCK_N divides page_size
 * (else the default's nearest config that reads such pages); the explanation's line says which. Any split
 * workspace comes from the call's stream-ordered scratch, as the dense forward's. */
ft_status ft_attention_paged_forward(const ft_paged_forward_args* args, void* stream);
ft_status ft_explain_paged_forward(const ft_paged_forward_args* args, ft_explanation* out);
ft_status ft_explain_paged_forward_text(const ft_paged_forward_args* args, char* buf, size_t size);
/* Scratch memory. A call that needs device scratch (strided inputs or outputs packed to contiguous copies, the
 * forward's LSE when lse is NULL, the backward's delta and dq accumulator, a family's workspace such as the
 * split-KV partials of decoding) takes one block of it per call, on the call's stream, and frees it on that
 * stream before returning (stream-ordered: the next user of the memory on that stream runs after the kernels).
 * It comes from, first to last: the backward's workspace argument when given; else the allocator set with
 * ft_set_scratch_allocator; else the library's own stream-ordered pool on the device, which keeps what it
 * frees (re-mapping memory on every call costs milliseconds of host time) until ft_release_scratch.
 * Why a callback rather than a workspace argument on every call: it covers every call (dense, packed, paged,
 * either direction, and any later one) with one function and no change to the argument structs, the allocator
 * is asked once per call for exactly the bytes the chosen kernels need (a workspace argument would need a
 * sizing call first, planning every call twice on the host), and a framework hands its own caching allocator
 * over once (flashtune.torch installs torch's, so scratch shows in torch.cuda.memory_stats and is reused by
 * torch). alloc_fn(bytes, device, stream, user) returns device memory on `device` (the ordinal of the call's
 * context) usable in stream order on `stream`, 256-byte aligned (cudaMalloc's alignment; a pointer that is not
 * is handed back to free_fn and the call fails with FT_INVALID_ARGUMENT), or NULL when it has none (the call
 * fails with FT_CUDA_ERROR, naming the bytes); free_fn(ptr, bytes, device, stream, user) gets alloc_fn's
 * arguments once the call's work is queued on the stream. Neither may call back into this library. Process-
 * wide and meant to be set once (at startup, or as a framework loads): a call in flight keeps the allocator it
 * started with. Both NULL: the library's pool again; one of them NULL is FT_INVALID_ARGUMENT. Needs no GPU. */
typedef void* (*ft_scratch_alloc_fn)(size_t bytes, int device, void* stream, void* user);
typedef void (*ft_scratch_free_fn)(void* ptr, size_t bytes, int device, void* stream, void* user);
ft_status ft_set_scratch_allocator(ft_scratch_alloc_fn alloc_fn, ft_scratch_free_fn free_fn, void* user);
/* Returns the library's pools' memory to the driver (cuMemPoolTrimTo 0 on every device's pool): all of it but
 * what backs scratch still in use, that is the blocks of calls whose streams have not reached their frees yet
 * (synchronise those streams first to release everything). The pools stay usable; a later call without a
 * workspace or allocator maps memory again. FT_OK and nothing to do when no pool was created (no GPU, or
 * every call had a workspace or an allocator). */
ft_status ft_release_scratch(void);
/* The bytes the library's pools hold from the driver now (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT summed over
 * devices): 0 when no pool was created. FT_INVALID_ARGUMENT when bytes is NULL. */
ft_status ft_scratch_pool_bytes(size_t* bytes);
/* Plans (the family, config and kernels a call runs) are cached, per process and per thread: a repeated call's
 * plan is a table lookup. What a plan depends on besides the call: the device, and the store the lookup reads
 * ($FLASHTUNE_DB, else the user's store under $XDG_CACHE_HOME or $HOME). Those variables and the store's file
 * (its inode, size and mtime) are read at the first call, then looked at again at most once a second, by the
 * first call after that second: a change (a store re-tuned while the process runs, a variable set) reaches the
 * calls within a second. ft_reload_settings forgets every plan, so that the next call of every thread reads the
 * variables and the store again (after setenv, for an immediate effect). Needs no GPU. */
ft_status ft_reload_settings(void);
/* A mask predicate checked and compiled alone (NVRTC, no GPU needed; cached by its hash): FT_OK, or
 * FT_INVALID_ARGUMENT with one line naming what is wrong or NVRTC's first error, FT_COMPILE_ERROR without NVRTC. */
ft_status ft_check_mask_mod(const ft_mask_mod* mask_mod);
/* FT_OK when a CUDA device is usable, else FT_NO_GPU with the reason in ft_last_error(). */
ft_status ft_device_available(void);
/* The last error of this thread, one line; "" after a success. */
const char* ft_last_error(void);
/* "0.8.0" */
const char* ft_version(void);

#ifdef __cplusplus
}
#endif
#endif
