// The C ABI (flashtune/attention.h): argument checks, config lookup, kernels from the in-process map,
// the disk cache or NVRTC, and the launches on the caller's stream. The launch sequence is the worker's
// (worker/gpu_runner.cpp: module load, lowered names, >48 KiB shared memory opt-in, zero-filled family
// workspace, kernels in the family's order), on caller-owned tensors instead of test buffers. Dense,
// packed variable-length and paged-cache calls share every step; a packed one runs the families' packed
// forms (kernel<Traits, true>, whose argument is VarlenParams: the dense struct and the device offsets) on
// token-major tensors, a paged one their paged forms (PagedParams: the dense struct, the block table, the
// cache lengths) on the caller's pools in place.
#pragma GCC visibility push(default)
#include "flashtune/attention.h"
#pragma GCC visibility pop

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <array>
#include <atomic>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>

#include "aot.hpp"
#include "args.hpp"
#include "core/cluster_launch.hpp"
#include "core/compile.hpp"
#include "core/mask_summary.hpp"
#include "core/nvrtc_api.hpp"
#include "core/tensor_maps.hpp"
#include "core/util.hpp"
#include "disk_cache.hpp"
#include "driver.hpp"
#include "lookup.hpp"
#include "strided_copy.hpp"
#include "user_store.hpp"
#include "templates/attention_params.h"

namespace flashtune::rt {
namespace {

thread_local std::string t_last_error;

struct Failure {
  ft_status status;
  std::string message;
};
[[noreturn]] void fail(ft_status s, std::string m) { throw Failure{s, std::move(m)}; }

const Driver& drv() {
  std::string why;
  const Driver* d = driver(&why);
  if (!d) fail(FT_NO_GPU, why);
  return *d;
}
void check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS) fail(FT_CUDA_ERROR, std::string(call) + ": " + describe(r));
}
#define FT_CU(fn, ...) check(drv().fn(__VA_ARGS__), #fn)

// ---- process-wide state (one mutex; compiles run outside it) ------------------------------------
struct Compiled {
  std::vector<std::string> names;  // lowered kernel names, launch order
  std::string cubin;
};
struct Loaded {
  CUmodule module = nullptr;
  std::vector<CUfunction> fns;
  // The dynamic shared memory each function is opted in for (cuFuncSetAttribute once per size, not per call).
  std::shared_ptr<std::vector<std::atomic<unsigned>>> smem_optin;
};
struct DeviceDesc {
  std::string name, arch;
  int sm_count = 0;
};
// A plan as the caches hold it: immutable once made (a config that does not compile is replaced by a new one).
struct Resolved {
  Pick pick;
  std::string variant;   // its variant hash (the kernels' key)
  std::string plan_key;  // its key in State::plans
};
struct State {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const Compiled>> compiled;    // variant hash -> cubin
  std::map<std::pair<CUcontext, std::string>, Loaded> modules;        // per context
  std::map<int, CUcontext> primaries;                                 // retained for the process
  std::map<int, DeviceDesc> devices;                                  // each written once, never erased
  std::map<std::string, std::unique_ptr<Compiler>> compilers;         // per arch
  std::map<std::string, std::shared_ptr<const Resolved>> plans;      // plan key -> pick and its variant
  std::map<int, CUmemoryPool> pools;                                  // scratch, per device
};
State& state() {
  static State* s = new State;  // never destroyed: modules may outlive static destruction order
  return *s;
}

std::string encode_payload(const Compiled& c) {
  std::string names;
  for (const auto& n : c.names) names += (names.empty() ? "" : "\n") + n;
  return names + '\0' + c.cubin;
}
std::shared_ptr<const Compiled> decode_payload(const std::string& p) {
  const size_t z = p.find('\0');
  if (z == std::string::npos || z + 1 >= p.size()) return nullptr;
  auto c = std::make_shared<Compiled>();
  c->names = split(p.substr(0, z), '\n');
  c->cubin = p.substr(z + 1);
  return c;
}

// ---- context: the caller's, else the primary context of the pointer's device ---------------------
class ContextScope {
 public:
  explicit ContextScope(const void* ptr) {
    CUcontext cur = nullptr;
    FT_CU(cuCtxGetCurrent, &cur);
    if (cur) {
      ctx_ = cur;
      return;
    }
    int ordinal = -1;
    const CUresult r = drv().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)ptr);
    if (r != CUDA_SUCCESS) fail(FT_INVALID_ARGUMENT, "q.data is not a CUDA device pointer (" + describe(r) + ")");
    {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mu);
      auto it = s.primaries.find(ordinal);
      if (it == s.primaries.end()) {
        CUdevice dev;
        FT_CU(cuDeviceGet, &dev, ordinal);
        CUcontext ctx;
        FT_CU(cuDevicePrimaryCtxRetain, &ctx, dev);
        it = s.primaries.emplace(ordinal, ctx).first;
      }
      ctx_ = it->second;
    }
    FT_CU(cuCtxPushCurrent, ctx_);
    pushed_ = true;
  }
  ~ContextScope() {
    if (pushed_) {
      CUcontext c;
      drv().cuCtxPopCurrent(&c);
    }
  }
  CUcontext get() const { return ctx_; }

 private:
  CUcontext ctx_ = nullptr;
  bool pushed_ = false;
};

// The current context's device, described once per process (a reference into State::devices: never moved,
// never rewritten).
const DeviceDesc& current_device() {
  CUdevice dev;
  FT_CU(cuCtxGetDevice, &dev);
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.devices.find((int)dev); it != s.devices.end()) return it->second;
  }
  char name[256] = {};
  FT_CU(cuDeviceGetName, name, (int)sizeof name - 1, dev);
  int major = 0, minor = 0;
  FT_CU(cuDeviceGetAttribute, &major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  FT_CU(cuDeviceGetAttribute, &minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  int sms = 0;
  FT_CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  DeviceDesc d{name, "sm_" + std::to_string(major) + std::to_string(minor), sms};
  std::lock_guard<std::mutex> lock(s.mu);
  return s.devices.emplace((int)dev, std::move(d)).first->second;  // another thread's, if it came first
}

const Compiler& compiler_for(const std::string& arch) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto& c = s.compilers[arch];
  if (!c) {
    try {
      arch_limits(arch);
    } catch (const std::exception&) {
      s.compilers.erase(arch);
      fail(FT_UNSUPPORTED, "GPU architecture " + arch + " is not supported (sm_80 or newer with a known shared-memory limit)");
    }
    c = std::make_unique<Compiler>(arch);
  }
  return *c;
}

// ---- which kernel ---------------------------------------------------------------------------
// A call's plan (family, config, the kernels' key) depends on the call's query, the device, and the store the
// lookup reads ($FLASHTUNE_DB, else the user's store under $XDG_CACHE_HOME or $HOME: user_store.hpp) and whether
// it reads the committed tables ($FLASHTUNE_TABLES). Three levels answer it:
//  - each thread's own small table (t_plans), keyed by a 40-byte POD of the call (context, direction, dtype, head
//    dim, mask, grouped-query, deterministic, packed, page size, modifications, sequence bucket, query-length
//    class and, inside a query-length range, batch x kv heads) and stamped with the settings' generation: a
//    repeated call's plan is a hash, a compare and an atomic load, with no lock, no string, no allocation, no
//    getenv, no store query; the slot also holds the context's loaded kernels, so the call skips the module
//    maps too;
//  - the process's map (State::plans, under the state's mutex), keyed by the same fields as a string with the
//    device's name, the store's identity (path, inode, size, mtime) and the tables switch, shared by every thread
//    and context;
//  - choose_with_store (lookup.hpp): the tables and the store, the only level that reads the store.
// What makes a thread's entries stale (Settings::generation moves on): the four variables or the store's
// identity changing, seen at the first call after a second has passed since the last look (a call then reads
// the variables and stats the store: the one-second window the runtime always had for a re-tuned store, which
// now holds for the variables too), ft_reload_settings (at the next call, with every plan forgotten), and a config
// that does not compile being replaced by its default (family_kernels). The device's description is read once.
struct Plan {
  const DeviceDesc* device = nullptr;
  Query query;  // the call's; the device's name and arch only where the plan was made here (the slow path)
  const Resolved* resolved = nullptr;      // held by `hold` or by the thread's slot
  std::shared_ptr<const Resolved> hold;
  Problem problem;
  struct FastSlot* slot = nullptr;  // this thread's entry for the call, when it holds the plan
  const Pick& pick() const { return resolved->pick; }
  const std::string& key() const { return resolved->variant; }
};

// The kernels a pick runs on p: the packed form for a packed variable-length batch, the paged form (in the
// pools' layout) for a paged K/V cache.
Variant variant_of(const Pick& pick, const Problem& p) {
  return variant_for(*pick.family, pick.config, p);  // (a mask_mod's predicate too)
}

// The settings plans depend on: the four variables as last read, the store each device's lookup reads, and a
// generation that moves on whenever a plan made before may no longer be the plan now. Read at the first call,
// then again at most once a second (CLOCK_MONOTONIC_COARSE: a few nanoseconds a call) or after
// ft_reload_settings.
struct Settings {
  std::mutex mu;
  std::atomic<int64_t> next_check_ns{0};  // when a call looks again; 0: at the next call
  std::atomic<uint64_t> generation{1};
  bool read = false;                          // env holds the variables
  std::string env;  // FLASHTUNE_DB, XDG_CACHE_HOME, HOME, FLASHTUNE_TABLES (each '\0'-terminated)
  std::map<std::string, StoreChoice> stores;  // device name -> its store under `env`
};
Settings& settings() {
  static Settings* s = new Settings;  // never destroyed, as the state
  return *s;
}
int64_t coarse_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
std::string settings_env() {
  std::string out;
  for (const char* name : {"FLASHTUNE_DB", "XDG_CACHE_HOME", "HOME", "FLASHTUNE_TABLES"}) {
    const char* v = std::getenv(name);
    out += v ? v : "";
    out += '\0';
  }
  return out;
}
// Looks again (the variables, each known device's store), moving the generation on if anything changed.
void refresh_settings(int64_t now) {
  Settings& st = settings();
  std::lock_guard<std::mutex> lock(st.mu);
  if (now < st.next_check_ns.load(std::memory_order_relaxed)) return;  // another thread just did
  bool changed = false;
  if (std::string env = settings_env(); !st.read || env != st.env) {
    changed = st.read;
    st.read = true;
    st.env = std::move(env);
    st.stores.clear();
  } else {
    for (auto& [device, choice] : st.stores) {
      StoreChoice now_choice = store_for(device);
      if (now_choice.identity != choice.identity || now_choice.path != choice.path || now_choice.note != choice.note) {
        choice = std::move(now_choice);
        changed = true;
      }
    }
  }
  if (changed) st.generation.fetch_add(1, std::memory_order_acq_rel);
  st.next_check_ns.store(now + 1000000000, std::memory_order_release);
}
// The settings' generation now (looking again first when a second has passed).
uint64_t settings_generation() {
  Settings& st = settings();
  const int64_t now = coarse_now_ns();
  if (now >= st.next_check_ns.load(std::memory_order_acquire)) refresh_settings(now);
  return st.generation.load(std::memory_order_acquire);
}
// The store a lookup on `device` reads under the settings of `*generation` (set with it, under one lock).
StoreChoice store_choice(const std::string& device, uint64_t* generation) {
  Settings& st = settings();
  std::lock_guard<std::mutex> lock(st.mu);
  *generation = st.generation.load(std::memory_order_acquire);
  auto it = st.stores.find(device);
  if (it == st.stores.end()) {
    if (st.stores.size() > 64) st.stores.clear();  // devices a process sees: a few
    it = st.stores.emplace(device, store_for(device)).first;
  }
  return it->second;
}
// Every thread's plans stale: they look again at their next call.
void bump_settings_generation() { settings().generation.fetch_add(1, std::memory_order_acq_rel); }

// A call's fields a plan depends on besides the device and the store (the same as the plan key's), as a POD.
struct FastKey {
  CUcontext ctx;          // the device, through the context (handles are not reused: the module map keys on them)
  int64_t batch_heads;    // batch x kv heads inside a family's query-length range, else 0
  int32_t head_dim, page_size, seq_bucket, seq_q_class;
  uint32_t mods;
  uint8_t bwd, dtype, flags, group;  // flags: causal 1, gqa 2, deterministic 4, packed 8, token-major pages 16;
                                     // group: Query::group
};
static_assert(sizeof(FastKey) == 40 && std::has_unique_object_representations_v<FastKey>,
              "FastKey is compared and hashed as bytes: no padding");
bool operator==(const FastKey& a, const FastKey& b) { return std::memcmp(&a, &b, sizeof a) == 0; }
size_t fast_hash(const FastKey& k) {
  uint64_t w[5];
  std::memcpy(w, &k, sizeof w);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t x : w) h = (h ^ x) * 0xbf58476d1ce4e5b9ull, h ^= h >> 29;
  return (size_t)h;
}
FastKey fast_key(CUcontext ctx, const Query& q) {
  FastKey k{};
  k.ctx = ctx;
  k.seq_q_class = seq_q_class(q.seq_q);
  // batch x kv heads: a decoding family's second key, which only a query inside a family's query-length range
  // can reach
  k.batch_heads = k.seq_q_class > 0 ? q.batch_heads : 0;
  k.head_dim = q.head_dim;
  k.page_size = q.page_size;
  k.seq_bucket = seq_bucket_of(q.seq);  // the sequence the tables are read at (lookup_seq: a forward's window its own)
  k.mods = q.mods;
  k.bwd = q.direction == "bwd";
  k.dtype = (uint8_t)q.dtype;
  k.flags = (q.causal ? 1 : 0) | (q.gqa ? 2 : 0) | (q.deterministic ? 4 : 0) | (q.varlen ? 8 : 0) |
            (q.page_layout == PageLayout::nhd ? 16 : 0);
  k.group = (uint8_t)q.group;  // 0 or 2..255 (Problem::group_key)
  return k;
}
// One entry of a thread's table: direct-mapped by fast_hash, so a thread's working set of calls (a model's few
// shapes, forward and backward) stays in it; a collision costs the next call the process's map.
struct FastSlot {
  FastKey key{};
  uint64_t generation = 0;  // 0: empty (generations start at 1)
  std::shared_ptr<const Resolved> plan;
  const DeviceDesc* device = nullptr;
  const Loaded* kernels = nullptr;  // the plan's kernels in key.ctx, once a call loaded them
};
constexpr size_t kFastSlots = 64;
thread_local std::array<FastSlot, kFastSlots> t_plans;

// The plan key of State::plans: the fields of FastKey, with the device's name and arch and the store's identity.
std::string plan_key_of(const Query& q, const FastKey& k, const std::string& store_identity) {
  return q.device + '|' + q.arch + '|' + q.direction + '|' + to_string(q.dtype) + '|' + std::to_string(q.head_dim) +
         '|' + (q.causal ? "c" : "n") + (q.gqa ? "g" : "") + (q.deterministic ? "d" : "") + (q.varlen ? "v" : "") +
         (q.page_size ? "p" + std::to_string(q.page_size) : "") + (q.page_layout == PageLayout::nhd ? "n" : "") +
         (q.mods ? "m" + std::to_string(q.mods) : "") + '|' +
         std::to_string(k.seq_bucket) + '|' + std::to_string(k.seq_q_class) + '|' +
         (k.seq_q_class > 0 ? std::to_string(q.batch_heads) : "") + '|' + std::to_string(q.group) + '|' + store_identity;
}

// The plan of a call in context ctx (current): this thread's entry when it is of this generation, else the
// process's map, else choose_with_store (then cached at both levels).
Plan make_plan(CUcontext ctx, const Query& q0, const Problem& p) {
  Plan plan;
  plan.problem = p;
  const FastKey k = fast_key(ctx, q0);
  // A mask_mod's plan is its predicate's too (the kernels' key holds its hash), which FastKey does not: such a call
  // takes the process's map, its key with the hash, and a scratch slot of its own, never the thread's table.
  const bool masked = p.mask_mod.enabled();
  static thread_local FastSlot mask_slot;
  FastSlot& slot = masked ? mask_slot : t_plans[fast_hash(k) % kFastSlots];
  if (masked) slot = FastSlot{};
  if (const uint64_t gen = settings_generation(); !masked && slot.generation == gen && slot.key == k) {
    plan.query = q0;
    plan.device = slot.device;
    plan.resolved = slot.plan.get();
    plan.slot = &slot;
    return plan;
  }
  const DeviceDesc& device = current_device();
  plan.device = &device;
  Query q = q0;
  q.device = device.name;
  q.arch = device.arch;
  // $FLASHTUNE_DB, else the user's store (user_store.hpp); its identity in the plan's key, so that a store
  // re-tuned while this process runs (flashtune.tune) is read by the next call once the settings look again.
  uint64_t gen = 0;
  const StoreChoice store = store_choice(q.device, &gen);
  bool tables = true;  // $FLASHTUNE_TABLES (user_store.hpp): off, as on a GPU with no table
  try {
    tables = committed_tables_on();
  } catch (const std::exception& e) {
    fail(FT_INVALID_ARGUMENT, e.what());
  }
  const std::string plan_key = plan_key_of(q, k, store.identity) + (tables ? "" : "|no-tables") +
                               (masked ? "|mask " + p.mask_mod.predicate.hash() : "");
  plan.query = q;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.plans.find(plan_key); it != s.plans.end()) plan.hold = it->second;
  }
  if (!plan.hold) {
    const Compiler& compiler = compiler_for(q.arch);
    auto r = std::make_shared<Resolved>();
    try {
      r->pick = choose_with_store(tables ? generated_tables() : TableSet{}, q, store);
      if (!tables) {
        const char* off = "the committed tables are off (FLASHTUNE_TABLES=off)";
        r->pick.note = r->pick.note.empty() ? off : r->pick.note + "; " + off;
      }
    } catch (const std::exception& e) {
      fail(FT_INVALID_ARGUMENT, std::string("FLASHTUNE_DB: ") + e.what());
    }
    if (!r->pick.family)
      fail(FT_UNSUPPORTED, "no family runs " + std::string(to_string(q.dtype)) + " " +
                               (q.varlen ? "packed variable-length " : "") + (q.page_size ? "paged K/V cache " : "") +
                               (q.direction == "fwd" ? "forward" : "backward") +
                               (q.mods ? " with " + mods_string(q.mods) : "") +
                               " d=" + std::to_string(q.head_dim) + " on " + q.arch);
    r->variant = compiler.variant_hash(variant_of(r->pick, p));
    r->plan_key = plan_key;
    std::lock_guard<std::mutex> lock(s.mu);
    plan.hold = s.plans.emplace(plan_key, std::move(r)).first->second;  // another thread's, if it came first
  }
  plan.resolved = plan.hold.get();
  slot.key = k;
  slot.generation = gen;
  slot.plan = plan.hold;
  slot.device = &device;
  slot.kernels = nullptr;
  plan.slot = &slot;
  return plan;
}

// Every plan forgotten, the settings read again at the next call (ft_reload_settings).
void reload_settings() {
  {
    Settings& st = settings();
    std::lock_guard<std::mutex> lock(st.mu);
    st.read = false;
    st.stores.clear();
    st.next_check_ns.store(0, std::memory_order_release);
    st.generation.fetch_add(1, std::memory_order_acq_rel);
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.plans.clear();
}

// The kernels embedded in the library (FLASHTUNE_AOT_ARCHS; none without).
const AotTable& embedded() {
  static const AotTable table = aot_table();
  return table;
}
// The embedded entry for `key`, or nullptr.
const AotKernel* aot_kernel(const std::string& key) { return aot_find(embedded(), key); }

// Where a kernel would come from now: "aot" (embedded in the library), "memory", "disk" or "jit".
std::string cache_level(CUcontext ctx, const std::string& key) {
  if (aot_kernel(key)) return "aot";
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.modules.count({ctx, key}) || s.compiled.count(key)) return "memory";
  }
  return DiskCache(DiskCache::default_dir()).contains(key) ? "disk" : "jit";
}

// The cubin for `key`: memory, else the library's embedded kernels, else disk, else `build` (stored on
// disk and in memory).
template <class Build>
std::shared_ptr<const Compiled> cubin_for(const std::string& key, Build build) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.compiled.find(key); it != s.compiled.end()) return it->second;
  }
  std::shared_ptr<const Compiled> c;
  if (const AotKernel* a = aot_kernel(key)) {
    auto aot = std::make_shared<Compiled>();
    aot->names = split(a->names, '\n');
    aot->cubin.assign(reinterpret_cast<const char*>(embedded().blob) + a->offset, a->size);
    c = std::move(aot);
  }
  const DiskCache disk(DiskCache::default_dir());
  if (!c)
    if (auto payload = disk.load(key)) c = decode_payload(*payload);
  if (!c) {
    c = build();
    if (!c) return nullptr;  // a failed compile is not cached
    disk.store(key, encode_payload(*c));
  }
  std::lock_guard<std::mutex> lock(s.mu);
  return s.compiled.emplace(key, c).first->second;
}

const Loaded& load_module(CUcontext ctx, const std::string& key, const Compiled& c) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.modules.find({ctx, key}); it != s.modules.end()) return it->second;
  }
  Loaded l;
  FT_CU(cuModuleLoadData, &l.module, c.cubin.data());
  for (const auto& n : c.names) {
    CUfunction fn;
    FT_CU(cuModuleGetFunction, &fn, l.module, n.c_str());
    l.fns.push_back(fn);
  }
  l.smem_optin = std::make_shared<std::vector<std::atomic<unsigned>>>(l.fns.size());
  std::lock_guard<std::mutex> lock(s.mu);
  // Another thread may have loaded it meanwhile: keep the first (ours stays loaded, a small leak once).
  return s.modules.emplace(std::make_pair(ctx, key), l).first->second;
}

// The plan's kernels in this context; a config that does not compile falls back to the default. A plan from this
// thread's table whose kernels a call loaded before goes straight to them.
const Loaded& family_kernels(CUcontext ctx, Plan& plan) {
  if (plan.slot && plan.slot->kernels && plan.slot->plan.get() == plan.resolved) return *plan.slot->kernels;
  const Compiler& compiler = compiler_for(plan.device->arch);
  const Problem& p = plan.problem;
  std::string first_error;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Variant v = variant_of(plan.pick(), p);
    auto c = cubin_for(plan.key(), [&]() -> std::shared_ptr<const Compiled> {
      KernelRecord k = compiler.compile(v);
      if (k.status != "compiled") {
        first_error = plan.pick().family->name + " " + k.config + ": " + k.status + ": " + brief(k.reason, 200);
        return nullptr;
      }
      auto out = std::make_shared<Compiled>();
      out->names = split(k.lowered_name, '\n');
      out->cubin = std::move(k.cubin);
      return out;
    });
    if (c) {
      const Loaded& l = load_module(ctx, plan.key(), *c);
      if (plan.slot && plan.slot->plan.get() == plan.resolved) plan.slot->kernels = &l;
      return l;
    }
    if (plan.pick().source == "default") break;
    auto r = std::make_shared<Resolved>(*plan.resolved);
    r->pick.note = first_error + ": default used";
    r->pick.source = "default";
    r->pick.bucket.clear();
    r->pick.config = fallback_config(*r->pick.family, plan.query);  // a paged call's: one that reads its pages
    r->variant = compiler.variant_hash(variant_of(r->pick, p));
    plan.hold = r;
    plan.resolved = r.get();
    if (plan.slot) plan.slot->plan = r, plan.slot->kernels = nullptr;
    {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mu);
      s.plans[r->plan_key] = r;  // later calls (and explain) go straight to the default
    }
    bump_settings_generation();  // other threads' tables hold the config that does not compile
    if (plan.slot) plan.slot->generation = settings().generation.load(std::memory_order_acquire);
  }
  fail(FT_COMPILE_ERROR, first_error);
}

// ---- strided copies: arguments in other layouts to and from contiguous scratch -------------------
const Loaded& copy_kernels(CUcontext ctx, const std::string& arch) {
  const std::string key = copy_kernel_hash(arch);
  auto c = cubin_for(key, [&] {
    std::string error;
    auto out = std::make_shared<Compiled>();
    out->cubin = compile_copy_kernel(arch, &error);
    if (out->cubin.empty()) fail(FT_COMPILE_ERROR, error);
    out->names = copy_kernel_names();
    return out;
  });
  return load_module(ctx, key, *c);
}

// ---- one call's tensors and scratch ------------------------------------------------------------
struct Operand {
  TensorArg t;          // the caller's tensor as a [B, H, S, d] view (args.hpp)
  size_t offset = 0;    // in scratch, when packed
  bool packed = false;
  bool view = false;    // a strided input read in place through the family's tensor map (map_only_inputs)
  CUdeviceptr ptr = 0;  // what the kernel sees
};

struct CallLayout {
  Layout layout;
  size_t lse = 0, delta = 0, dq_accum = 0, workspace = 0, workspace_bytes = 0;
};

void launch_copy(const Loaded& copy, CUstream stream, const Operand& o, int elem, CUdeviceptr src, CUdeviceptr dst,
                 int unpack) {
  long long H = o.t.ext[1], S = o.t.ext[2], D = o.t.ext[3], n = o.t.ext[0] * H * S * D;
  long long s[4] = {o.t.stride[0], o.t.stride[1], o.t.stride[2], o.t.stride[3]};
  void* args[] = {&src, &dst, &n, &H, &S, &D, &s[0], &s[1], &s[2], &s[3], &unpack};
  // A thread per 16 bytes where the kernel takes that path (d unit-stride, rows 16-byte aligned: it checks,
  // and its loop covers any count the grid does not), else per element.
  const long long per_thread = (s[3] == 1 && D % (16 / elem) == 0) ? 16 / elem : 1;
  const unsigned blocks = (unsigned)std::min<long long>((n / per_thread + 255) / 256, 1 << 16);
  FT_CU(cuLaunchKernel, copy.fns[elem == 2 ? 0 : 1], blocks, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
}

// Scratch pieces: packed operands, then the per-direction buffers (lse and delta hold a value per query
// row of every head, dq_accum a row of d: Problem::rows_q counts a packed batch's tokens, not B * Sq).
CallLayout layout_for(std::vector<Operand>& ops, const Family& f, const Problem& p, size_t workspace_bytes, bool need_lse,
                      bool bwd) {
  CallLayout c;
  const size_t elem = dtype_bytes(p.dtype);
  const bool dense = !p.varlen.enabled() && !p.paged.enabled();
  for (Operand& o : ops) {
    const bool map_only = std::find(f.map_only_inputs.begin(), f.map_only_inputs.end(), o.t.name) != f.map_only_inputs.end();
    o.view = dense && map_only && !o.t.output && !o.t.packed && !o.t.pool && !is_contiguous(o.t) &&
             map_can_read(o.t.ext, o.t.stride, (int)elem, reinterpret_cast<uintptr_t>(o.t.data));
    o.packed = !direct(o.t) && !o.view;
    if (o.packed) o.offset = c.layout.add((size_t)(o.t.ext[0] * o.t.ext[1] * o.t.ext[2] * o.t.ext[3]) * elem);
  }
  const size_t rows = (size_t)p.rows_q();
  if (need_lse) c.lse = c.layout.add(rows * 4);
  if (bwd) {
    c.delta = c.layout.add(rows * 4);
    c.dq_accum = c.layout.add(rows * p.head_dim * 4);
  }
  c.workspace_bytes = workspace_bytes;
  if (workspace_bytes) c.workspace = c.layout.add(workspace_bytes);
  return c;
}

// The library's own stream-ordered memory pool on the current device, keeping what it frees (release
// threshold: never): a pool that returns memory to the driver at every synchronisation (the device's
// default pool does) maps the backward's dq_accum anew on every call, milliseconds of host time (measured
// on an H100: 0.3-1.3 ms per forward + backward at S = 1k-4k before this pool). Only for callers that give
// neither a workspace nor an allocator; ft_release_scratch trims it.
CUmemoryPool scratch_pool(int dev) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (auto it = s.pools.find(dev); it != s.pools.end()) return it->second;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool pool;
  FT_CU(cuMemPoolCreate, &pool, &props);
  cuuint64_t keep = ~cuuint64_t{0};
  FT_CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  s.pools.emplace(dev, pool);
  return pool;
}

// The caller's scratch allocator (ft_set_scratch_allocator): process-wide, copied by each call under its own
// mutex (not the state's, which compiles and plan lookups hold), so that a call frees with what it allocated.
struct Allocator {
  ft_scratch_alloc_fn alloc = nullptr;
  ft_scratch_free_fn free = nullptr;
  void* user = nullptr;
};
std::mutex g_allocator_mu;
Allocator g_allocator;
Allocator scratch_allocator() {
  std::lock_guard<std::mutex> lock(g_allocator_mu);
  return g_allocator;
}

constexpr uintptr_t kScratchAlign = 256;  // cudaMalloc's; Layout's pieces are 256-byte multiples from the base

// Stream-ordered scratch: allocated at the start of a call, freed on its stream at the end (also when the
// call fails after allocating: the destructor). From the caller's workspace, else the caller's allocator, else
// the library's pool.
class Scratch {
 public:
  // sizer: the function that tells a caller the bytes (named in the error).
  Scratch(size_t bytes, void* given, size_t given_bytes, CUstream s, const char* sizer = "")
      : stream_(s), bytes_(bytes) {
    if (!bytes) return;
    if (given) {
      if (given_bytes < bytes)
        fail(FT_INVALID_ARGUMENT, "workspace_bytes " + std::to_string(given_bytes) + " is less than the " +
                                      std::to_string(bytes) + " this call needs (" + sizer + ")");
      if (reinterpret_cast<uintptr_t>(given) % kScratchAlign)
        fail(FT_INVALID_ARGUMENT, "workspace is not 256-byte aligned (cudaMalloc's alignment)");
      base_ = (CUdeviceptr)given;
      return;
    }
    CUdevice dev;
    FT_CU(cuCtxGetDevice, &dev);
    device_ = (int)dev;
    allocator_ = scratch_allocator();
    if (allocator_.alloc) {
      from_allocator();
      return;
    }
    FT_CU(cuMemAllocFromPoolAsync, &base_, bytes, scratch_pool(device_), stream_);
    owned_ = true;
  }
  ~Scratch() {
    if (!owned_) return;
    if (allocator_.free) allocator_.free(reinterpret_cast<void*>(base_), bytes_, device_, stream_, allocator_.user);
    else drv().cuMemFreeAsync(base_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  CUdeviceptr at(size_t off) const { return base_ + off; }

 private:
  void from_allocator() {
    void* p = allocator_.alloc(bytes_, device_, stream_, allocator_.user);
    if (!p)
      fail(FT_CUDA_ERROR, "the scratch allocator (ft_set_scratch_allocator) gave no memory for " +
                              std::to_string(bytes_) + " bytes on device " + std::to_string(device_));
    if (reinterpret_cast<uintptr_t>(p) % kScratchAlign) {
      allocator_.free(p, bytes_, device_, stream_, allocator_.user);  // not ours to keep: handed straight back
      fail(FT_INVALID_ARGUMENT, "the scratch allocator (ft_set_scratch_allocator) returned a pointer that is not "
                                "256-byte aligned (cudaMalloc's alignment)");
    }
    base_ = (CUdeviceptr)p;
    owned_ = true;
  }

  CUstream stream_;
  size_t bytes_;
  int device_ = 0;
  Allocator allocator_;
  CUdeviceptr base_ = 0;
  bool owned_ = false;
};

// maps: the TMA descriptors of a family that declares tensor maps (the kernels' second parameter).
void launch_family(const Loaded& k, const Plan& plan, void* params, CUstream stream,
                   const AttnTensorMaps* maps = nullptr) {
  Problem on_device = plan.problem;  // the persistent grids' SM count (Problem::sm_count)
  on_device.sm_count = plan.device->sm_count;
  const std::vector<Launch> ls = plan.pick().family->launches(plan.pick().config, on_device);
  void* args[] = {params, const_cast<AttnTensorMaps*>(maps)};
  for (size_t i = 0; i < ls.size() && i < k.fns.size(); ++i) {
    const Launch& l = ls[i];
    std::atomic<unsigned>& optin = (*k.smem_optin)[i];
    if (l.smem_bytes > 48 * 1024 && l.smem_bytes > optin.load()) {
      FT_CU(cuFuncSetAttribute, k.fns[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)l.smem_bytes);
      optin.store(l.smem_bytes);  // a race only sets the attribute twice
    }
    if (l.cluster_x == 1) {
      FT_CU(cuLaunchKernel, k.fns[i], l.grid[0], l.grid[1], l.grid[2], l.threads, 1, 1, l.smem_bytes, stream, args,
            nullptr);
      continue;
    }
    CUlaunchAttribute attr;
    const CUlaunchConfig cfg = cluster_launch_config(l.grid, l.threads, l.smem_bytes, l.cluster_x, stream, attr);
    FT_CU(cuLaunchKernelEx, &cfg, k.fns[i], args, nullptr);
  }
}

// The args structs with score modifications (ft_mods): the dense and packed ones.
template <class Args>
constexpr bool kHasMods = !std::is_same_v<Args, ft_paged_forward_args>;
// With a mask predicate (ft_mask_mod, ABI 0.8): the dense ones.
template <class Args>
constexpr bool kHasMask = std::is_same_v<Args, ft_forward_args> || std::is_same_v<Args, ft_backward_args>;

// A call's checked predicate (check_mask_mod: the call's checks ran first), the thread's last one kept: a model's
// calls repeat one text, which is then compared, not normalised again.
MaskPredicate mask_predicate_of(const ft_mask_mod* m) {
  thread_local std::string last_text, last_names;
  thread_local MaskPredicate last;
  std::string names;
  for (int i = 0; i < m->num_tensors; ++i) names += std::string(m->names[i]) + '\0';
  if (last.enabled() && last_text == m->predicate && last_names == names) return last;
  MaskPredicate pred;
  if (const Check c = check_mask_mod(m, false, &pred); c.status != FT_OK) fail(c.status, c.message);
  last_text = m->predicate, last_names = names, last = pred;
  return pred;
}

// ---- mask_mod's block summary: computed on the call's stream, kept per (stream, key) -------------------------
// The summary's program (core/mask_summary.hpp), compiled once per (arch, predicate) and loaded per context.
const Loaded& summary_kernels(CUcontext ctx, const std::string& arch, const MaskPredicate& m) {
  const std::string key = content_hash("mask_summary|" + arch + "|" + nvrtc_version() + "|" + m.hash() + "|" + m.body);
  auto c = cubin_for(key, [&] {
    auto out = std::make_shared<Compiled>();
    try {
      MaskSummaryProgram prog = compile_mask_summary(m, arch);
      out->cubin = std::move(prog.cubin);
      out->names = std::move(prog.lowered);
    } catch (const UsageError& e) {
      fail(FT_INVALID_ARGUMENT, e.what());
    }
    return out;
  });
  return load_module(ctx, key, *c);
}
// A summary held for later calls: its device memory (the library's pool, freed by ft_release_scratch on the stream
// that made it) and the kernel's view of its lists. Reused only by calls on the same stream, after it in stream
// order: another stream computes its own.
struct MaskSummary {
  CUstream stream = nullptr;
  CUdeviceptr base = 0;
  MaskBlockList blocks{};
};
struct MaskSummaries {
  std::mutex mu;
  std::map<std::string, MaskSummary> held;  // (context, stream, predicate, tensors, shape, blocks) -> summary
};
MaskSummaries& mask_summaries() {
  static MaskSummaries* m = new MaskSummaries;  // never destroyed, as the state
  return *m;
}
constexpr size_t kMaxHeldSummaries = 64;  // past it a call's summary is freed with the call (its stream's order)

// The kernel's MaskModArgs for a call: the tensors and the summary of the plan's blocks (Family::mask_blocks).
MaskModArgs mask_args_for(CUcontext ctx, const Plan& plan, const ft_mask_mod* m, CUstream stream) {
  const Problem& p = plan.problem;
  const MaskPredicate& pred = p.mask_mod.predicate;
  MaskModArgs args{};
  for (int i = 0; i < m->num_tensors; ++i) {  // bound in the predicate's (sorted) order of names
    const auto at = std::find(pred.names.begin(), pred.names.end(), std::string(m->names[i]));
    args.tensor[at - pred.names.begin()] = MaskTensor{m->tensors[i], (int)m->lengths[i]};
  }
  const auto [block_q, block_k] = plan.pick().family->mask_blocks(plan.pick().config);
  std::string key = std::to_string((uintptr_t)ctx) + '|' + std::to_string((uintptr_t)stream) + '|' + pred.hash() + '|' +
                    std::to_string(p.batch) + ',' + std::to_string(p.heads) + ',' + std::to_string(p.heads_k) + ',' +
                    std::to_string(p.seq_q) + ',' + std::to_string(p.seq_k) + ',' + (p.causal ? "c" : "n") + ',' +
                    p.direction + ',' + std::to_string(block_q) + ',' + std::to_string(block_k);
  for (int i = 0; i < m->num_tensors; ++i)
    key += '|' + std::to_string((uintptr_t)m->tensors[i]) + ':' + std::to_string(m->lengths[i]) + ':' +
           std::to_string(m->versions[i]);
  MaskSummaries& all = mask_summaries();
  {
    std::lock_guard<std::mutex> lock(all.mu);
    if (auto it = all.held.find(key); it != all.held.end()) {
      args.blocks = it->second.blocks;
      return args;
    }
  }
  MaskSummaryPlan sp;
  try {
    sp = mask_summary_plan(pred, p.direction == "bwd", p.batch, p.heads, p.heads_k, p.seq_q, p.seq_k, p.causal, block_q,
                           block_k);
  } catch (const UsageError& e) {
    fail(FT_UNSUPPORTED, e.what());
  }
  const Loaded& k = summary_kernels(ctx, plan.device->arch, pred);
  auto round = [](size_t b) { return (b + kScratchAlign - 1) / kScratchAlign * kScratchAlign; };
  const size_t states = round(sp.states_bytes), count = round(sp.count_bytes), total = states + count + round(sp.index_bytes);
  CUdevice dev;
  FT_CU(cuCtxGetDevice, &dev);
  CUdeviceptr base = 0;
  FT_CU(cuMemAllocFromPoolAsync, &base, total, scratch_pool((int)dev), stream);
  sp.states.mask = args;
  sp.states.states = (unsigned char*)base;
  void* sargs[] = {&sp.states};
  FT_CU(cuLaunchKernel, k.fns[0], sp.states_grid[0], sp.states_grid[1], sp.states_grid[2], kMaskStatesThreads, 1, 1, 0,
        stream, sargs, nullptr);
  sp.lists.states = (const unsigned char*)base;
  sp.lists.count = (int*)(base + states);
  sp.lists.index = (int*)(base + states + count);
  void* largs[] = {&sp.lists};
  FT_CU(cuLaunchKernel, k.fns[1], sp.lists_grid, 1, 1, kMaskListsThreads, 1, 1, 0, stream, largs, nullptr);
  args.blocks = sp.blocks;
  args.blocks.count = sp.lists.count;
  args.blocks.index = sp.lists.index;
  std::lock_guard<std::mutex> lock(all.mu);
  if (all.held.size() < kMaxHeldSummaries) all.held.emplace(key, MaskSummary{stream, base, args.blocks});
  else FT_CU(cuMemFreeAsync, base, stream);  // after the call's kernels, in its stream's order
  return args;
}
// ft_release_scratch: every held summary freed on its stream (after the work queued there).
void release_summaries() {
  MaskSummaries& all = mask_summaries();
  std::map<std::string, MaskSummary> held;
  {
    std::lock_guard<std::mutex> lock(all.mu);
    held.swap(all.held);
  }
  for (const auto& [key, m] : held) drv().cuMemFreeAsync(m.base, m.stream);  // unchecked: a stream may be gone
}

template <class Args>
Problem common_problem(const Args* a, const char* direction) {
  Problem p;
  p.batch = a->batch;
  p.heads = a->heads;
  p.heads_k = a->heads_k == a->heads ? 0 : a->heads_k;
  p.head_dim = a->head_dim;
  p.dtype = to_dtype(a->dtype);
  p.causal = a->causal != 0;
  p.direction = direction;
  if constexpr (kHasMods<Args>) {  // checked (check_mods): window 0 or 1, edges -1..2^30, softcap 0 or 1e-3..1e6
    if (a->mods.window) p.window_left = a->mods.window_left, p.window_right = a->mods.window_right;
    p.softcap = a->mods.softcap;
    p.alibi = a->mods.alibi_slopes != nullptr;  // the slopes themselves go to the kernel (with_params)
    p.canonicalize_mask();
  }
  if constexpr (kHasMask<Args>)
    if (a->mask_mod) p.mask_mod.predicate = mask_predicate_of(a->mask_mod);
  return p;
}
template <class Args>
Problem problem_of(const Args* a, const char* direction) {
  Problem p = common_problem(a, direction);
  p.seq_q = a->seq_q;
  p.seq_k = a->seq_k;
  // One query row under the bottom-right mask sees every key (j <= 0 + Sk - 1): the call is the non-causal
  // one, so it takes that kernel and those table entries (decoding is tuned non-causal).
  if (p.seq_q == 1) p.causal = false;
  return p;
}
// A packed batch: the grid's longest lengths, and host-side lengths with the call's totals (args.hpp).
template <class Args>
Problem varlen_problem_of(const Args* a, const char* direction) {
  Problem p = common_problem(a, direction);
  p.seq_q = a->max_seqlen_q;
  p.seq_k = a->max_seqlen_k;
  p.varlen.lengths = "list";
  p.varlen.seq_lens_q = host_lengths(a->batch, a->total_q, a->max_seqlen_q);
  p.varlen.seq_lens_k = host_lengths(a->batch, a->total_k, a->max_seqlen_k);
  return p;
}
Problem problem_of(const ft_varlen_forward_args* a, const char* direction) { return varlen_problem_of(a, direction); }
Problem problem_of(const ft_varlen_backward_args* a, const char* direction) { return varlen_problem_of(a, direction); }
// A paged cache: the longest cache length (the caller's bound, else the capacity) as Sk, for the bucket; the
// kernels read each sequence's own length from cache_seqlens. Sq = 1 with the mask is non-causal, as dense.
Problem problem_of(const ft_paged_forward_args* a, const char* direction) {
  Problem p = common_problem(a, direction);
  p.seq_q = a->seq_q;
  p.seq_k = a->max_seqlen_k > 0 ? a->max_seqlen_k : a->max_pages * a->page_size;
  p.paged.page_size = a->page_size;
  p.paged.layout = a->layout == FT_PAGES_NHD ? PageLayout::nhd : PageLayout::hnd;  // checked: 0 or 1
  if (p.seq_q == 1) p.causal = false;
  return p;
}

Query query_of(const Problem& p) {
  Query q;
  q.direction = p.direction;
  q.dtype = p.dtype;
  q.head_dim = p.head_dim;
  q.causal = p.causal;
  q.seq = lookup_seq(p);  // max(Sq, Sk); a forward's window: the plain call that walks as far
  q.gqa = p.heads_k > 0;
  q.seq_q = p.seq_q;
  q.varlen = p.varlen.enabled();
  q.page_size = p.paged.page_size;
  q.page_layout = p.paged.layout;
  q.batch_heads = p.batch_kv_heads();
  q.group = p.group_key();
  q.mods = problem_mods(p);
  return q;
}
// A call's query: the problem's, and a backward's `deterministic`.
template <class Args>
Query query_of(const Args* a, const Problem& p) {
  Query q = query_of(p);
  if constexpr (std::is_same_v<Args, ft_backward_args> || std::is_same_v<Args, ft_varlen_backward_args>)
    q.deterministic = a->deterministic != 0;
  return q;
}

template <class Args>
std::vector<Operand> operands(const Args* a) {
  std::vector<Operand> ops;
  for (const TensorArg& t : tensor_args(a)) ops.push_back({t});
  return ops;
}

// The element strides of the operands read in place as strided views (q, k, v, o, dout order), for the maps.
std::array<const int64_t*, 5> view_strides(const std::vector<Operand>& ops) {
  std::array<const int64_t*, 5> out{};
  for (size_t i = 0; i < ops.size() && i < out.size(); ++i)
    if (ops[i].view) out[i] = ops[i].t.stride;
  return out;
}

// Packs the inputs, runs `launch`, unpacks the outputs: all on the stream.
template <class Launch>
void with_operands(CUcontext ctx, const Plan& plan, std::vector<Operand>& ops, const Scratch& scratch, CUstream stream,
                   Launch launch) {
  const Problem& p = plan.problem;
  const int elem = dtype_bytes(p.dtype);
  const Loaded* copy = nullptr;
  for (Operand& o : ops) {
    o.ptr = o.packed ? scratch.at(o.offset) : (CUdeviceptr)o.t.data;
    if (o.packed && !copy) copy = &copy_kernels(ctx, plan.device->arch);
    if (o.packed && !o.t.output) launch_copy(*copy, stream, o, elem, (CUdeviceptr)o.t.data, o.ptr, 0);
  }
  launch();
  for (Operand& o : ops)
    if (o.packed && o.t.output) launch_copy(*copy, stream, o, elem, o.ptr, (CUdeviceptr)o.t.data, 1);
}

// A packed variable-length call's args (the kernels' packed form, VarlenParams).
template <class Args>
constexpr bool kPacked = std::is_same_v<Args, ft_varlen_forward_args> || std::is_same_v<Args, ft_varlen_backward_args>;
// A paged K/V cache call's (the kernels' paged form, PagedParams).
template <class Args>
constexpr bool kPaged = std::is_same_v<Args, ft_paged_forward_args>;

// The kernels' argument: the dense struct, or for a packed batch the dense struct followed by the offsets,
// for a paged cache by the block table, the cache lengths and the table's geometry.
// A call with score modifications: that argument followed by AttnMods (ModParams), as its kernels take it.
// A mask_mod: ModParams followed by MaskModArgs (MaskModParams), `mask` its tensors and summary.
template <class Args, class Dense, class F>
void with_params(const Args* a, const Dense& dense, const Problem& p, F launch, const MaskModArgs* mask = nullptr) {
  const bool modified = p.windowed() || p.softcapped() || p.alibi || p.mask_mod.enabled();
  const float* slopes = nullptr;
  long long slopes_stride = 0;
  if constexpr (kHasMods<Args>) slopes = a->mods.alibi_slopes, slopes_stride = a->mods.alibi_batch_stride;
  const AttnMods mods = make_attn_mods(p.window_left, p.window_right, p.softcap, dense.scale, p.alibi ? slopes : nullptr,
                                       slopes_stride);
  auto go = [&](const auto& plain) {
    using Plain = std::decay_t<decltype(plain)>;
    if (!modified) return launch((void*)&plain);
    const ModParams<Plain> with_mods{plain, mods};
    if (mask) {
      const MaskModParams<Plain> with_mask{with_mods, *mask};
      return launch((void*)&with_mask);
    }
    launch((void*)&with_mods);
  };
  if constexpr (kPacked<Args>) {
    go(VarlenParams<Dense>{dense, a->cu_seqlens_q, a->cu_seqlens_k});
  } else if constexpr (kPaged<Args>) {
    go(PagedParams<Dense>{dense, a->block_table, a->cache_seqlens, a->page_size, a->max_pages});
  } else {
    go(dense);
  }
}

template <class Args>
void run_forward(const Args* a, CUstream stream) {
  ContextScope ctx(a->q.data);
  const Problem p = problem_of(a, "fwd");
  Plan plan = make_plan(ctx.get(), query_of(p), p);
  const Loaded& k = family_kernels(ctx.get(), plan);
  std::vector<Operand> ops = operands(a);
  const CallLayout c =
      layout_for(ops, *plan.pick().family, p, plan.pick().family->workspace_bytes(plan.pick().config, p), !a->lse, false);
  Scratch scratch(c.layout.total, nullptr, 0, stream);
  if (c.workspace_bytes && !plan.pick().family->workspace_written)
    FT_CU(cuMemsetD8Async, scratch.at(c.workspace), 0, c.workspace_bytes, stream);
  with_operands(ctx.get(), plan, ops, scratch, stream, [&] {
    const float scale = softmax_scale(a->scale, p.head_dim);
    AttnFwdParams fp{(const void*)ops[0].ptr, (const void*)ops[1].ptr, (const void*)ops[2].ptr, (void*)ops[3].ptr,
                     a->lse ? a->lse : (float*)scratch.at(c.lse),
                     c.workspace_bytes ? (float*)scratch.at(c.workspace) : nullptr,
                     p.batch, p.heads, p.seq_q, p.seq_k, scale, (float)(scale * M_LOG2E), p.heads_k};
    const std::vector<TensorMapSpec> specs = plan.pick().family->tensor_maps(plan.pick().config, p);
    AttnTensorMaps maps{};
    if (!specs.empty() && p.paged.enabled())  // maps describe dense K/V; no paged family declares any
      fail(FT_UNSUPPORTED, plan.pick().family->name + " declares tensor maps, which a paged cache cannot have");
    if (!specs.empty()) {
      try {
        maps = encode_tensor_maps(drv().cuTensorMapEncodeTiled, specs, p,
                                  {ops[0].ptr, ops[1].ptr, ops[2].ptr, ops[3].ptr, 0, view_strides(ops)});
      } catch (const std::exception& e) {
        fail(FT_CUDA_ERROR, std::string("tensor maps of ") + plan.pick().family->name + ": " + e.what());
      }
    }
    MaskModArgs mask{};
    if constexpr (kHasMask<Args>)
      if (a->mask_mod) mask = mask_args_for(ctx.get(), plan, a->mask_mod, stream);
    with_params(a, fp, p, [&](void* params) { launch_family(k, plan, params, stream, &maps); },
                p.mask_mod.enabled() ? &mask : nullptr);
  });
}

CallLayout backward_layout(const Plan& plan, std::vector<Operand>& ops) {
  return layout_for(ops, *plan.pick().family, plan.problem,
                    plan.pick().family->workspace_bytes(plan.pick().config, plan.problem), false, true);
}

template <class Args>
void run_backward(const Args* a, CUstream stream) {
  ContextScope ctx(a->q.data);
  const Problem p = problem_of(a, "bwd");
  Plan plan = make_plan(ctx.get(), query_of(a, p), p);
  const Loaded& k = family_kernels(ctx.get(), plan);
  std::vector<Operand> ops = operands(a);
  const CallLayout c = backward_layout(plan, ops);
  Scratch scratch(c.layout.total, a->workspace, a->workspace_bytes, stream,
                  kPacked<Args> ? "ft_varlen_backward_workspace_bytes" : "ft_backward_workspace_bytes");
  if (c.workspace_bytes && !plan.pick().family->workspace_written)
    FT_CU(cuMemsetD8Async, scratch.at(c.workspace), 0, c.workspace_bytes, stream);
  with_operands(ctx.get(), plan, ops, scratch, stream, [&] {
    const float scale = softmax_scale(a->scale, p.head_dim);
    AttnBwdParams bp{(const void*)ops[0].ptr, (const void*)ops[1].ptr, (const void*)ops[2].ptr,
                     (const void*)ops[3].ptr, a->lse, (const void*)ops[4].ptr, (void*)ops[5].ptr, (void*)ops[6].ptr,
                     (void*)ops[7].ptr, (float*)scratch.at(c.delta), (float*)scratch.at(c.dq_accum),
                     p.batch, p.heads, p.seq_q, p.seq_k, scale, (float)(scale * M_LOG2E),
                     c.workspace_bytes ? (void*)scratch.at(c.workspace) : nullptr, p.heads_k};
    const std::vector<TensorMapSpec> specs = plan.pick().family->tensor_maps(plan.pick().config, p);
    AttnTensorMaps maps{};
    if (!specs.empty()) {
      try {
        maps = encode_tensor_maps(drv().cuTensorMapEncodeTiled, specs, p,
                                  {ops[0].ptr, ops[1].ptr, ops[2].ptr, ops[3].ptr, ops[4].ptr, view_strides(ops)});
      } catch (const std::exception& e) {
        fail(FT_CUDA_ERROR, std::string("tensor maps of ") + plan.pick().family->name + ": " + e.what());
      }
    }
    MaskModArgs mask{};
    if constexpr (kHasMask<Args>)
      if (a->mask_mod) mask = mask_args_for(ctx.get(), plan, a->mask_mod, stream);
    with_params(a, bp, p, [&](void* params) { launch_family(k, plan, params, stream, &maps); },
                p.mask_mod.enabled() ? &mask : nullptr);
  });
}

void copy_str(char* dst, size_t n, const std::string& s) {
  std::snprintf(dst, n, "%s", s.c_str());
}

template <class Args>
std::string explain(const Args* a, const char* direction, ft_explanation* out) {
  ContextScope ctx(a->q.data);
  const Problem p = problem_of(a, direction);
  const Plan plan = make_plan(ctx.get(), query_of(a, p), p);
  const std::string cache = cache_level(ctx.get(), plan.key());
  const std::string config = plan.pick().family->config_string(plan.pick().config);
  if (out) {
    std::memset(out, 0, sizeof *out);
    copy_str(out->family, sizeof out->family, plan.pick().family->name);
    copy_str(out->config, sizeof out->config, config);
    copy_str(out->source, sizeof out->source, plan.pick().source);
    copy_str(out->cache, sizeof out->cache, cache);
    copy_str(out->device, sizeof out->device, plan.device->name);
    copy_str(out->arch, sizeof out->arch, plan.device->arch);
  }
  return plan.pick().family->name + " " + config + " (config: " + plan.pick().source +
         (plan.pick().bucket.empty() ? "" : ", bucket: " + plan.pick().bucket) + ", kernel: " + cache + ") on " +
         plan.device->name + " (" + plan.device->arch + ")" + (plan.pick().note.empty() ? "" : "; " + plan.pick().note);
}

// Every entry point: errors become (status, one line) in the thread's last error.
template <class F>
ft_status guarded(F f) {
  try {
    f();
    t_last_error.clear();
    return FT_OK;
  } catch (const Failure& e) {
    t_last_error = e.message;
    for (char& ch : t_last_error)
      if (ch == '\n') ch = ' ';
    return e.status;
  } catch (const std::bad_alloc&) {
    t_last_error = "out of host memory";
  } catch (const NvrtcUnavailable& e) {  // no NVRTC on this machine: what to install, in one line
    t_last_error = e.what();
    for (char& ch : t_last_error)
      if (ch == '\n') ch = ' ';
    return FT_COMPILE_ERROR;
  } catch (const std::exception& e) {
    t_last_error = std::string("internal error: ") + e.what();
  }
  for (char& ch : t_last_error)
    if (ch == '\n') ch = ' ';
  return FT_CUDA_ERROR;
}
void require(const Check& c) {
  if (c.status != FT_OK) fail(c.status, c.message);
}

Check check_args(const ft_forward_args* a, bool size_limits = true) { return check_forward(a, size_limits); }
Check check_args(const ft_backward_args* a, bool size_limits = true) { return check_backward(a, size_limits); }
Check check_args(const ft_varlen_forward_args* a) { return check_varlen_forward(a); }
Check check_args(const ft_varlen_backward_args* a) { return check_varlen_backward(a); }
Check check_args(const ft_paged_forward_args* a) { return check_paged_forward(a); }
template <class Args>
constexpr bool kForward = std::is_same_v<Args, ft_forward_args> || std::is_same_v<Args, ft_varlen_forward_args> ||
                          kPaged<Args>;
template <class Args>
const char* direction_of() {
  return kForward<Args> ? "fwd" : "bwd";
}

// A dense call whose tensors pass the kernels' 32-bit indexing, and only that (every other check holds), runs
// as chunks of its batch that each fit (batch_chunk), one after the other on the stream. size_chunk: the
// chunk's batches for a call that failed its checks, 0 where it is not so run. The chunk is the largest power of
// two that fits: equal chunks (the most that fit left a last chunk of a batch or two: B 64 x Sk 32k ran 63 + 1),
// and batch sizes the tables' decoding buckets hold (B 64 x Sk 128k ran four chunks of 15 on the B 8 entry, whose
// SPLITS fill the SMs for 8: 0.96 of cuDNN by call on the H200, decode_op_vs_peers.csv).
template <class Args>
constexpr bool kDense = std::is_same_v<Args, ft_forward_args> || std::is_same_v<Args, ft_backward_args>;
template <class Args>
int size_chunk(const Args* args) {
  if constexpr (kDense<Args>) {
    if (args && check_args(args, false).status == FT_OK) {
      const int per = batch_chunk(args);
      if (per >= 1 && per < args->batch) {
        int chunk = 1;
        while (chunk <= per / 2) chunk *= 2;
        return chunk;
      }
    }
  }
  return 0;
}
// f on the call, or on each of its chunks (each checked in full); the call's own refusal otherwise.
template <class Args, class F>
void for_each_chunk(const Args* args, F f) {
  const Check whole = check_args(args);
  if (whole.status == FT_OK) return f(args);
  if constexpr (kDense<Args>) {
    if (const int per = size_chunk(args)) {
      if (args->mask_mod) {  // chunks see batch entries from 0: a predicate reading b would see the wrong ones
        MaskPredicate pred;
        if (check_mask_mod(args->mask_mod, false, &pred).status == FT_OK && pred.reads_batch)
          fail(FT_UNSUPPORTED, "a call past the kernels' 32-bit indexing runs in batch chunks, and a mask_mod that "
                               "reads b does not (split the batch)");
      }
      for (int b0 = 0; b0 < args->batch; b0 += per) {
        const Args part = batch_slice(*args, b0, std::min(per, args->batch - b0));
        require(check_args(&part));
        f(&part);
      }
      return;
    }
  }
  require(whole);
}
// What explain and the workspace size describe: the call, or its first chunk (the largest; a chunked call
// reuses one chunk's workspace for every chunk). Checked.
template <class Args>
Args checked_first_chunk(const Args* args) {
  const Check whole = check_args(args);
  if (whole.status == FT_OK) return *args;
  if constexpr (kDense<Args>) {
    if (const int per = size_chunk(args)) return batch_slice(*args, 0, per);
  }
  require(whole);
  return *args;  // not reached
}

// The bodies of the entry points, one per kind of call (dense or packed, each direction; paged forward).
template <class Args>
ft_status attention_call(const Args* args, void* stream) {
  return guarded([&] {
    for_each_chunk(args, [&](const Args* a) {
      drv();
      if constexpr (kForward<Args>) run_forward(a, (CUstream)stream);
      else run_backward(a, (CUstream)stream);
    });
  });
}
template <class Args>
ft_status workspace_call(const Args* args, size_t* bytes) {
  return guarded([&] {
    if (!bytes) fail(FT_INVALID_ARGUMENT, "bytes is null");
    const Args a = checked_first_chunk(args);
    drv();
    ContextScope ctx(a.q.data);
    const Problem p = problem_of(&a, "bwd");
    const Plan plan = make_plan(ctx.get(), query_of(&a, p), p);
    std::vector<Operand> ops = operands(&a);
    *bytes = backward_layout(plan, ops).layout.total;
  });
}
template <class Args>
ft_status explain_call(const Args* args, ft_explanation* out) {
  return guarded([&] {
    const Args a = checked_first_chunk(args);
    if (!out) fail(FT_INVALID_ARGUMENT, "out is null");
    drv();
    explain(&a, direction_of<Args>(), out);
  });
}
template <class Args>
ft_status explain_text_call(const Args* args, char* buf, size_t size) {
  return guarded([&] {
    const Args a = checked_first_chunk(args);
    if (!buf || !size) fail(FT_INVALID_ARGUMENT, "buf is null or size is 0");
    drv();
    copy_str(buf, size, explain(&a, direction_of<Args>(), nullptr));
  });
}

// The pools, copied out of the state: the driver calls run outside its mutex. None without a driver (a pool
// exists only after a call reached the driver), so no GPU is nothing to do.
std::vector<CUmemoryPool> pools() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<CUmemoryPool> out;
  for (const auto& [dev, pool] : s.pools) out.push_back(pool);
  return out;
}
// Trimmed rather than destroyed: a call on another thread may hold a pool's handle between its lookup and its
// allocation, and a trimmed pool stays valid. The driver keeps what backs blocks whose frees are still queued.
void release_pools() {
  for (CUmemoryPool pool : pools()) FT_CU(cuMemPoolTrimTo, pool, 0);
}
size_t pool_bytes() {
  size_t total = 0;
  for (CUmemoryPool pool : pools()) {
    cuuint64_t reserved = 0;
    FT_CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    total += (size_t)reserved;
  }
  return total;
}

}  // namespace
}  // namespace flashtune::rt

using namespace flashtune::rt;

extern "C" {

ft_status ft_attention_forward(const ft_forward_args* args, void* stream) { return attention_call(args, stream); }
ft_status ft_attention_backward(const ft_backward_args* args, void* stream) { return attention_call(args, stream); }
ft_status ft_backward_workspace_bytes(const ft_backward_args* args, size_t* bytes) { return workspace_call(args, bytes); }
ft_status ft_explain_forward(const ft_forward_args* args, ft_explanation* out) { return explain_call(args, out); }
ft_status ft_explain_backward(const ft_backward_args* args, ft_explanation* out) { return explain_call(args, out); }
ft_status ft_explain_forward_text(const ft_forward_args* args, char* buf, size_t size) {
  return explain_text_call(args, buf, size);
}
ft_status ft_explain_backward_text(const ft_backward_args* args, char* buf, size_t size) {
  return explain_text_call(args, buf, size);
}

ft_status ft_attention_varlen_forward(const ft_varlen_forward_args* args, void* stream) {
  return attention_call(args, stream);
}
ft_status ft_attention_varlen_backward(const ft_varlen_backward_args* args, void* stream) {
  return attention_call(args, stream);
}
ft_status ft_varlen_backward_workspace_bytes(const ft_varlen_backward_args* args, size_t* bytes) {
  return workspace_call(args, bytes);
}
ft_status ft_explain_varlen_forward(const ft_varlen_forward_args* args, ft_explanation* out) {
  return explain_call(args, out);
}
ft_status ft_explain_varlen_backward(const ft_varlen_backward_args* args, ft_explanation* out) {
  return explain_call(args, out);
}
ft_status ft_explain_varlen_forward_text(const ft_varlen_forward_args* args, char* buf, size_t size) {
  return explain_text_call(args, buf, size);
}
ft_status ft_explain_varlen_backward_text(const ft_varlen_backward_args* args, char* buf, size_t size) {
  return explain_text_call(args, buf, size);
}

ft_status ft_attention_paged_forward(const ft_paged_forward_args* args, void* stream) {
  return attention_call(args, stream);
}
ft_status ft_explain_paged_forward(const ft_paged_forward_args* args, ft_explanation* out) {
  return explain_call(args, out);
}
ft_status ft_explain_paged_forward_text(const ft_paged_forward_args* args, char* buf, size_t size) {
  return explain_text_call(args, buf, size);
}

ft_status ft_set_scratch_allocator(ft_scratch_alloc_fn alloc_fn, ft_scratch_free_fn free_fn, void* user) {
  return guarded([&] {
    if (!alloc_fn != !free_fn)
      fail(FT_INVALID_ARGUMENT, std::string(alloc_fn ? "free_fn" : "alloc_fn") +
                                    " is null: give both functions, or neither for the library's pool");
    std::lock_guard<std::mutex> lock(g_allocator_mu);
    g_allocator = Allocator{alloc_fn, free_fn, user};
  });
}

ft_status ft_release_scratch(void) {
  return guarded([] {
    release_summaries();
    release_pools();
  });
}

ft_status ft_check_mask_mod(const ft_mask_mod* mask_mod) {
  return guarded([&] { require(check_mask_mod(mask_mod, true)); });
}

ft_status ft_scratch_pool_bytes(size_t* bytes) {
  return guarded([&] {
    if (!bytes) fail(FT_INVALID_ARGUMENT, "bytes is null");
    *bytes = pool_bytes();
  });
}

ft_status ft_reload_settings(void) {
  return guarded([] { reload_settings(); });
}

ft_status ft_device_available(void) {
  return guarded([] { drv(); });
}

const char* ft_last_error(void) { return t_last_error.c_str(); }

const char* ft_version(void) { return FLASHTUNE_VERSION_STRING; }

}  // extern "C"
