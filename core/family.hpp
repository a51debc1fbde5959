// Kernel family descriptors: everything the tuner knows about a template, in one place.
// A family says which template file holds it, how a configuration becomes a kernel name
// expression, which configurations are impossible (and why), how to launch it, and its
// default configuration (the fixed table a tuner has to beat).
#pragma once
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace flashtune {

// One tunable: its name as written in space files and its whole legal domain. Values
// from a space file are checked against the domain before they reach a name expression.
struct ParamSpec {
  std::string name;
  std::vector<int> domain;
};

using Config = std::vector<int>;  // values in the order of Family::params

// One kernel launch's geometry. A family runs one or more kernels in order (a backward runs
// preprocess, dK/dV and dQ); the candidate's time covers all of them.
struct Launch {
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0;
  unsigned smem_bytes = 0;  // dynamic shared memory
  unsigned cluster_x = 1;   // CTAs per thread-block cluster along x (grid[0] a multiple of it); 1: no cluster
};

// A TMA tensor map the worker encodes for a family's kernels (their second, __grid_constant__
// parameter, AttnTensorMaps, in the order listed): one of the problem's tensors as 4-D (head_dim,
// seq, heads, batch), a box of box_cols x box_rows (x 1 x 1), its rows swizzled.
struct TensorMapSpec {
  std::string tensor;     // "q", "k", "v", "o" or "do" (the backward's dO)
  int box_rows = 0;       // 1..256
  int box_cols = 0;       // 16-bit elements: box_cols * 2 a multiple of 16, at most swizzle_bytes
  int swizzle_bytes = 0;  // 32, 64 or 128
};

// Score modifications (Family::mods, Variant::mods): bits of a mask.
inline constexpr unsigned kModWindow = 1;   // sliding window (Problem::window_left/right)
inline constexpr unsigned kModSoftcap = 2;  // logit softcapping (Problem::softcap)
inline constexpr unsigned kModAlibi = 4;    // ALiBi (Problem::alibi)
inline constexpr unsigned kModMask = 8;     // a mask_mod (Problem::mask_mod): the user's predicate (Variant::mask)
// The modifications a problem needs: kModWindow when it has a window, kModSoftcap when a softcap, ...
unsigned problem_mods(const Problem&);
// "", or the names joined by '+' in this order: "window", "softcap", "alibi", "mask" ("softcap+alibi+mask").
std::string mods_string(unsigned mods);
// The mask of a mods_string (each name once, in any order; "none" is 0); false when it is not one.
bool mods_from_string(const std::string& s, unsigned& mods);

struct Family {
  std::string name;           // "fa2_simt"
  std::string direction;      // "fwd"
  std::string template_file;  // "fa2_simt.cuh"
  std::vector<std::string> kernels;  // {"flashtune::fa2_simt_fwd"}, launched in this order
  std::vector<ParamSpec> params;
  std::vector<int> head_dims;
  std::vector<DType> dtypes;
  Config default_config;      // valid for every supported head dim
  bool test_only = false;     // fault-injection families: never in default listings
  bool workspace_written = false;  // see workspace_bytes
  bool hopper_only = false;   // wgmma: compiled for sm_90a (on an sm_90 target), pruned on others
  bool gqa = false;           // reads kv head h / (heads / heads_k) (grouped-query attention)
  // Runs packed variable-length batches (Problem::varlen): every kernel also exists as `kernel<Traits, true>`,
  // which reads cu_seqlens_q/k from the params (Variant::varlen picks it; the dense kernel is `kernel<Traits>`).
  bool varlen = false;
  // The inputs ("q", "k", "v") that every kernel of the family reads through its tensor maps alone (never
  // through the params' pointers): a dense problem's strided view of one of them is read in place, the map
  // carrying its strides (encode_tensor_maps), instead of being packed into contiguous scratch first.
  std::vector<std::string> map_only_inputs;
  // Reads a paged K/V cache (Problem::paged): every kernel also exists as `kernel<Traits, true>` on PagedParams
  // (Variant::paged picks it). A family has at most one second form: varlen or paged, never both (the
  // template's second argument names one).
  bool paged = false;
  // Its paged form also reads token-major pages (PageLayout::nhd: FlashAttention's and vLLM's [num_pages,
  // page_size, Hk, d]) as `kernel<PagedNhdTraits<Traits>, true>` (Variant::page_layout picks it), the configs and
  // paged_check those of the head-major form.
  bool paged_nhd = false;
  // Query rows per sequence it serves (Sq <= max_seq_q), 0: any. A decoding family: tuned, selected and
  // run by the library only for shapes in its range (shape_reason), whatever it measured elsewhere.
  int max_seq_q = 0;
  // The score modifications (issue 32) its kernels have as compile-time switches, a mask of kModWindow,
  // kModSoftcap and kModAlibi: a variant with Variant::mods set is `kernel<AttnModTraits<Traits, WINDOW, SOFTCAP[,
  // ALIBI]>>` (ALIBI written only when true; the plain
  // kernels keep their names and code) and takes ModParams (the plain argument, then AttnMods). A problem with a
  // window or a softcap the family lacks is refused by shape_reason, so nothing runs it without them.
  unsigned mods = 0;
  // The largest head dim whose modified forms it has (0: every head dim of head_dims): fa2_mma_bwd's kernels with
  // all three modifications pass ptxas's 255 registers past d 128 and spill. has_mods() reads both.
  int mods_max_head_dim = 0;
  // Switches a modification refuses: with any of `mods`, the tunable at index `param` must be 0 (fa3_wgmma: no
  // MULTICAST with a mask_mod; fa3_wgmma_bwd: no DETERMINISTIC and no DQ_TURNS with one), or, where `values` names
  // them, must not take those values, the runtime running `fallback` instead (fa3_wgmma_bwd: BLOCK_M 80 and 96 with
  // any modification -> 64). mods_check and mods_fallback read them.
  struct ModsRefusal {
    unsigned mods;
    size_t param;
    const char* why;
    std::vector<int> values = {};  // the refused values (empty: every value but 0)
    int fallback = 0;              // what mods_fallback puts in their place
    bool refuses(int v) const {
      return values.empty() ? v != 0 : std::find(values.begin(), values.end(), v) != values.end();
    }
  };
  std::vector<ModsRefusal> mods_refused;
  // nullptr when the config has a variant with the modifications `mods`, else why not (the first refusal it meets).
  const char* mods_check(const Config& c, unsigned mods) const;
  // The config the runtime runs instead of a pick mods_check refuses: the same config with every value the
  // modifications refuse replaced by its refusal's fallback (the pick itself where none is refused).
  Config mods_fallback(const Config& c, unsigned mods) const;
  // A mask_mod's block summary for a config (kModMask): the (query rows, keys) of one block of its lists, the
  // kernel's tiles (fa3_wgmma: BLOCK_M = 64 CONSUMERS and BLOCK_N; fa3_wgmma_bwd: BLOCK_M and BLOCK_N = 64
  // CONSUMERS); core/mask_summary.hpp plans the lists from them.
  std::function<std::pair<int, int>(const Config&)> mask_blocks = [](const Config&) { return std::pair{0, 0}; };
  // Whether it has the modifications `m` (a kMod* mask) at head_dim (none: always).
  bool has_mods(unsigned m, int head_dim) const {
    return !(m & ~mods) && (!m || mods_max_head_dim == 0 || head_dim <= mods_max_head_dim);
  }

  // "flashtune::Fa2SimtTraits<64,128,64,8,4,2,false>"
  std::function<std::string(const Config&, int head_dim, bool causal, DType)> traits;
  // nullptr when the combination is valid, else why not (the same conditions as the
  // traits' static_asserts, so NVRTC never sees an impossible variant).
  std::function<const char*(const Config&, int head_dim)> check;
  // The packed form's (varlen) further conditions: nullptr when it has that form of the config, else why not
  // (fa2_wgmma_bwd: LOAD 1's packed images failed validation on the GPU).
  std::function<const char*(const Config&)> varlen_check = [](const Config&) -> const char* { return nullptr; };
  // Further conditions on the mask: nullptr when the config has a variant for it, else why not (fa3_wgmma:
  // MULTICAST's clusters are non-causal only).
  std::function<const char*(const Config&, bool causal)> causal_check = [](const Config&, bool) -> const char* {
    return nullptr;
  };
  // The paged form's condition on the problem's page size: nullptr when the config can read pages of that
  // size, else why not (decode_splitkv: BLOCK_N must divide it). Applied per problem (the search's candidates,
  // `run`), not at compile time: one compiled paged variant serves every page size it divides.
  std::function<const char*(const Config&, int page_size)> paged_check = [](const Config&, int) -> const char* {
    return nullptr;
  };
  // A backward config whose dQ, dK and dV are bitwise equal from run to run on the same inputs (no additions
  // in an order the hardware picks). The worker checks the claim (validate: repeated runs compared bit for
  // bit); selection keeps these picks apart (`best --deterministic`, the tables' deterministic entries, the
  // runtime's deterministic calls).
  std::function<bool(const Config&)> reproducible = [](const Config&) { return false; };
  std::function<std::vector<Launch>(const Config&, const Problem&)> launches;  // one per kernel
  // Bytes of p.workspace: zero-filled by the worker before each validated run and by the runtime before
  // each call, unless workspace_written (the family's kernels write every byte before reading it; the
  // worker then fills it with 0xFF before the validated run, so a byte read unwritten shows as a wrong answer).
  std::function<size_t(const Config&, const Problem&)> workspace_bytes = [](const Config&, const Problem&) {
    return size_t{0};
  };

  // TMA tensor maps its kernels take (none: the kernels take the params struct alone).
  std::function<std::vector<TensorMapSpec>(const Config&, const Problem&)> tensor_maps =
      [](const Config&, const Problem&) { return std::vector<TensorMapSpec>{}; };

  // packed: the varlen form, paged: the paged form (a family has one of them at most): `kernel<Traits, true>`.
  // mods (kModWindow | kModSoftcap | kModAlibi | kModMask): the traits wrapped in AttnModTraits
  // (templates/traits_common.h); kModMask's fifth argument is mask_type (MaskPredicate::type_name()).
  // layout nhd (paged only): the traits wrapped in PagedNhdTraits (templates/attention_params.h).
  std::vector<std::string> name_expressions(const Config& c, int head_dim, bool causal, DType t,
                                            bool packed = false, bool paged = false, unsigned mod = 0,
                                            PageLayout layout = PageLayout::hnd, const std::string& mask_type = "") const {
    std::string tr = traits(c, head_dim, causal, t);
    if (paged && layout == PageLayout::nhd) tr = "flashtune::PagedNhdTraits<" + tr + ">";
    if (mod & kModMask)
      tr = "flashtune::AttnModTraits<" + tr + ", " + ((mod & kModWindow) ? "true" : "false") + ", " +
           ((mod & kModSoftcap) ? "true" : "false") + ", " + ((mod & kModAlibi) ? "true" : "false") + ", " + mask_type +
           ">";
    else if (mod)
      tr = "flashtune::AttnModTraits<" + tr + ", " + ((mod & kModWindow) ? "true" : "false") + ", " +
           ((mod & kModSoftcap) ? "true" : "false") + ((mod & kModAlibi) ? ", true>" : ">");  // ALIBI: its default false
    std::vector<std::string> out;
    for (const auto& k : kernels) out.push_back("&" + k + "<" + tr + (packed || paged ? ", true>" : ">"));
    return out;
  }
  // Whether it serves the problem's head layout and query length: "" when it does, else why not
  // ("does not support grouped-query attention (heads_k)", "serves Sq <= 16", "does not support packed
  // variable-length batches", "does not read paged K/V caches"). Direction, dtype and
  // head dim are checked where they are named; this is the rest, in one place for tune, run, import
  // and selection.
  std::string shape_reason(const Problem& p) const;
  std::string config_string(const Config& c) const;  // "BLOCK_M=128,BLOCK_N=64,..."
  Config parse_config(const std::string& kv) const;   // inverse; validated; throws UsageError
};

// Why a tensor map cannot be encoded for this problem (empty when it can): an unknown tensor, a box
// outside the copy engine's limits, a swizzle the box does not fit, strides TMA cannot express.
std::string tensor_map_error(const TensorMapSpec&, const Problem&);

const std::vector<Family>& families();
const Family& find_family(const std::string& name);  // throws UsageError
const Family* family_named(const std::string& name);  // nullptr when unknown

}  // namespace flashtune
