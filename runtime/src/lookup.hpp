// Which family and config a call runs: pure host code over the family registry (core/family.hpp),
// the generated tables (configs/generated/dispatch.hpp, compiled in) and an optional results store.
// No GPU: the unit tests drive it with synthetic tables.
#pragma once
#include <string>
#include <vector>

#include "core/family.hpp"
#include "tuned_config.h"

namespace flashtune::rt {

// The tables a lookup reads: device tables (device name, arch, entries) and the families' defaults.
struct TableSet {
  const tuned::Table* tables = nullptr;
  int count = 0;
};
// configs/generated/dispatch.hpp's kTables, as compiled into the library.
TableSet generated_tables();

// What a call asks for, from the tables' point of view.
struct Query {
  std::string device, arch;  // "NVIDIA H100 80GB HBM3", "sm_90"
  std::string direction;     // "fwd" | "bwd"
  DType dtype = DType::fp32;
  int head_dim = 0;
  bool causal = false;
  int seq = 0;  // max(Sq, Sk): the tables' sequence buckets
  bool gqa = false;  // grouped-query attention: only families that support it
  int seq_q = 0;     // Sq: a family with a query-length range (Family::max_seq_q) only inside it; 0: unknown,
                     // none of those families
  bool varlen = false;  // a packed variable-length batch: only families with a packed form (Family::varlen),
                        // configs their packed form takes (Family::varlen_check); seq, seq_q the longest lengths
  int page_size = 0;    // a paged K/V cache's keys per page (0: contiguous K/V): only families with a paged form
                        // (Family::paged), configs whose paged form reads such pages (Family::paged_check), the
                        // tables' and the store's paged entries first; seq the longest cache length
  // The pools' layout of a paged call: which form of the paged kernels runs, not which config (the paged
  // entries and the store's paged buckets serve both layouts: the same configs, the same bytes; docs/kernels.md).
  PageLayout page_layout = PageLayout::hnd;
  bool deterministic = false;  // a backward whose gradients must be bitwise reproducible: only configs the family
                               // calls so (Family::reproducible), from the tables' and the store's deterministic
                               // picks, else the default's nearest such config; no effect on a forward
  unsigned mods = 0;  // the score modifications the call has (kModWindow, kModSoftcap, kModAlibi): only families that have them
                      // (Family::mods), with an unmodified call's bucket's config (seq: lookup_seq)
  long long batch_heads = 0;   // batch x kv heads (heads_k, or heads for multi-head): a decoding family's buckets'
                               // second key (tuned::find_in, pick_bucket: the nearest by ratio); 0: unknown (the
                               // smallest)
  int group = 0;  // Problem::group_key: query heads per kv head of a grouped-query call (2 to 255), else 0:
                  // the entries and stored buckets of that group first, else the multi-head ones
};

// The sequence a call's forward is looked up at in the tables (Query::seq): max(Sq, Sk), or for a sliding window the
// sequence whose plain call walks as many keys per query block: the keys a row sees, W = min(Sk, left + right + 1)
// (causal: left + 1), and a causal window is a causal call of 2 W (whose rows see S / 2 keys on average), capped at
// max(Sq, Sk). The forward's picks change with the walk's length (the H200's BLOCK_N 176 at 16k, 128 at 4k), and a
// window of 1024 keys at S 16k ran 1.16x faster on the 4096 bucket's pick (d 128; window_grid.txt). A backward's
// stays at max(Sq, Sk): its tile shape is one at every bucket and the walks its buckets pick differed by at most
// 1.3% on windows. Not for a mask_mod (its lists are known after the pick).
int lookup_seq(const Problem& p);

// The registry's non-test families that run `q` (direction, dtype, head dim) on q.arch (a Hopper-only
// family only on sm_90, a grouped-query query only on gqa families, a packed one only on varlen families,
// a paged one only on paged families, a family with max_seq_q only for 0 < q.seq_q <= max_seq_q, a
// deterministic backward only on families with a reproducible config at the head dim), in registry order.
std::vector<const Family*> candidate_families(const Query& q);
// Queries whose seq_q falls in one class have the same candidates: the smallest max_seq_q of the
// registry that holds seq_q, or 0 when none does (a plan cache keys on it, not on every Sq).
int seq_q_class(int seq_q);
// Why no family runs `q`, one line, or "" when one does (the arch is not considered: argument checks).
std::string unsupported_reason(const std::string& direction, DType dtype, int head_dim, bool gqa = false,
                               bool varlen = false, bool paged = false, unsigned mods = 0);

// Paged K/V caches (the families' paged forms, Family::paged):
// the longest query a paged call may have: the largest max_seq_q of the families that read paged caches
// (0: any; decode_splitkv: 16).
int paged_max_seq_q();
// Why no family reads pages of page_size keys for this forward (dtype, head dim), one line, or "" when one
// does (some config of a paged family passes its check and its paged check).
std::string paged_page_reason(DType dtype, int head_dim, int page_size);
// The config of f nearest `from` that its check at head_dim and its paged form at page_size accept: the
// fewest tunables changed, among those the larger values first, in parameter order (decode_splitkv's
// default with pages BLOCK_N=64 does not divide: BLOCK_N=32 and the WARPS it needs). Empty when none does.
Config nearest_paged_config(const Family& f, const Config& from, int head_dim, int page_size);
// Likewise, the config nearest `from` that its check accepts at head_dim, its causal check for the mask, and that
// the family calls bitwise reproducible (Family::reproducible): among equally near ones the smaller values first
// (fa3_wgmma_bwd's default with DETERMINISTIC 1, not 2). Empty when none is.
Config nearest_reproducible_config(const Family& f, const Config& from, int head_dim, bool causal);
// What a call runs when its config is rejected or does not compile: the family's default, or for a paged
// query the default's nearest config that reads its pages (nearest_paged_config), for a deterministic
// backward its nearest reproducible config (nearest_reproducible_config).
Config fallback_config(const Family& f, const Query& q);

// The fixed preference where no table rates a candidate: fp32 fwd fa2_simt, fp16/bf16 fwd fa2_mma,
// fp32 bwd fa2_simt_bwd, fp16/bf16 bwd fa2_wgmma_bwd on sm_90 else fa2_mma_bwd. Grouped-query queries
// alike: each of the 16-bit ones supports it (fp32 has no grouped-query family, so no candidate).
const char* preferred_family(const Query& q);

// Among the candidates, the one whose table entry (device table first, then the arch's) measured the
// most TFLOP/s for this query, where a family with a query-length range that has an entry comes before
// every family without one (its entries were measured on shapes of its range, a general family's bucket
// mostly on others: their TFLOP/s do not compare); else the preferred family (never a ranged one: it
// is picked from a table or not at all); nullptr when no family runs the query.
const Family* choose_family(const TableSet&, const Query&);

// A results store's rows read for one pick (one family, device, dtype, direction, head dim and mask, dense or
// paged): at most this many, else the store is refused in one line before any row is read. The largest such
// group in the committed stores holds 6,495 rows; 90,000 took 125 MB at the peak of a lookup (docs/usage.md,
// "Bounds on what is read").
inline constexpr long long kMaxLookupRows = 100000;

struct Pick {
  const Family* family = nullptr;
  Config config;
  std::string source;  // "db", "device", "arch" or "default"
  std::string note;    // why a tabled/stored config was not used, or ""
  // The bucket the config came from, where it is keyed by more than the sequence: a decoding family's by batch x
  // kv heads ("batch x kv heads 64 (of 8, 64, 512), Sk <= 4096"), a grouped-query call's by its group ("group 4
  // (query heads per kv head), S <= 8192"); "" otherwise. explain() shows it.
  std::string bucket;
};

// The config for `f`: the results store at db_path first (when not empty; read-only open, best valid
// row of the query's sequence bucket for this device), then the tables (device -> arch), then the
// family's default. A stored or tabled config that the family's check rejects for this head dim (or, for a
// packed query, its packed form's varlen_check) falls back to the default, with the reason in `note`.
// Packed queries take the dense bucket's config: neither the tables nor selection hold packed rows (a
// length distribution of their own). Paged queries take the first config the family's paged form accepts
// for the page size among: the store's paged bucket, the tables' paged entry (device, arch), the dense pick
// of the same query (store, then tables: a note says so), the family's default, and the default's nearest
// config that reads such pages (noted); `note` names the first one refused and why. Throws UsageError for a
// store that cannot be read.
Pick choose_config(const TableSet&, const Family& f, const Query&, const std::string& db_path = "");

// choose_family then choose_config; family nullptr when unsupported. With a results store, the store's
// family comes first when it holds a pick of a candidate for this query on this device: a family with a
// query-length range that it holds a bucket of, as a table entry of its own does in choose_family, else
// the candidate whose stored pick measured the most TFLOP/s (a store tuned on this GPU rates the families
// as the device's table would, and before the tables).
Pick choose(const TableSet&, const Query&, const std::string& db_path = "");

}  // namespace flashtune::rt
