#include "worker/prepared.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "reference/attention_ref.hpp"

namespace flashtune {

namespace {

constexpr char kMagic[8] = {'F', 'T', 'P', 'R', 'E', 'P', '0', '1'};
constexpr uint64_t kMaxHeader = 1 << 16;

// What a prepared problem holds, from the problem alone (never from a file): its distinct units or heads, the
// reference's shape and sampled rows, and each array's length.
struct Layout {
  bool fwd = true;
  int units = 0, distinct_heads = 0, groups = 0;
  size_t q = 0, k = 0, v = 0, dout = 0;  // input bytes
  ref::Shape shape{1, 1, 1, 1, 1};
  std::vector<int64_t> rows;             // forward: the sampled rows
  size_t nq = 0, nk = 0, lse = 0;        // backward: reference elements of Q- and K-shaped tensors, LSE entries
};

Layout layout_of(const Problem& p, uint64_t seed, long long max_rows) {
  Layout L;
  const size_t elem = dtype_bytes(p.dtype), d = (size_t)p.head_dim;
  if (p.direction != "bwd") {
    L.units = forward_distinct_units(p);
    const size_t unit_q = (size_t)p.group() * p.seq_q * d, unit_k = (size_t)p.seq_k * d;
    L.q = unit_q * L.units * elem;
    L.k = L.v = unit_k * L.units * elem;
    L.shape = with_modifications(ref::Shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal}, p);
    L.shape.heads_k = p.heads_k;
    L.rows = ref::sample_rows(L.shape, max_rows, seed);
    return L;
  }
  // Independent heads' worth of data tiled over all B*H heads: two, or one when a head alone costs ~10^11
  // float64 operations (S = 16k at d = 64 and up); grouped-query attention tiles kv heads with their groups.
  L.fwd = false;
  const int bhk = p.batch * p.kv_heads(), g = p.group();
  const double head_cost = (double)p.seq_q * p.seq_k * p.head_dim;
  L.groups = std::min(bhk, head_cost * g >= 0x1p34 ? 1 : 2);
  L.distinct_heads = L.groups * g;
  const size_t hq = (size_t)p.seq_q * d, hk = (size_t)p.seq_k * d;
  L.q = L.dout = hq * L.distinct_heads * elem;
  L.k = L.v = hk * L.groups * elem;
  L.shape = with_modifications(ref::Shape{1, L.distinct_heads, p.seq_q, p.seq_k, p.head_dim, p.causal}, p);
  L.shape.heads_k = g > 1 ? L.groups : 0;
  L.nq = (size_t)L.shape.q_elements();
  L.nk = (size_t)L.shape.kv_elements();
  L.lse = (size_t)L.shape.q_rows();
  return L;
}

// Calls f(vector, expected length) on every array of `h` in the file's order (H: HostPrepared, const or not).
template <class H, class F>
void for_each_array(H& h, const Layout& L, F&& f) {
  f(h.q, L.q);
  f(h.k, L.k);
  f(h.v, L.v);
  if (L.fwd) {
    const size_t n = L.rows.size() * (size_t)L.shape.head_dim;
    f(h.fwd.o, n);
    f(h.fwd.o_mag, n);
    f(h.fwd.o_logit, n);
    f(h.fwd.lse, L.rows.size());
    f(h.fwd.lse_mag, L.rows.size());
    return;
  }
  f(h.dout, L.dout);
  f(h.bwd.o, L.nq);
  f(h.bwd.lse, L.lse);
  for (auto* a : {&h.bwd.dq, &h.bwd.dq_mag, &h.bwd.dq_logit}) f(*a, L.nq);
  for (auto* a : {&h.bwd.dk, &h.bwd.dk_mag, &h.bwd.dk_logit, &h.bwd.dv, &h.bwd.dv_mag, &h.bwd.dv_logit}) f(*a, L.nk);
  f(h.bounds.dq, L.nq);
  f(h.bounds.dk, L.nk);
  f(h.bounds.dv, L.nk);
}

// A backward's reference covers every element: max_rows plays no part in it.
long long rows_of(const Problem& p, long long max_rows) { return p.direction == "bwd" ? 0 : max_rows; }

nlohmann::json header_of(const Problem& p, uint64_t seed, long long max_rows) {
  return {{"problem", to_json(p)}, {"seed", seed}, {"max_rows", max_rows}};
}

bool write_all(int fd, const void* data, size_t n) {
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, c, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  char* c = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = read(fd, c, std::min<size_t>(n, size_t{1} << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= (size_t)r;
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

bool host_preparable(const Problem& p) { return !p.varlen.enabled() && !p.paged.enabled() && !p.mask_mod.enabled(); }

HostPrepared prepare_host(const Problem& p, uint64_t seed, long long max_rows, int threads,
                          const std::function<void(const char*)>& lap, const InputSource& source,
                          const uint8_t* mask) {
  if (p.varlen.enabled() || p.paged.enabled())
    throw std::invalid_argument("prepare_host: varlen and paged problems are prepared apart");
  if (p.mask_mod.enabled() != (mask != nullptr))
    throw std::invalid_argument("prepare_host: a mask_mod problem takes its materialised mask, and only it");
  const Layout L = layout_of(p, seed, max_rows);
  auto input = [&](uint64_t tag, size_t n, const InputDist& dist) {
    const uint64_t stream = splitmix64(seed ^ tag);
    std::shared_ptr<HostTensor> t = source ? source(n, stream, p.dtype, dist)
                                           : std::make_shared<HostTensor>(generated_input(n, stream, p.dtype, dist, threads));
    if (!t || t->values.size() != n || t->bytes.size() != n * dtype_bytes(p.dtype))
      throw std::logic_error("prepare_host: an input source gave the wrong tensor");
    return t;
  };
  // The bytes, moved out of a tensor nobody else holds.
  auto bytes_of = [](std::shared_ptr<HostTensor>& t) -> std::vector<uint8_t> {
    if (t.use_count() == 1) return std::move(t->bytes);
    return t->bytes;
  };
  auto done = [&](const char* phase) {
    if (lap) lap(phase);
  };
  const size_t elem = dtype_bytes(p.dtype);
  HostPrepared h;
  h.problem = p;
  h.seed = seed;
  h.max_rows = rows_of(p, max_rows);
  h.units = L.units;
  h.distinct_heads = L.distinct_heads;
  h.groups = L.groups;
  // ALiBi: head x's slope that of distinct head x % period, as the runner uploads them (upload_alibi).
  ref::Shape shape = L.shape;
  shape.mask = mask;  // one [Sq, Sk] mask for every head (strides 0: the predicate reads neither b nor h)
  const std::vector<float> slopes =
      !p.alibi ? std::vector<float>{}
      : L.fwd  ? seeded_alibi_slopes((long long)p.batch * p.heads, p.heads, (long long)L.units * p.group())
               : seeded_alibi_slopes(L.distinct_heads, p.heads, L.distinct_heads);
  if (p.alibi) {
    shape.alibi_slopes = slopes.data();
    if (L.fwd) shape.alibi_batch_stride = p.heads;
  }
  if (L.fwd) {
    // One stream per tensor: fresh inputs for every (problem, seed), never zeros, rounded to the kernel's dtype,
    // so the reference sees exactly the kernel's inputs.
    auto q = input(0x51, L.q / elem, p.inputs), k = input(0x4b, L.k / elem, p.inputs),
         v = input(0x56, L.v / elem, p.inputs);
    done("inputs");
    h.fwd = tiled_forward_reference(shape, L.units, q->values.data(), k->values.data(), v->values.data(), L.rows,
                                    threads);
    h.q = bytes_of(q);
    h.k = bytes_of(k);
    h.v = bytes_of(v);
    done("reference");
    return h;
  }
  auto q = input(0x51, L.q / elem, p.inputs), k = input(0x4b, L.k / elem, p.inputs),
       v = input(0x56, L.v / elem, p.inputs), dout = input(0x64, L.dout / elem, grad_dist(p.inputs));
  done("inputs");
  // The distinct heads as one (1, distinct_heads) problem: each head's reference is its own.
  h.bwd = backward_reference(shape, q->values.data(), k->values.data(), v->values.data(), dout->values.data(),
                             threads);
  h.bounds = backward_bounds(p, h.bwd);
  h.q = bytes_of(q);
  h.k = bytes_of(k);
  h.v = bytes_of(v);
  h.dout = bytes_of(dout);
  done("reference");
  return h;
}

HostPrepared prepare_varlen_backward_host(const Problem& p, uint64_t seed, int threads,
                                          const std::function<void(const char*)>& lap) {
  if (!p.varlen.enabled() || p.direction != "bwd")
    throw std::invalid_argument("prepare_varlen_backward_host: " + p.str() + " is not a packed backward problem");
  // Distinct heads' worth of data repeated inside every token, as the dense backward tiles its heads: `units` kv
  // heads (2, or 1 when Hk is 1 or one distinct head's backward costs ~10^11 float64 operations) with their groups.
  const int g = p.group(), d = p.head_dim;
  double cost = 0;  // float64 multiply-adds of one distinct head's backward
  for (size_t b = 0; b < p.varlen.seq_lens_q.size(); ++b)
    cost += (double)p.varlen.seq_lens_q[b] * p.varlen.seq_lens_k[b] * d;
  const int units = std::min(p.kv_heads(), cost * g >= 0x1p34 ? 1 : 2), hd = units * g;
  const int64_t tq = p.varlen.total_q(), tk = p.varlen.total_k();
  HostTensor q = generated_input((size_t)tq * hd * d, splitmix64(seed ^ 0x51), p.dtype, p.inputs, threads),
             k = generated_input((size_t)tk * units * d, splitmix64(seed ^ 0x4b), p.dtype, p.inputs, threads),
             v = generated_input((size_t)tk * units * d, splitmix64(seed ^ 0x56), p.dtype, p.inputs, threads),
             dout = generated_input((size_t)tq * hd * d, splitmix64(seed ^ 0x64), p.dtype, grad_dist(p.inputs), threads);
  if (lap) lap("inputs");
  HostPrepared h;
  h.problem = p;
  h.seed = seed;
  h.distinct_heads = hd;
  h.groups = units;
  if (p.alibi) h.alibi = varlen_backward_alibi_slopes(p, hd);
  h.bwd = varlen_backward_reference(p, hd, units, q.values.data(), k.values.data(), v.values.data(),
                                    dout.values.data(), threads, p.alibi ? h.alibi.data() : nullptr, p.heads);
  h.bounds = backward_bounds(p, h.bwd);
  h.q = std::move(q.bytes);
  h.k = std::move(k.bytes);
  h.v = std::move(v.bytes);
  h.dout = std::move(dout.bytes);
  if (lap) lap("reference");
  return h;
}

double prepare_cost(const Problem& p, long long max_rows) {
  if (!host_preparable(p)) return 0;
  const Layout L = layout_of(p, 0, max_rows);
  const double elem = (double)dtype_bytes(p.dtype);
  const double inputs = (double)(L.q + L.k + L.v + L.dout) / elem;
  const double keys = p.causal ? 0.5 * p.seq_k : (double)p.seq_k;  // a causal row sees about half of them
  const double rows = L.fwd ? (double)L.rows.size() : (double)L.distinct_heads * p.seq_q;
  return rows * keys * p.head_dim * (L.fwd ? 1 : 3) + inputs;
}

void write_prepared(const std::string& path, const HostPrepared& h) {
  const Layout L = layout_of(h.problem, h.seed, h.max_rows);
  for_each_array(h, L, [&](const auto& a, size_t n) {
    if (a.size() != n) throw std::logic_error("write_prepared: an array of " + h.problem.str() + " has the wrong size");
  });
  const std::string header = header_of(h.problem, h.seed, h.max_rows).dump();
  const std::string tmp = path + ".part";
  Fd f;
  unlink(tmp.c_str());
  f.fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (f.fd < 0) throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
  const uint64_t len = header.size();
  bool ok = write_all(f.fd, kMagic, sizeof kMagic) && write_all(f.fd, &len, sizeof len) &&
            write_all(f.fd, header.data(), header.size());
  for_each_array(h, L, [&](const auto& a, size_t) {
    ok = ok && write_all(f.fd, a.data(), a.size() * sizeof(a[0]));
  });
  const double scalars[4] = {L.fwd ? h.fwd.max_abs_v : h.bwd.max_abs_q, h.bwd.max_abs_k, h.bwd.max_abs_do,
                             h.bwd.max_abs_v};
  ok = ok && write_all(f.fd, scalars, sizeof scalars);
  const int err = errno;
  if (close(f.fd) != 0) ok = false;
  f.fd = -1;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(ok ? errno : err));
  }
}

bool read_prepared(const std::string& path, const Problem& p, uint64_t seed, long long max_rows, HostPrepared& out,
                   std::string& why) {
  auto reject = [&](const std::string& reason) {
    why = reason;
    return false;
  };
  if (!host_preparable(p)) return reject("not a dense problem");
  Fd f;
  f.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (f.fd < 0) return reject(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) return reject("not a regular file");
  char magic[8];
  uint64_t len = 0;
  if (!read_all(f.fd, magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    return reject("not a prepared problem (magic)");
  if (!read_all(f.fd, &len, sizeof len) || len == 0 || len > kMaxHeader) return reject("bad header length");
  std::string header(len, '\0');
  if (!read_all(f.fd, header.data(), len)) return reject("short header");
  const nlohmann::json h = nlohmann::json::parse(header, nullptr, false);
  if (!h.is_object() || !h.contains("problem") || !h.contains("seed") || !h.contains("max_rows") ||
      !h["seed"].is_number_unsigned() || !h["max_rows"].is_number_integer())
    return reject("bad header");
  try {
    if (to_json(problem_from_json(h["problem"])) != to_json(p)) return reject("another problem");
  } catch (const std::exception&) {
    return reject("bad problem in header");
  }
  max_rows = rows_of(p, max_rows);
  if (h["seed"].get<uint64_t>() != seed || h["max_rows"].get<long long>() != max_rows)
    return reject("another seed or max_rows");
  // Every size from the expected problem; the file must be exactly that long before anything is allocated.
  const Layout L = layout_of(p, seed, max_rows);
  uint64_t expected = sizeof kMagic + sizeof len + len + 4 * sizeof(double);
  HostPrepared none;
  for_each_array(none, L, [&](auto& a, size_t n) { expected += n * sizeof(a[0]); });
  if ((uint64_t)st.st_size != expected)
    return reject("size " + std::to_string(st.st_size) + " where " + std::to_string(expected) + " belong");
  HostPrepared r;
  r.problem = p;
  r.seed = seed;
  r.max_rows = max_rows;
  r.units = L.units;
  r.distinct_heads = L.distinct_heads;
  r.groups = L.groups;
  bool ok = true;
  for_each_array(r, L, [&](auto& a, size_t n) {
    a.resize(n);
    ok = ok && read_all(f.fd, a.data(), n * sizeof(a[0]));
  });
  double scalars[4];
  if (!ok || !read_all(f.fd, scalars, sizeof scalars)) return reject("short read");
  if (L.fwd) {
    r.fwd.shape = L.shape;
    r.fwd.rows = L.rows;
    r.fwd.max_abs_v = scalars[0];
  } else {
    r.bwd.shape = L.shape;
    r.bwd.max_abs_q = scalars[0];
    r.bwd.max_abs_k = scalars[1];
    r.bwd.max_abs_do = scalars[2];
    r.bwd.max_abs_v = scalars[3];
  }
  out = std::move(r);
  return true;
}

}  // namespace flashtune
