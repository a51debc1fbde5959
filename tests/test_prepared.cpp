// Problems prepared once and ahead (issue 33): worker/prepared.hpp's host side (the inputs and the reference a
// worker's prepare computes) as the worker computed it before, bit for bit; its file read back exactly, and
// refused (the worker then computes the problem itself) unless it is exactly the problem asked for: another
// problem, seed or max_rows, a size off by one byte, a bad magic or header, a link, a folder. PrepareAhead: the
// files in a private folder (0700), each problem once, none for what it cannot prepare, removed when done.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "reference/attention_ref.hpp"
#include "tuner/space/space.hpp"
#include "tuner/sweep/prepare_ahead.hpp"
#include "worker/inputs.hpp"
#include "worker/prepared.hpp"
#include "worker/validate.hpp"

using namespace flashtune;

namespace {

Problem fwd_problem() {
  Problem p;
  p.batch = 2, p.heads = 4, p.seq_q = 96, p.seq_k = 80, p.head_dim = 32, p.dtype = DType::bf16, p.causal = true;
  return p;
}

Problem bwd_problem(int heads_k = 0) {
  Problem p;
  p.batch = 2, p.heads = 4, p.heads_k = heads_k, p.seq_q = 64, p.seq_k = 72, p.head_dim = 32, p.dtype = DType::fp16;
  p.direction = "bwd";
  return p;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void expect_same(const HostPrepared& a, const HostPrepared& b) {
  EXPECT_EQ(a.units, b.units);
  EXPECT_EQ(a.distinct_heads, b.distinct_heads);
  EXPECT_EQ(a.groups, b.groups);
  for (auto m : {&HostPrepared::q, &HostPrepared::k, &HostPrepared::v, &HostPrepared::dout})
    EXPECT_TRUE(same_bits(a.*m, b.*m));
  EXPECT_EQ(a.fwd.rows, b.fwd.rows);
  for (auto m : {&FwdReference::o, &FwdReference::o_mag, &FwdReference::o_logit, &FwdReference::lse,
                 &FwdReference::lse_mag})
    EXPECT_TRUE(same_bits(a.fwd.*m, b.fwd.*m));
  EXPECT_EQ(a.fwd.max_abs_v, b.fwd.max_abs_v);
  for (auto m : {&BwdReference::o, &BwdReference::lse, &BwdReference::dq, &BwdReference::dk, &BwdReference::dv,
                 &BwdReference::dq_mag, &BwdReference::dq_logit, &BwdReference::dk_mag, &BwdReference::dk_logit,
                 &BwdReference::dv_mag, &BwdReference::dv_logit})
    EXPECT_TRUE(same_bits(a.bwd.*m, b.bwd.*m));
  for (auto m : {&BwdReference::max_abs_q, &BwdReference::max_abs_k, &BwdReference::max_abs_do, &BwdReference::max_abs_v})
    EXPECT_EQ(a.bwd.*m, b.bwd.*m);
  for (auto m : {&BwdBounds::dq, &BwdBounds::dk, &BwdBounds::dv}) EXPECT_TRUE(same_bits(a.bounds.*m, b.bounds.*m));
}

struct TmpDir {
  std::string path = make_private_tmpdir("ft-test-prepared");
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

// prepare_host is what the worker's prepare computed before it: the same streams and the same reference calls.
TEST(Prepared, HostSideIsTheWorkersInputsAndReference) {
  const uint64_t seed = 20261121;
  {
    const Problem p = fwd_problem();
    const HostPrepared h = prepare_host(p, seed, 100, 2);
    const int units = forward_distinct_units(p);
    ASSERT_EQ(h.units, units);
    const size_t n = (size_t)p.batch * p.heads * p.seq_q * p.head_dim, nk = (size_t)p.batch * p.heads * p.seq_k * p.head_dim;
    const HostTensor q = generated_input(n, splitmix64(seed ^ 0x51), p.dtype, p.inputs),
                     k = generated_input(nk, splitmix64(seed ^ 0x4b), p.dtype, p.inputs),
                     v = generated_input(nk, splitmix64(seed ^ 0x56), p.dtype, p.inputs);
    ref::Shape shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal};
    const FwdReference want = forward_reference(shape, q.values.data(), k.values.data(), v.values.data(),
                                                 ref::sample_rows(shape, 100, seed));
    EXPECT_TRUE(same_bits(h.q, q.bytes) && same_bits(h.k, k.bytes) && same_bits(h.v, v.bytes));
    EXPECT_EQ(h.fwd.rows, want.rows);
    EXPECT_TRUE(same_bits(h.fwd.o, want.o) && same_bits(h.fwd.lse, want.lse) && same_bits(h.fwd.o_mag, want.o_mag));
    EXPECT_EQ(h.fwd.max_abs_v, want.max_abs_v);
  }
  {
    const Problem p = bwd_problem();
    const HostPrepared h = prepare_host(p, seed, 512, 2);
    ASSERT_EQ(h.distinct_heads, 2);
    ASSERT_EQ(h.groups, 2);
    const size_t hq = (size_t)p.seq_q * p.head_dim * 2, hk = (size_t)p.seq_k * p.head_dim * 2;
    const HostTensor q = generated_input(hq, splitmix64(seed ^ 0x51), p.dtype, p.inputs),
                     k = generated_input(hk, splitmix64(seed ^ 0x4b), p.dtype, p.inputs),
                     v = generated_input(hk, splitmix64(seed ^ 0x56), p.dtype, p.inputs),
                     d = generated_input(hq, splitmix64(seed ^ 0x64), p.dtype, grad_dist(p.inputs));
    const BwdReference want = backward_reference(ref::Shape{1, 2, p.seq_q, p.seq_k, p.head_dim, p.causal},
                                                 q.values.data(), k.values.data(), v.values.data(), d.values.data());
    EXPECT_TRUE(same_bits(h.q, q.bytes) && same_bits(h.dout, d.bytes) && same_bits(h.v, v.bytes));
    EXPECT_TRUE(same_bits(h.bwd.dq, want.dq) && same_bits(h.bwd.dk, want.dk) && same_bits(h.bwd.dv_logit, want.dv_logit));
    EXPECT_TRUE(same_bits(h.bounds.dk, backward_bounds(p, want).dk));
  }
}

// A packed backward's host side (prepare_varlen_backward_host, GpuRunner::prepare_varlen_bwd's) prepares every problem
// of configs/problems/ragged_alibi_varlen_bwd_bf16.json (ALiBi alone and with a window and a softcap; GQA, MQA,
// Sq != Sk both ways, a sequence without keys): the seeded streams of the distinct heads, the kernel's slopes
// [B, H] (varlen_backward_alibi_slopes) and the reference computed from those slopes with stride H; without ALiBi,
// no slopes. A problem that is not a packed backward is refused.
TEST(Prepared, PackedAlibiBackwardHostSide) {
  const uint64_t seed = 20261122;
  const std::vector<Problem> problems =
      load_problems(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/problems/ragged_alibi_varlen_bwd_bf16.json");
  ASSERT_EQ(problems.size(), 3u);
  for (const Problem& p : problems) {
    SCOPED_TRACE(p.str());
    ASSERT_TRUE(p.alibi && p.varlen.enabled() && p.direction == "bwd");
    HostPrepared h;
    ASSERT_NO_THROW(h = prepare_varlen_backward_host(p, seed, 2));
    const int units = h.groups, hd = h.distinct_heads, d = p.head_dim;
    EXPECT_EQ(units, std::min(p.kv_heads(), 2));
    EXPECT_EQ(hd, units * p.group());
    EXPECT_EQ(h.alibi, varlen_backward_alibi_slopes(p, hd));
    const int64_t tq = p.varlen.total_q(), tk = p.varlen.total_k();
    const HostTensor q = generated_input((size_t)tq * hd * d, splitmix64(seed ^ 0x51), p.dtype, p.inputs),
                     k = generated_input((size_t)tk * units * d, splitmix64(seed ^ 0x4b), p.dtype, p.inputs),
                     v = generated_input((size_t)tk * units * d, splitmix64(seed ^ 0x56), p.dtype, p.inputs),
                     dout = generated_input((size_t)tq * hd * d, splitmix64(seed ^ 0x64), p.dtype, grad_dist(p.inputs));
    EXPECT_TRUE(same_bits(h.q, q.bytes) && same_bits(h.k, k.bytes) && same_bits(h.v, v.bytes) &&
                same_bits(h.dout, dout.bytes));
    const BwdReference want = varlen_backward_reference(p, hd, units, q.values.data(), k.values.data(),
                                                        v.values.data(), dout.values.data(), 2, h.alibi.data(), p.heads);
    ASSERT_EQ(h.bwd.dq.size(), (size_t)tq * hd * d);
    ASSERT_EQ(h.bwd.dk.size(), (size_t)tk * units * d);
    EXPECT_TRUE(same_bits(h.bwd.o, want.o) && same_bits(h.bwd.lse, want.lse) && same_bits(h.bwd.dq, want.dq) &&
                same_bits(h.bwd.dk, want.dk) && same_bits(h.bwd.dv, want.dv) && same_bits(h.bwd.dk_logit, want.dk_logit));
    EXPECT_TRUE(same_bits(h.bounds.dq, backward_bounds(p, want).dq));
    // The slopes take part: without them (the same inputs) the gradients differ.
    Problem plain = p;
    plain.alibi = false;
    const BwdReference without = varlen_backward_reference(plain, hd, units, q.values.data(), k.values.data(),
                                                           v.values.data(), dout.values.data(), 2);
    EXPECT_FALSE(same_bits(without.dq, want.dq));
    const HostPrepared hp = prepare_varlen_backward_host(plain, seed, 2);
    EXPECT_TRUE(hp.alibi.empty());
    EXPECT_TRUE(same_bits(hp.bwd.dq, without.dq));
  }
  EXPECT_THROW(prepare_varlen_backward_host(bwd_problem(), seed), std::invalid_argument);
}

TEST(Prepared, FileReadsBackExactly) {
  TmpDir dir;
  for (const Problem& p : {fwd_problem(), bwd_problem(), bwd_problem(2)}) {
    const HostPrepared h = prepare_host(p, 7, 64, 2);
    const std::string path = dir.path + "/p.prep";
    write_prepared(path, h);
    HostPrepared back;
    std::string why;
    ASSERT_TRUE(read_prepared(path, p, 7, 64, back, why)) << p.str() << ": " << why;
    expect_same(h, back);
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // A backward covers every element: max_rows plays no part in it.
    if (p.direction == "bwd") EXPECT_TRUE(read_prepared(path, p, 7, 512, back, why)) << why;
    unlink(path.c_str());
  }
}

// A file is untrusted input: anything but exactly the problem asked for is refused, with a reason, and nothing
// past the expected size is allocated.
TEST(Prepared, FileIsRefusedUnlessItIsExactlyTheProblem) {
  TmpDir dir;
  const Problem p = fwd_problem();
  const std::string path = dir.path + "/p.prep";
  write_prepared(path, prepare_host(p, 7, 64, 2));
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto refused = [&](const std::string& file, const Problem& q, uint64_t seed, long long rows) {
    HostPrepared out;
    std::string why;
    const bool ok = read_prepared(file, q, seed, rows, out, why);
    EXPECT_FALSE(why.empty() && !ok);
    return !ok;
  };
  auto variant = [&](const std::string& content) {
    const std::string f = dir.path + "/v.prep";
    unlink(f.c_str());
    std::ofstream(f, std::ios::binary) << content;
    return f;
  };
  Problem other = p;
  other.causal = false;
  EXPECT_TRUE(refused(path, other, 7, 64));
  EXPECT_TRUE(refused(path, p, 8, 64));
  EXPECT_TRUE(refused(path, p, 7, 65));
  EXPECT_TRUE(refused(variant(bytes.substr(0, bytes.size() - 1)), p, 7, 64));
  EXPECT_TRUE(refused(variant(bytes + "x"), p, 7, 64));
  EXPECT_TRUE(refused(variant("XTPREP01" + bytes.substr(8)), p, 7, 64));
  EXPECT_TRUE(refused(variant(""), p, 7, 64));
  std::string huge = bytes;
  huge[8] = huge[9] = huge[10] = huge[11] = '\xff';  // a header length past the limit
  EXPECT_TRUE(refused(variant(huge), p, 7, 64));
  std::string garbled = bytes;
  garbled[16] = '[';  // the header's JSON, no longer an object
  EXPECT_TRUE(refused(variant(garbled), p, 7, 64));
  const std::string link = dir.path + "/link.prep";
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  EXPECT_TRUE(refused(link, p, 7, 64));
  EXPECT_TRUE(refused(dir.path, p, 7, 64));
  EXPECT_TRUE(refused(dir.path + "/missing.prep", p, 7, 64));
  Problem varlen = p;
  varlen.varlen.lengths = "list";
  varlen.varlen.seq_lens_q = varlen.varlen.seq_lens_k = {96, 40};
  EXPECT_FALSE(host_preparable(varlen));
  EXPECT_TRUE(refused(path, varlen, 7, 64));
  // The original still reads.
  HostPrepared out;
  std::string why;
  EXPECT_TRUE(read_prepared(path, p, 7, 64, out, why)) << why;
}

TEST(PrepareAhead, EachProblemOnceInAPrivateFolderRemovedWhenDone) {
  Problem second = fwd_problem();
  second.causal = false;  // the same streams and sizes: its inputs come from the first one's
  Problem varlen = fwd_problem();
  varlen.varlen.lengths = "list";
  varlen.varlen.seq_lens_q = varlen.varlen.seq_lens_k = {96, 40};
  const std::vector<Problem> problems = {fwd_problem(), second, varlen, bwd_problem()};
  std::string dir;
  {
    PrepareAhead ahead(problems, 11, 32, 1, 2);
    dir = ahead.dir();
    struct stat st {};
    ASSERT_EQ(stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    for (size_t i : {0u, 1u, 3u}) {
      double waited = -1;
      const std::string file = ahead.wait(problems[i], &waited);
      ASSERT_FALSE(file.empty()) << i << ": " << ahead.failure(i);
      EXPECT_GE(waited, 0);
      EXPECT_TRUE(ahead.ready(i));
      HostPrepared h;
      std::string why;
      ASSERT_TRUE(read_prepared(file, problems[i], 11, 32, h, why)) << why;
      expect_same(h, prepare_host(problems[i], 11, 32, 2));
      ahead.done(i);
      EXPECT_FALSE(std::filesystem::exists(file));
      EXPECT_EQ(ahead.wait(problems[i]), "");  // done: nothing to wait for
    }
    EXPECT_EQ(ahead.wait(varlen), "");  // the worker prepares it
    EXPECT_TRUE(ahead.ready(2));
    EXPECT_EQ(ahead.prepared(), 3);
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// Stopped early: the thread ends after the problem it is on, and the folder goes.
TEST(PrepareAhead, StopsWithoutWaitingForTheRest) {
  std::vector<Problem> problems(6, bwd_problem());
  for (size_t i = 0; i < problems.size(); ++i) problems[i].seq_q = 64 + 8 * (int)i;
  std::string dir;
  {
    PrepareAhead ahead(problems, 11, 32, 2, 2);
    dir = ahead.dir();
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// The sweep starts its problems cheapest reference first (tuner/sweep/sweep.cpp, start_order): a backward's whole
// heads cost far more than a forward's sampled rows, a longer sequence more than a shorter one, causal about half.
TEST(Prepared, CostOrdersProblemsByTheirReference) {
  auto make = [](const char* dir, int batch, int s, bool causal) {
    Problem p;
    p.batch = batch, p.heads = 32, p.seq_q = p.seq_k = s, p.head_dim = 64, p.dtype = DType::bf16;
    p.causal = causal, p.direction = dir;
    return p;
  };
  const double fwd_1k = prepare_cost(make("fwd", 16, 1024, false), 512),
               fwd_16k = prepare_cost(make("fwd", 1, 16384, false), 512),
               bwd_1k = prepare_cost(make("bwd", 16, 1024, false), 512),
               bwd_4k = prepare_cost(make("bwd", 4, 4096, false), 512),
               bwd_16k = prepare_cost(make("bwd", 1, 16384, false), 512),
               bwd_16k_causal = prepare_cost(make("bwd", 1, 16384, true), 512);
  EXPECT_GT(fwd_1k, 0);
  EXPECT_LT(fwd_1k, fwd_16k);
  EXPECT_LT(fwd_16k, bwd_4k);
  EXPECT_LT(bwd_1k, bwd_4k);
  EXPECT_LT(bwd_4k, bwd_16k_causal);
  EXPECT_LT(bwd_16k_causal, bwd_16k);
  Problem varlen = make("fwd", 2, 128, false);
  varlen.varlen.lengths = "list";
  varlen.varlen.seq_lens_q = varlen.varlen.seq_lens_k = {96, 40};
  EXPECT_EQ(prepare_cost(varlen, 512), 0);  // the worker prepares it: nothing ahead
}

// A mask_mod problem (issue 32, part 3): never prepared ahead (its reference needs the predicate run on a GPU); the
// worker's prepare_host takes the materialised mask instead, one [Sq, Sk] matrix for every head. With the causal
// mask written as the predicate's matrix, the reference is the causal problem's, bit for bit.
TEST(Prepared, MaskModTakesItsMaterialisedMask) {
  for (Problem causal : {fwd_problem(), bwd_problem(2)}) {
    causal.causal = true;
    Problem masked = causal;
    masked.causal = false;
    masked.mask_mod = mask_mod_from_json(nlohmann::json::parse(R"({"predicate": "kv_idx <= q_idx + 0"})"));
    EXPECT_FALSE(host_preparable(masked));
    EXPECT_THROW(prepare_host(masked, 7, 64, 2), std::invalid_argument);  // no mask given
    std::vector<uint8_t> mask((size_t)causal.seq_q * causal.seq_k);
    for (int i = 0; i < causal.seq_q; ++i)
      for (int j = 0; j < causal.seq_k; ++j) mask[(size_t)i * causal.seq_k + j] = j <= i + causal.seq_k - causal.seq_q;
    EXPECT_THROW(prepare_host(causal, 7, 64, 2, {}, {}, mask.data()), std::invalid_argument);  // a mask, no mask_mod
    const HostPrepared want = prepare_host(causal, 7, 64, 2);
    const HostPrepared got = prepare_host(masked, 7, 64, 2, {}, {}, mask.data());
    EXPECT_TRUE(same_bits(got.q, want.q) && same_bits(got.k, want.k));
    EXPECT_EQ(got.fwd.rows, want.fwd.rows);
    EXPECT_TRUE(same_bits(got.fwd.o, want.fwd.o) && same_bits(got.fwd.lse, want.fwd.lse)) << causal.str();
    EXPECT_TRUE(same_bits(got.fwd.o_logit, want.fwd.o_logit)) << causal.str();
    EXPECT_TRUE(same_bits(got.bwd.dq, want.bwd.dq) && same_bits(got.bwd.dk, want.bwd.dk) &&
                same_bits(got.bwd.dv, want.bwd.dv) && same_bits(got.bwd.lse, want.bwd.lse))
        << causal.str();
  }
}
