// Spaces and problem sets: parsing, validation (no value reaches a name expression unchecked),
// enumeration.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/compile.hpp"
#include "core/tensor_maps.hpp"
#include "core/util.hpp"
#include "reference/attention_ref.hpp"
#include "fake_driver/record_tensor_map.hpp"
#include "templates/fa2_mma_bwd_traits.h"
#include "templates/fa2_mma_traits.h"
#include "templates/fa2_wgmma_bwd_traits.h"
#include "templates/fa3_wgmma_bwd_traits.h"
#include "templates/fa3_wgmma_traits.h"
#include "tuner/search/search.hpp"
#include "tuner/space/space.hpp"
#include "tuner/sweep/sweep.hpp"

using namespace flashtune;
using nlohmann::json;
using ::testing::HasSubstr;

TEST(Space, CartesianProductInParamOrder) {
  Space s = space_from_json(json::parse(R"({"family":"fa2_simt","params":{"BLOCK_M":[64,128],"BLOCK_N":[32,64],
      "TM":[4],"TN":[4],"KV_STAGES":[1,2]},"head_dims":[64],"causal":[false]})"));
  auto configs = s.configs();
  ASSERT_EQ(configs.size(), 8u);
  EXPECT_EQ(configs.front(), (Config{64, 32, 4, 4, 1}));
  EXPECT_EQ(configs.back(), (Config{128, 64, 4, 4, 2}));
  EXPECT_EQ(s.variants().size(), 8u);
}

TEST(Space, UnnamedParamsTakeTheDefault) {
  Space s = space_from_json(json::parse(R"({"family":"fa2_simt","params":{"BLOCK_M":[128]}})"));
  const Family& f = *s.family;
  ASSERT_EQ(s.configs().size(), 1u);
  Config expect = f.default_config;
  expect[0] = 128;
  EXPECT_EQ(s.configs()[0], expect);
  EXPECT_EQ(s.head_dims, f.head_dims);
  EXPECT_EQ(s.causal.size(), 2u);
}

TEST(Space, RejectsBadValuesBeforeTheyReachSource) {
  auto bad = [](const char* text) { return space_from_json(json::parse(text)); };
  EXPECT_THROW(bad(R"({"family":"nope"})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","params":{"BLOCK_M":["64>; int x; //"]}})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","params":{"BLOCK_M":[63]}})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","params":{"BLOCK_M":[64.5]}})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","params":{"WARPS":[4]}})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","params":{"BLOCK_M":[]}})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","head_dims":[80]})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","dtypes":["bf16"]})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","causal":["yes"]})"), UsageError);
  EXPECT_THROW(bad(R"({"family":"fa2_simt","extra":1})"), UsageError);
  try {
    bad(R"({"family":"fa2_simt","params":{"BLOCK_M":[63]}})");
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("BLOCK_M = 63"), std::string::npos) << e.what();
  }
}

TEST(Family, ParseConfigRoundTripAndValidation) {
  const Family& f = find_family("fa2_simt");
  Config c = f.parse_config("BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2");
  EXPECT_EQ(c, (Config{128, 64, 8, 4, 2}));
  EXPECT_EQ(f.parse_config(f.config_string(c)), c);
  EXPECT_THROW(f.parse_config("BLOCK_M=12x"), UsageError);
  EXPECT_THROW(f.parse_config("BLOCK_M=100"), UsageError);
  EXPECT_THROW(f.parse_config("FOO=1"), UsageError);
  EXPECT_THROW(f.parse_config("BLOCK_M"), UsageError);
  EXPECT_EQ(f.name_expressions(c, 64, true, DType::fp32),
            std::vector<std::string>{"&flashtune::fa2_simt_fwd<flashtune::Fa2SimtTraits<64,128,64,8,4,2,true>>"});
}

TEST(Family, ConstraintsPruneWithReasons) {
  const Family& f = find_family("fa2_simt");
  EXPECT_EQ(f.check({64, 32, 4, 4, 2}, 64), nullptr);
  // TC = 64/4 = 16 threads along N need d % 64 == 0: d = 96 is impossible.
  ASSERT_NE(f.check({64, 64, 4, 4, 2}, 96), nullptr);
  EXPECT_NE(std::string(f.check({64, 64, 4, 4, 2}, 96)).find("D % (4*TC)"), std::string::npos);
  // TC = 128/2 = 64 threads along N cannot be lanes of one warp.
  ASSERT_NE(f.check({32, 128, 2, 2, 1}, 64), nullptr);
  EXPECT_NE(std::string(f.check({32, 128, 2, 2, 1}, 64)).find("TC does not divide 32"), std::string::npos);
  // The default configuration must be valid for every supported head dim.
  for (const auto& fam : families())
    for (int d : fam.head_dims) EXPECT_EQ(fam.check(fam.default_config, d), nullptr) << fam.name << " d" << d;
}

TEST(Family, WgmmaBwdDqReductionPaths) {
  const Family& f = find_family("fa2_wgmma_bwd");
  // DQ_RED 2 stages dQ 32 columns at a time: SPLIT 2 at d = 96 has 48-column chunks and is pruned with why.
  EXPECT_EQ(f.check({64, 64, 2, 2, 2, 0}, 128), nullptr);
  ASSERT_NE(f.check({64, 64, 2, 2, 2, 0}, 96), nullptr);
  EXPECT_NE(std::string(f.check({64, 64, 2, 2, 2, 0}, 96)).find("DQ_RED 2"), std::string::npos);
  ASSERT_NE(f.check({64, 64, 2, 2, 4, 0}, 128), nullptr);
  // DQ_RED 3 stages dQ in the Q/dO slot that the prefetch refills: one stage is pruned with why.
  EXPECT_EQ(f.check({64, 64, 2, 2, 3, 0}, 256), nullptr);
  ASSERT_NE(f.check({64, 64, 2, 1, 3, 0}, 256), nullptr);
  EXPECT_NE(std::string(f.check({64, 64, 2, 1, 3, 0}, 256)).find("STAGES 2"), std::string::npos);
  ASSERT_NE(f.check({64, 64, 2, 2, 3, 0}, 96), nullptr);
  // Shared memory of the dK/dV kernel (the second launch) at d = 256: DQ_RED 2 adds 2 KB per warp and
  // still fits the 227 KB of an sm_90 block with Q/dO double-buffered; DQ_RED 1's padded [64][264] fp32
  // tile does not (the compiler prunes it there), but does with one stage.
  Problem p;
  p.head_dim = 256;
  p.direction = "bwd";
  auto dkdv_smem = [&](const Config& c) { return f.launches(c, p).at(1).smem_bytes; };
  const unsigned sm90_limit = 227 * 1024;
  EXPECT_EQ(dkdv_smem({64, 64, 2, 2, 2, 0}) - dkdv_smem({64, 64, 2, 2, 0, 0}), 8u * 2048u);
  EXPECT_LE(dkdv_smem({64, 64, 2, 2, 2, 0}), sm90_limit);
  EXPECT_EQ(dkdv_smem({64, 64, 2, 1, 1, 0}) - dkdv_smem({64, 64, 2, 1, 0, 0}), 64u * 264u * 4u);
  EXPECT_GT(dkdv_smem({64, 64, 2, 2, 1, 0}), sm90_limit);
  EXPECT_LE(dkdv_smem({64, 64, 2, 1, 1, 0}), sm90_limit);
  // DQ_RED 3's dQ tile ([BM][D] fp32) is exactly the Q/dO slot it reuses ([BM][D] x 2 x 16-bit): no extra bytes.
  EXPECT_EQ(dkdv_smem({64, 64, 2, 2, 3, 0}), dkdv_smem({64, 64, 2, 2, 0, 0}));
}

TEST(Family, WgmmaBwdLoadImages) {
  const Family& f = find_family("fa2_wgmma_bwd");
  ASSERT_NE(f.check({64, 64, 2, 2, 3, 2}, 256), nullptr);
  EXPECT_NE(std::string(f.check({64, 64, 2, 2, 3, 2}, 256)).find("LOAD"), std::string::npos);
  // LOAD 1: Q and dO images (2 bytes each) and lse, delta (4 bytes each) for seq_q rounded up to BLOCK_M
  // rows per (batch, head); the dK/dV kernel adds one mbarrier per stage; the preprocess covers the
  // padded rows (it writes their zeros).
  Problem p;
  p.batch = 2;
  p.heads = 3;
  p.seq_q = 333;
  p.seq_k = 517;
  p.head_dim = 128;
  p.direction = "bwd";
  EXPECT_EQ(f.workspace_bytes({64, 64, 2, 2, 3, 0}, p), 0u);
  EXPECT_EQ(f.workspace_bytes({64, 64, 2, 2, 3, 1}, p), 2u * 3u * 384u * (2u * 2u * 128u + 2u * 4u));
  EXPECT_EQ(f.workspace_bytes({128, 64, 2, 2, 3, 1}, p), 2u * 3u * 384u * (2u * 2u * 128u + 2u * 4u));
  Problem whole = p;  // a multiple of BLOCK_M: no padding
  whole.seq_q = 320;
  EXPECT_EQ(f.workspace_bytes({64, 64, 2, 2, 3, 1}, whole), 2u * 3u * 320u * (2u * 2u * 128u + 2u * 4u));
  const auto with = f.launches({64, 64, 2, 2, 3, 1}, p), without = f.launches({64, 64, 2, 2, 3, 0}, p);
  EXPECT_EQ(with.at(1).smem_bytes - without.at(1).smem_bytes, 2u * 8u);
  EXPECT_EQ(with.at(0).grid[0] * 32u, 384u);
}

// Grouped-query attention (Hq 8 over Hk 2): the preprocess and the dQ conversion run per query head,
// the dK/dV kernel per kv head (it loops over its group's query heads, so dK, dV are summed in its
// registers); LOAD 1's images are per query head (each has its own Q and dO): the same bytes as
// multi-head with Hq heads. heads_k == 0 (multi-head) launches one dK/dV row per head.
TEST(Family, WgmmaBwdGroupedQueryHeads) {
  const Family& f = find_family("fa2_wgmma_bwd");
  EXPECT_TRUE(f.gqa);
  Problem p;
  p.batch = 2, p.heads = 8, p.heads_k = 2, p.seq_q = 333, p.seq_k = 517, p.head_dim = 128;
  p.dtype = DType::bf16, p.direction = "bwd";
  EXPECT_EQ(f.shape_reason(p), "");
  Problem mha = p;
  mha.heads_k = 0;
  for (const Config& c : {Config{64, 64, 2, 2, 3, 1}, Config{64, 128, 0, 2, 0, 0}, Config{128, 64, 1, 1, 1, 1}}) {
    SCOPED_TRACE(f.config_string(c));
    const auto g = f.launches(c, p), m = f.launches(c, mha);
    ASSERT_EQ(g.size(), 3u);
    auto grid = [](const Launch& l) { return std::vector<unsigned>{l.grid[0], l.grid[1], l.grid[2]}; };
    EXPECT_EQ(grid(g[0]), grid(m[0]));  // preprocess: per query head
    EXPECT_EQ(g[0].grid[1], 8u);
    EXPECT_EQ(grid(g[1]), (std::vector<unsigned>{(517u + c[1] - 1) / c[1], 2u, 2u}));  // dK/dV: per kv head
    EXPECT_EQ(m[1].grid[1], 8u);
    EXPECT_EQ(grid(g[2]), grid(m[2]));  // dQ conversion: per query head
    EXPECT_EQ(g[2].grid[1], 8u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(g[i].smem_bytes, m[i].smem_bytes) << i;
    const size_t rows = (333 + c[0] - 1) / c[0] * c[0];
    EXPECT_EQ(f.workspace_bytes(c, p), c[5] == 1 ? 2u * 8u * rows * (2u * 2u * 128u + 2u * 4u) : 0u);
    EXPECT_EQ(f.workspace_bytes(c, p), f.workspace_bytes(c, mha));
  }
  Problem mqa = p;  // multi-query: one kv head, one row of dK/dV CTAs per batch
  mqa.heads_k = 1;
  EXPECT_EQ(f.launches({64, 64, 2, 2, 3, 1}, mqa).at(1).grid[1], 1u);

  // The device stage's inputs: every GQA validation shape has variants of both backward families' spaces,
  // every Llama-3-like point variants of fa2_wgmma_bwd's grid space (a tune with none would be refused).
  const std::string dir = std::string(FLASHTUNE_SOURCE_DIR) + "/configs/";
  const std::vector<Problem> ragged = load_problems(dir + "problems/ragged_gqa_bwd.json");
  std::set<int> groups, dims;
  for (const Problem& q : ragged) {
    SCOPED_TRACE(q.str());
    EXPECT_GT(q.heads_k, 0);
    groups.insert(q.group());
    dims.insert(q.head_dim);
    for (const char* space : {"fa2_wgmma_bwd", "fa2_mma_bwd"})
      EXPECT_FALSE(variants_for(load_space(dir + "spaces/" + space + ".json"), {q}).empty()) << space;
  }
  EXPECT_EQ(groups, (std::set<int>{2, 3, 4, 6, 8}));  // 6 and 8 with one kv head (MQA)
  EXPECT_EQ(dims, (std::set<int>{64, 128, 256}));
  for (const Problem& q : load_problems(dir + "problems/gqa_bwd_bf16.json"))
    EXPECT_FALSE(variants_for(load_space(dir + "spaces/fa2_wgmma_bwd_grid.json"), {q}).empty()) << q.str();
}

// The dK/dV CTA's steps (the kernel walks them with at() once and next() after): from any rotation, count()
// steps visit every (query head of the group, visible block) exactly once, in the flat order u = rot, rot + 1,
// .. mod count (head u / blocks, block first + u % blocks); a group of one is the multi-head order
// first + (t + rot) % blocks the kernel had before grouped-query attention.
TEST(Family, WgmmaBwdQuerySteps) {
  for (int group : {1, 2, 3, 8})
    for (int first : {0, 2})
      for (int blocks = first + 1; blocks <= first + 5; ++blocks) {
        const Fa2WgmmaBwdQuerySteps sched{first, blocks, group};
        const int m = blocks - first;
        ASSERT_EQ(sched.count(), group * m);
        for (int rot = 0; rot < sched.count(); ++rot) {
          SCOPED_TRACE("group " + std::to_string(group) + " blocks " + std::to_string(first) + ".." +
                       std::to_string(blocks) + " rot " + std::to_string(rot));
          std::set<std::pair<int, int>> seen;
          Fa2WgmmaBwdQueryStep st = sched.at(rot);
          for (int t = 0; t < sched.count(); ++t) {
            const int u = (rot + t) % sched.count();
            EXPECT_EQ(st.hq, u / m);
            EXPECT_EQ(st.mb, first + u % m);
            if (group == 1) EXPECT_EQ(st.mb, first + (t + rot) % m);
            EXPECT_TRUE(st.hq >= 0 && st.hq < group && st.mb >= first && st.mb < blocks);
            seen.insert({st.hq, st.mb});
            st = sched.next(st);
          }
          EXPECT_EQ((int)seen.size(), sched.count());
          EXPECT_EQ(st.hq, sched.at(rot).hq);  // back where it started
          EXPECT_EQ(st.mb, sched.at(rot).mb);
        }
      }
}

// DETERMINISTIC (bitwise-reproducible dQ): pruned with its reasons, reproducible by its family, its variants
// named apart (DETERMINISTIC 0 keeps its old name), its turn counters in the workspace (a row each, as lse).
TEST(Family, WgmmaBwdDeterministicPrunes) {
  const Family& f = find_family("fa2_wgmma_bwd");
  ASSERT_EQ(f.params.at(6).name, "DETERMINISTIC");  // a 6-value config (stored, tabled before it) reads 0
  EXPECT_EQ(f.check({64, 64, 2, 2, 3, 1, 1}, 256), nullptr);
  EXPECT_EQ(f.check({64, 64, 0, 2, 3, 0, 2}, 128), nullptr);
  // d 192 has no DQ_RED 3 config (SPLIT 1, 2: 48-column dQ chunks; BLOCK_M 128: shared memory): no deterministic one.
  EXPECT_THAT(f.check({64, 64, 2, 2, 3, 1, 1}, 192), HasSubstr("DQ_RED 2 and 3"));
  EXPECT_EQ(f.check({64, 64, 2, 2, 3, 1}, 256), nullptr);
  EXPECT_THAT(f.check({64, 64, 2, 2, 0, 1, 1}, 256), HasSubstr("DETERMINISTIC needs DQ_RED 3"));
  EXPECT_THAT(f.check({64, 64, 2, 2, 2, 1, 2}, 128), HasSubstr("DETERMINISTIC needs DQ_RED 3"));
  EXPECT_THAT(f.check({64, 64, 2, 1, 3, 1, 1}, 256), HasSubstr("STAGES 2"));  // DQ_RED 3's own condition first
  EXPECT_THAT(fa2_wgmma_bwd_check(256, 64, 64, 2, 2, 3, 1, 3), HasSubstr("DETERMINISTIC must be"));
  EXPECT_THAT(f.causal_check({64, 64, 2, 2, 3, 1, 2}, false), HasSubstr("DETERMINISTIC 2"));
  EXPECT_EQ(f.causal_check({64, 64, 2, 2, 3, 1, 2}, true), nullptr);
  EXPECT_EQ(f.causal_check({64, 64, 2, 2, 3, 1, 1}, false), nullptr);
  EXPECT_EQ(f.causal_check({64, 64, 2, 2, 3, 1}, false), nullptr);
  EXPECT_FALSE(f.reproducible({64, 64, 2, 2, 3, 1}));
  EXPECT_FALSE(f.reproducible({64, 64, 2, 2, 3, 1, 0}));
  EXPECT_TRUE(f.reproducible({64, 64, 2, 2, 3, 1, 1}));
  EXPECT_TRUE(f.reproducible(f.parse_config("BLOCK_M=64,DQ_RED=3,STAGES=2,DETERMINISTIC=2")));
  EXPECT_EQ(f.parse_config("BLOCK_M=64,BLOCK_N=64,SPLIT=2,STAGES=2,DQ_RED=3,LOAD=1"), (Config{64, 64, 2, 2, 3, 1, 0, 0}));
  const Compiler sm90("sm_90");
  EXPECT_THAT(sm90.prune_before_compile(Variant{&f, {64, 64, 2, 2, 3, 1, 2}, 256, false, DType::bf16}),
              HasSubstr("DETERMINISTIC 2"));
  EXPECT_EQ(sm90.prune_before_compile(Variant{&f, {64, 64, 2, 2, 3, 1, 2}, 256, true, DType::bf16}), "");
  EXPECT_EQ(sm90.prune_before_compile(Variant{&f, {64, 64, 2, 2, 3, 1, 1}, 128, true, DType::bf16, true}), "");
  EXPECT_EQ(f.name_expressions({64, 64, 2, 2, 3, 1, 0}, 256, true, DType::bf16).at(1),
            "&flashtune::fa2_wgmma_bwd_dkdv<flashtune::Fa2WgmmaBwdTraits<256,64,64,2,2,3,1,1,true>>");
  EXPECT_EQ(f.name_expressions({64, 64, 2, 2, 3, 1, 2}, 256, true, DType::bf16, true).at(1),
            "&flashtune::fa2_wgmma_bwd_dkdv<flashtune::Fa2WgmmaBwdTraits<256,64,64,2,2,3,1,1,true,2>, true>");
  EXPECT_TRUE((Fa2WgmmaBwdTraits<256, 64, 64, 2, 2, 3, 1, 1, true, 2>::kDeterministic));
  EXPECT_FALSE((Fa2WgmmaBwdTraits<256, 64, 64, 2, 2, 3, 1, 1, true>::kDeterministic));
  // The turn counters: 4 bytes per query row of every (batch, query head) after LOAD 1's images; packed per token.
  Problem p;
  p.batch = 2, p.heads = 8, p.heads_k = 2, p.seq_q = 333, p.seq_k = 517, p.head_dim = 256;
  p.direction = "bwd", p.dtype = DType::bf16;
  for (int load : {0, 1})
    EXPECT_EQ(f.workspace_bytes({64, 64, 2, 2, 3, load, 1}, p) - f.workspace_bytes({64, 64, 2, 2, 3, load, 0}, p),
              4u * 2u * 8u * 333u);
  EXPECT_EQ(f.workspace_bytes({64, 64, 2, 2, 3, 1}, p), f.workspace_bytes({64, 64, 2, 2, 3, 1, 0}, p));
  Problem packed = problems_from_json(json::parse(
      R"({"problems":[{"heads":8,"heads_k":2,"head_dim":128,"dtype":"bf16","direction":"bwd",
          "varlen":{"seq_lens":[1,0,129,64,300]}}]})")).at(0);
  EXPECT_EQ(f.workspace_bytes({64, 64, 2, 2, 3, 1, 2}, packed) - f.workspace_bytes({64, 64, 2, 2, 3, 1, 0}, packed),
            4u * 8u * 494u);
}

// The deterministic dQ's order (fa3_wgmma_bwd and fa2_wgmma_bwd), against the kernels' walk: the key blocks whose
// walks (first visible query block max(0, j BN - (Sk - Sq)) / BM, as the kernels' first query block) reach query
// block m are exactly 0 .. J(m) (bwd_dq_last_key_block), so each turn 0 .. J(m) is taken once, ascending (1) or
// descending (2), the diagonal block first.
TEST(Family, BwdDqTurnsFollowTheWalks) {
  for (int BM : {64, 128})
    for (int BN : {64, 128, 192})
      for (int sq : {1, 63, 64, 65, 200, 517, 1000})
        for (int sk : {1, 63, 64, 65, 200, 333, 1000}) {
          const int nb = (sk + BN - 1) / BN, num_m = (sq + BM - 1) / BM;
          for (int m = 0; m < num_m; ++m) {
            int last = -1;
            for (int j = 0; j < nb; ++j)
              if (std::max(0, j * BN - (sk - sq)) / BM <= m) {
                EXPECT_EQ(last, j - 1) << "a gap below key block " << j;
                last = j;
              }
            ASSERT_EQ(bwd_dq_last_key_block(m, BM, BN, sq, sk), last) << BM << " " << BN << " " << sq << " " << sk << " " << m;
            std::set<int> up, down;
            for (int j = 0; j <= last; ++j) {
              up.insert(bwd_dq_turn(1, j, m, BM, BN, sq, sk));
              down.insert(bwd_dq_turn(2, j, m, BM, BN, sq, sk));
            }
            std::set<int> all;
            for (int t = 0; t <= last; ++t) all.insert(t);
            EXPECT_EQ(up, all);
            EXPECT_EQ(down, all);
            EXPECT_EQ(up, down);
            if (last >= 0) EXPECT_EQ(*down.rbegin(), last);
            if (last >= 0) EXPECT_EQ(bwd_dq_turn(2, last, m, BM, BN, sq, sk), 0);  // the diagonal block first
          }
        }
}

// A deterministic backward's whole dK/dV grid, emulated (fa2_wgmma_bwd and fa3_wgmma_bwd): CTAs launched in the
// grid's linear order (x fastest) onto `slots` resident places (a CTA holds its place until done), cta_at(x, y, z)
// giving each its (kv head, batch) pair (past the last pair: no work, the kernels' early return) and key block;
// each walks every query head of its kv head's group, its visible query blocks in order from the first
// (Fa2WgmmaBwdQuerySteps from step 0; fa3_wgmma_bwd's Steps walk the same order), waiting at each for its turn
// (bwd_dq_turn), adding and passing it on. Returns false on a deadlock; else expects every (pair, query head,
// block) to have received its contributors in key-block order, and each (pair, key block) launched once.
struct EmulatedCta {
  int pair, key_block;
};
struct DetGridCase {
  int order;  // DETERMINISTIC
  bool causal;
  int BM, BN, sq, sk;
  int pairs, group;  // (kv head, batch) pairs; query heads per kv head
};
template <class CtaAt>
bool emulate_det_grid(const DetGridCase& c, const GridDims& g, int slots, CtaAt cta_at) {
  const int nb = (c.sk + c.BN - 1) / c.BN, num_m = (c.sq + c.BM - 1) / c.BM;
  std::vector<int> counter((size_t)c.pairs * c.group * num_m, 0);
  std::vector<std::vector<int>> adds(counter.size());  // key blocks in the order they added
  std::set<std::pair<int, int>> launched_work;
  struct Cta {
    int pair, j, left;
    Fa2WgmmaBwdQuerySteps steps;
    Fa2WgmmaBwdQueryStep st;
  };
  std::vector<Cta> running;
  const long long total = (long long)g.x * g.y * g.z;
  long long launched = 0;
  for (;;) {
    while ((int)running.size() < slots && launched < total) {
      const int x = (int)(launched % g.x), y = (int)(launched / g.x % g.y), z = (int)(launched / g.x / g.y);
      ++launched;
      const EmulatedCta w = cta_at(x, y, z);
      if (w.pair >= c.pairs) continue;
      EXPECT_TRUE(w.pair >= 0 && w.key_block >= 0 && w.key_block < nb) << w.pair << " " << w.key_block;
      EXPECT_TRUE(launched_work.insert({w.pair, w.key_block}).second) << w.pair << " " << w.key_block;
      const int first = c.causal ? std::max(0, w.key_block * c.BN - (c.sk - c.sq)) / c.BM : 0;
      const Fa2WgmmaBwdQuerySteps steps{first, num_m, c.group};
      if (steps.count() > 0) running.push_back(Cta{w.pair, w.key_block, steps.count(), steps, steps.at(0)});
    }
    if (running.empty()) break;
    bool moved = false;
    for (size_t i = 0; i < running.size();) {
      Cta& r = running[i];
      const int at = (r.pair * c.group + r.st.hq) * num_m + r.st.mb;
      if (counter[at] == bwd_dq_turn(c.order, r.j, r.st.mb, c.BM, c.BN, c.sq, c.sk)) {
        adds[at].push_back(r.j);
        ++counter[at];
        moved = true;
        r.st = r.steps.next(r.st);
        if (--r.left == 0) {
          running.erase(running.begin() + (long)i);
          continue;
        }
      }
      ++i;
    }
    if (!moved) return false;
  }
  EXPECT_EQ((int)launched_work.size(), c.pairs * nb);
  for (int pr = 0; pr < c.pairs; ++pr)
    for (int hq = 0; hq < c.group; ++hq)
      for (int m = 0; m < num_m; ++m) {
        const int last = c.causal ? bwd_dq_last_key_block(m, c.BM, c.BN, c.sq, c.sk) : nb - 1;
        const std::vector<int>& a = adds[(pr * c.group + hq) * num_m + m];
        EXPECT_EQ((int)a.size(), last + 1) << pr << " " << hq << " " << m;
        for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k], c.order == 2 ? last - (int)k : (int)k);
      }
  return true;
}

// fa2_wgmma_bwd's DETERMINISTIC protocol, emulated: CTAs launched in linear order onto `slots` resident places (a
// CTA holds its place until done), each walking its steps from step 0 (Fa2WgmmaBwdQuerySteps, every query head of
// the group), waiting at each for its turn at that query head's block, adding and passing it on. It never
// deadlocks, each (head, block) receives its contributors in key-block order, ascending or descending; and
// DETERMINISTIC 2 launched ascending (not from the last key block down) does deadlock with few places.
TEST(Family, WgmmaBwdDeterministicTurns) {
  for (unsigned x = 0; x < 5; ++x) {
    EXPECT_EQ(fa2_wgmma_bwd_key_block(1, x, 5), x);
    EXPECT_EQ(fa2_wgmma_bwd_key_block(2, x, 5), 4 - x);
  }

  // Returns false on a deadlock. order: DETERMINISTIC; launch_down: key blocks launched from the last down. One
  // (kv head, batch) pair: the grid's row of key blocks (emulate_det_grid).
  auto emulate = [](int order, bool launch_down, bool causal, int BM, int BN, int sq, int sk, int group, int slots) {
    const int nb = (sk + BN - 1) / BN;
    return emulate_det_grid(DetGridCase{order, causal, BM, BN, sq, sk, 1, group}, GridDims{nb, 1, 1}, slots,
                            [&](int x, int, int) {
                              return EmulatedCta{0, (int)fa2_wgmma_bwd_key_block(launch_down ? 2 : 1, (unsigned)x,
                                                                                 (unsigned)nb)};
                            });
  };
  for (bool causal : {false, true})
    for (int order : {1, 2}) {
      if (order == 2 && !causal) continue;  // the causal check's prune
      for (int group : {1, 3})
        for (int slots : {1, 2, 5, 64})
          for (auto [sq, sk] : {std::pair{517, 1000}, std::pair{1000, 333}, std::pair{64, 64}, std::pair{300, 300}}) {
            SCOPED_TRACE("order " + std::to_string(order) + " causal " + std::to_string(causal) + " group " +
                         std::to_string(group) + " slots " + std::to_string(slots) + " sq " + std::to_string(sq) +
                         " sk " + std::to_string(sk));
            EXPECT_TRUE(emulate(order, order == 2, causal, 64, 64, sq, sk, group, slots));
            EXPECT_TRUE(emulate(order, order == 2, causal, 128, 64, sq, sk, group, slots));
          }
    }
  EXPECT_FALSE(emulate(2, false, true, 64, 64, 1000, 1000, 1, 2));  // descending turns, ascending launch
}


// fa2_wgmma_bwd's DETERMINISTIC protocol over the whole grid (emulate_det_grid), SCHED 0, 1 and 3: the family's grid
// (fa2_wgmma_bwd_dkdv_grid) and the kernel's mapping (fa2_wgmma_bwd_work, DETERMINISTIC 2 counting key blocks from
// the last down) over sequences x kv heads x query heads, 1-16 resident CTAs, groups of 1, 2 and 5 pairs (5 leaves
// a short last group). Never a deadlock, each block's adds in order; the control, descending turns launched
// ascending, deadlocks under either order of the grid.
TEST(Family, WgmmaBwdDeterministicGridNeverDeadlocks) {
  // launch_down: the mapping's key blocks from the last down (DETERMINISTIC 2's), else ascending.
  auto emulate = [](int sched, int order, bool launch_down, bool causal, int BN, int sq, int sk, int batch, int hk,
                    int group, int slots, int pair_group) {
    const GridDims g = fa2_wgmma_bwd_dkdv_grid(batch, hk, sk, BN, sched, pair_group);
    auto cta_at = [&](int x, int y, int z) {
      const Fa2WgmmaBwdWork w = fa2_wgmma_bwd_work(sched, launch_down ? 2 : 1, hk, GridDims{x, y, z}, g);
      return EmulatedCta{(int)(w.batch * hk + w.kv_head), (int)w.key_block};
    };
    return emulate_det_grid(DetGridCase{order, causal, 64, BN, sq, sk, batch * hk, group}, g, slots, cta_at);
  };
  for (int sched : {0, 1, 3})
    for (bool causal : {false, true})
      for (int order : {1, 2}) {
        if (order == 2 && !causal) continue;  // the causal check's prune
        for (int BN : {64, 128})
          for (int slots : {1, 3, 16})
            for (auto [sq, sk] : {std::pair{517, 1000}, std::pair{1000, 333}, std::pair{300, 300}})
              for (int pair_group : {1, 2, 5, 6}) {
                if (sched == 0 && pair_group != 1) continue;  // SCHED 0's grid has no groups
                if ((sched == 1) != (pair_group == 6)) continue;  // SCHED 1: one group of the 6 pairs
                SCOPED_TRACE("sched " + std::to_string(sched) + " order " + std::to_string(order) + " causal " +
                             std::to_string(causal) + " BN " + std::to_string(BN) + " slots " + std::to_string(slots) +
                             " sq " + std::to_string(sq) + " sk " + std::to_string(sk) + " pair group " +
                             std::to_string(pair_group));
                // 3 sequences x 2 kv heads (6 pairs), 2 query heads each.
                EXPECT_TRUE(emulate(sched, order, order == 2, causal, BN, sq, sk, 3, 2, 2, slots, pair_group));
              }
      }
  for (int sched : {0, 1, 3}) EXPECT_FALSE(emulate(sched, 2, false, true, 64, 1000, 1000, 1, 1, 1, 2, 1)) << sched;
}

// SCHED (the dK/dV grid's order): 0 as before (names, grid, a 7-value config), 3 fa3_wgmma_bwd's pairs in L2-sized
// groups: its grid, each (key block, pair) of its mapping exactly once, the last group's CTAs past the pairs idle,
// DETERMINISTIC 2's key blocks from the last down on y; dense and packed.
TEST(Family, WgmmaBwdSched) {
  const Family& f = find_family("fa2_wgmma_bwd");
  ASSERT_EQ(f.params.back().name, "SCHED");  // last: a 7-value config (stored, tabled before it) reads 0
  EXPECT_EQ(f.params.back().domain, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(f.default_config.size(), f.params.size());
  const Config old7{64, 64, 2, 2, 3, 1, 1}, sched0{64, 64, 2, 2, 3, 1, 1, 0}, sched3{64, 64, 2, 2, 3, 1, 1, 3};
  EXPECT_EQ(f.check(old7, 256), nullptr);
  EXPECT_EQ(f.check(sched3, 256), nullptr);
  EXPECT_EQ(f.check({64, 64, 2, 2, 3, 1, 0, 3}, 256), nullptr);  // non-deterministic too
  EXPECT_EQ(f.check({64, 128, 0, 2, 0, 0, 0, 3}, 128), nullptr);
  for (int bad : {2, 4})
    EXPECT_THAT(f.check({64, 64, 2, 2, 3, 1, 1, bad}, 256), HasSubstr("SCHED must be 0")) << bad;
  EXPECT_THAT(fa2_wgmma_bwd_check(256, 64, 64, 2, 2, 3, 1, 1, 2), HasSubstr("SCHED must be 0"));
  EXPECT_EQ(f.causal_check({64, 64, 2, 2, 3, 1, 2, 3}, true), nullptr);
  EXPECT_THAT(f.causal_check({64, 64, 2, 2, 3, 1, 2, 3}, false), HasSubstr("DETERMINISTIC 2"));
  EXPECT_TRUE(f.reproducible(sched3));
  EXPECT_FALSE(f.reproducible({64, 64, 2, 2, 3, 1, 0, 3}));
  // Names: SCHED 0 (and a 7-value config) keeps the name it had; 3 is written after DETERMINISTIC (0 included).
  for (bool packed : {false, true}) {
    EXPECT_EQ(f.name_expressions(old7, 256, true, DType::bf16, packed), f.name_expressions(sched0, 256, true, DType::bf16, packed));
    EXPECT_EQ(f.name_expressions({64, 64, 2, 2, 3, 1, 0, 0}, 256, true, DType::bf16, packed),
              f.name_expressions({64, 64, 2, 2, 3, 1}, 256, true, DType::bf16, packed));
  }
  EXPECT_EQ(f.name_expressions(sched0, 256, true, DType::bf16).at(1),
            "&flashtune::fa2_wgmma_bwd_dkdv<flashtune::Fa2WgmmaBwdTraits<256,64,64,2,2,3,1,1,true,1>>");
  EXPECT_EQ(f.name_expressions(sched3, 256, true, DType::bf16).at(1),
            "&flashtune::fa2_wgmma_bwd_dkdv<flashtune::Fa2WgmmaBwdTraits<256,64,64,2,2,3,1,1,true,1,3>>");
  EXPECT_EQ(f.name_expressions({64, 64, 2, 2, 3, 1, 0, 3}, 256, false, DType::bf16, true).at(1),
            "&flashtune::fa2_wgmma_bwd_dkdv<flashtune::Fa2WgmmaBwdTraits<256,64,64,2,2,3,1,1,false,0,3>, true>");
  EXPECT_TRUE((Fa2WgmmaBwdTraits<256, 64, 64, 2, 2, 3, 1, 1, true, 1, 3>::kPairGroups));
  EXPECT_FALSE((Fa2WgmmaBwdTraits<256, 64, 64, 2, 2, 3, 1, 1, true, 1>::kPairGroups));
  const Compiler sm90("sm_90");
  Variant packed{&f, sched3, 256, true, DType::bf16, true};
  EXPECT_EQ(sm90.prune_before_compile(packed), "");  // the packed form too: sequence = pair / kv heads

  // Grids: SCHED 0 {key blocks, kv heads, batch} as before (a 7-value config the same); SCHED 3 {group, key blocks,
  // groups}, the group by bwd_pair_group (the Q and dO of its pairs within 16 MB).
  auto dims = [](const Launch& l) { return std::vector<unsigned>{l.grid[0], l.grid[1], l.grid[2]}; };
  Problem p;
  p.batch = 2, p.heads = 8, p.heads_k = 2, p.seq_q = 333, p.seq_k = 517, p.head_dim = 256;
  p.dtype = DType::bf16, p.direction = "bwd";
  EXPECT_EQ(dims(f.launches(old7, p).at(1)), (std::vector<unsigned>{9, 2, 2}));
  EXPECT_EQ(dims(f.launches(sched0, p).at(1)), (std::vector<unsigned>{9, 2, 2}));
  EXPECT_EQ(dims(f.launches(sched3, p).at(1)), (std::vector<unsigned>{4, 9, 1}));  // 4 pairs of 1.4 MB: one group
  for (int i : {0, 2}) EXPECT_EQ(dims(f.launches(sched3, p).at(i)), dims(f.launches(sched0, p).at(i))) << i;
  EXPECT_EQ(f.launches(sched3, p).at(1).smem_bytes, f.launches(sched0, p).at(1).smem_bytes);
  Problem mha = p;  // 16 x 16 pairs of 1 MB (S 1k, d 256): groups of 16
  mha.batch = 16, mha.heads = 16, mha.heads_k = 0, mha.seq_q = mha.seq_k = 1024;
  EXPECT_EQ(dims(f.launches(sched3, mha).at(1)), (std::vector<unsigned>{16, 16, 16}));
  Problem gqa = p;  // 4 query heads of 8k at d 256: 32 MB a pair, one pair a group (SCHED 0's pair order)
  gqa.batch = 4, gqa.heads = 32, gqa.heads_k = 8, gqa.seq_q = gqa.seq_k = 8192;
  EXPECT_EQ(dims(f.launches(sched3, gqa).at(1)), (std::vector<unsigned>{1, 128, 32}));
  const Config sched1{64, 64, 2, 2, 3, 1, 1, 1};  // SCHED 1: one group of every pair, whatever their bytes
  EXPECT_EQ(dims(f.launches(sched1, gqa).at(1)), (std::vector<unsigned>{32, 128, 1}));
  EXPECT_EQ(dims(f.launches(sched1, mha).at(1)), (std::vector<unsigned>{256, 16, 1}));
  EXPECT_TRUE((Fa2WgmmaBwdTraits<256, 64, 64, 2, 2, 3, 1, 1, true, 1, 1>::kPairGroups));
  const GridDims short_last = fa2_wgmma_bwd_dkdv_grid(2, 4, 1000, 64, 3, 3);  // 8 pairs, 3 a group
  EXPECT_EQ(short_last.x, 3); EXPECT_EQ(short_last.y, 16); EXPECT_EQ(short_last.z, 3);
  const GridDims zero = fa2_wgmma_bwd_dkdv_grid(2, 4, 1000, 64, 0, 3);
  EXPECT_EQ(zero.x, 16); EXPECT_EQ(zero.y, 4); EXPECT_EQ(zero.z, 2);
  // Packed: batch = the sequences, the key blocks of the longest, the group by its length.
  Problem ragged = problems_from_json(json::parse(
      R"({"problems":[{"heads":8,"heads_k":2,"head_dim":128,"dtype":"bf16","direction":"bwd",
          "varlen":{"seq_lens":[1,0,129,64,300]}}]})")).at(0);
  EXPECT_EQ(dims(f.launches({64, 64, 0, 2, 3, 1, 1, 3}, ragged).at(1)), (std::vector<unsigned>{10, 5, 1}));
  EXPECT_EQ(dims(f.launches({64, 64, 0, 2, 3, 1, 1, 0}, ragged).at(1)), (std::vector<unsigned>{5, 2, 5}));

  // The mapping: every (key block, pair) exactly once over the grid, the CTAs past the last pair (batch >= the
  // batch) exactly the last group's spare ones; kv head fastest within a group; DETERMINISTIC 2 from the last down.
  for (int sched : {0, 1, 3})
    for (int det : {0, 1, 2})
      for (auto [batch, hk] : {std::pair{1, 1}, std::pair{3, 2}, std::pair{5, 3}, std::pair{2, 8}})
        for (int group : {1, 2, 4, 7, 64}) {
          if (sched == 0 && group != 1) continue;
          if (sched == 1 && group != 64) continue;  // one group of every pair (the family's group for SCHED 1)
          const int nb = 5, pairs = batch * hk, g = std::min(group, pairs);
          SCOPED_TRACE("sched " + std::to_string(sched) + " det " + std::to_string(det) + " batch " +
                       std::to_string(batch) + " hk " + std::to_string(hk) + " group " + std::to_string(g));
          const GridDims grid = fa2_wgmma_bwd_dkdv_grid(batch, hk, nb * 64 - 10, 64, sched, g);
          std::set<std::pair<int, int>> seen;  // (pair, key block)
          int idle = 0;
          for (int z = 0; z < grid.z; ++z)
            for (int y = 0; y < grid.y; ++y)
              for (int x = 0; x < grid.x; ++x) {
                const Fa2WgmmaBwdWork w = fa2_wgmma_bwd_work(sched, det, hk, GridDims{x, y, z}, grid);
                if ((int)w.batch >= batch) {
                  ++idle;
                  EXPECT_EQ(sched, 3);  // SCHED 1's one group has no spare CTA
                  EXPECT_EQ(z, grid.z - 1);  // only the last group has spare CTAs
                  continue;
                }
                EXPECT_LT((int)w.kv_head, hk);
                EXPECT_LT((int)w.key_block, nb);
                const int index = sched != 0 ? y : x;
                EXPECT_EQ((int)w.key_block, det == 2 ? nb - 1 - index : index);
                if (sched != 0) EXPECT_EQ((int)(w.batch * hk + w.kv_head), z * grid.x + x);
                else EXPECT_EQ(std::pair((int)w.kv_head, (int)w.batch), std::pair(y, z));
                EXPECT_TRUE(seen.insert({(int)(w.batch * hk + w.kv_head), (int)w.key_block}).second);
              }
          EXPECT_EQ((int)seen.size(), pairs * nb);
          EXPECT_EQ(idle, sched == 3 ? ((g - pairs % g) % g) * nb : 0);
        }
}

TEST(Problems, ExplicitListAndStandardGrid) {
  auto ps = problems_from_json(json::parse(R"({"problems":[{"batch":2,"heads":3,"seq_q":100,"seq_k":77,"head_dim":64,
      "causal":true}], "grid":{"tokens":16384,"hidden":2048,"seq":[1024,4096],"head_dim":[64,128],
      "causal":[false,true],"dtype":["fp32"]}})"));
  ASSERT_EQ(ps.size(), 9u);
  EXPECT_EQ(ps[0].seq_q, 100);
  EXPECT_EQ(ps[0].seq_k, 77);
  EXPECT_TRUE(ps[0].causal);
  // B = tokens / S, H = hidden / d
  EXPECT_EQ(ps[1].batch, 16);
  EXPECT_EQ(ps[1].heads, 32);
  EXPECT_EQ(ps[1].seq_q, 1024);
  EXPECT_EQ(ps.back().batch, 4);
  EXPECT_EQ(ps.back().heads, 16);
  EXPECT_TRUE(ps.back().causal);
}

// Grouped-query attention: heads_k divides heads; heads_k == heads is multi-head (one spelling, one
// key); K and V bytes count kv heads; multi-head JSON has no heads_k (its keys and shards unchanged).
TEST(Problems, GroupedQueryHeads) {
  auto one = [](const char* s) { return problems_from_json(json::parse(s)).at(0); };
  const Problem g = one(R"({"problems":[{"batch":2,"heads":32,"heads_k":8,"seq":1024,"head_dim":128,"dtype":"bf16"}]})");
  EXPECT_EQ(g.heads_k, 8);
  EXPECT_EQ(g.kv_heads(), 8);
  EXPECT_EQ(g.group(), 4);
  EXPECT_EQ(g.str(), "B2 H32/8 Sq1024 Sk1024 d128 bf16");
  EXPECT_EQ(to_json(g)["heads_k"], 8);
  EXPECT_EQ(problem_from_json(to_json(g)), g);
  Problem m = g;
  m.heads_k = 0;
  // Q, O (and LSE) per query head; K, V per kv head: 8 of 32 heads' worth of K and V.
  EXPECT_DOUBLE_EQ(m.bytes() - g.bytes(), 2.0 * 2 * (32 - 8) * 1024 * 128 * 2);
  EXPECT_DOUBLE_EQ(m.flops(), g.flops());
  const Problem same = one(R"({"problems":[{"batch":2,"heads":32,"heads_k":32,"seq":1024,"head_dim":128,"dtype":"bf16"}]})");
  EXPECT_EQ(same.heads_k, 0);
  EXPECT_FALSE(to_json(same).contains("heads_k"));
  EXPECT_THROW(one(R"({"problems":[{"batch":1,"heads":32,"heads_k":6,"seq":8,"head_dim":64}]})"), UsageError);
  EXPECT_THROW(one(R"({"problems":[{"batch":1,"heads":32,"heads_k":0,"seq":8,"head_dim":64}]})"), UsageError);
  EXPECT_THROW(one(R"({"problems":[{"batch":1,"heads":8,"heads_k":16,"seq":8,"head_dim":64}]})"), UsageError);
}

// Packed variable-length batches: lengths from a seeded distribution (the same on every machine: the
// values below are what splitmix64 gives), fixed ones or a list; batch, seq_q, seq_k derived; the
// description in JSON, str and identity; FLOPs summed per sequence; bad descriptions refused in one line.
TEST(Problems, VarlenLengthsAndIdentity) {
  auto one = [](const std::string& s) { return problems_from_json(json::parse(s)).at(0); };
  auto with = [&](const std::string& varlen, const std::string& rest = "") {
    return one(R"({"problems":[{"heads":32,"heads_k":8,"head_dim":128,"dtype":"bf16","varlen":)" + varlen + rest + "}]}");
  };
  const Problem u = with(R"({"lengths":"uniform","min":256,"max":4096,"total_tokens":16384,"seed":0})");
  ASSERT_TRUE(u.varlen.enabled());
  const auto& lq = u.varlen.seq_lens_q;
  EXPECT_EQ(u.varlen.total_q(), 16384);  // the last length is cut to fill the batch exactly
  EXPECT_EQ(u.varlen.seq_lens_k, lq);    // self-attention
  for (size_t b = 0; b + 1 < lq.size(); ++b) EXPECT_TRUE(lq[b] >= 256 && lq[b] <= 4096) << lq[b];
  EXPECT_EQ(u.batch, (int)lq.size());
  EXPECT_EQ(u.seq_q, *std::max_element(lq.begin(), lq.end()));
  EXPECT_EQ(u.seq_k, u.seq_q);
  EXPECT_EQ(u, with(R"({"lengths":"uniform","min":256,"max":4096,"total_tokens":16384,"seed":0})"));  // deterministic
  const Problem u1 = with(R"({"lengths":"uniform","min":256,"max":4096,"total_tokens":16384,"seed":1})");
  EXPECT_NE(u1.varlen.seq_lens_q, lq);
  EXPECT_NE(u1, u);
  EXPECT_EQ(u.varlen.cu_seqlens_q().front(), 0);
  EXPECT_EQ(u.varlen.cu_seqlens_q().back(), 16384);
  EXPECT_EQ(u.varlen.cu_seqlens_q().size(), lq.size() + 1);
  // JSON: the canonical description, batch/seq_q/seq_k beside it (accepted back when they agree).
  const json j = to_json(u);
  EXPECT_EQ(j["varlen"], json::parse(R"({"lengths":"uniform","min":256,"max":4096,"total_tokens":16384,"seed":0})"));
  EXPECT_EQ(problem_from_json(j), u);
  EXPECT_EQ(u.varlen.key(), R"({"lengths":"uniform","max":4096,"min":256,"seed":0,"total_tokens":16384})");
  EXPECT_THAT(u.str(), HasSubstr("H32/8"));
  EXPECT_THAT(u.str(), HasSubstr("varlen uniform 256-4096 x16384 seed 0"));
  json jb = j;
  jb["batch"] = u.batch + 1;
  EXPECT_THROW(problem_from_json(jb), UsageError);
  // A dense problem of the same count and longest lengths is another problem.
  Problem dense = u;
  dense.varlen = Varlen{};
  EXPECT_NE(dense, u);
  EXPECT_FALSE(to_json(dense).contains("varlen"));
  EXPECT_EQ(dense.varlen.key(), "");

  const Problem f = with(R"({"lengths":"fixed","length":1000,"total_tokens":2500})", R"(,"causal":true)");
  EXPECT_EQ(f.varlen.seq_lens_q, (std::vector<int>{1000, 1000, 500}));
  // FLOPs per sequence, halved when causal (FlashAttention's convention, sequence by sequence).
  EXPECT_DOUBLE_EQ(f.flops(), 4.0 * 32 * 128 * (1000.0 * 1000 * 2 + 500.0 * 500) / 2);
  // Bytes of the packed tensors: Q, O (and LSE) of 2500 tokens x 32 heads, K, V x 8 heads.
  EXPECT_DOUBLE_EQ(f.bytes(), 32 * 2500.0 * (2 * 128 * 2.0 + 4) + 8 * 2500.0 * 2 * 128 * 2.0);
  EXPECT_EQ(f.rows_q(), 2500 * 32);

  const Problem l = with(R"({"seq_lens":[0,5,64],"seq_lens_k":[3,5,0]})", R"(,"direction":"bwd")");
  EXPECT_EQ(l.varlen.lengths, "list");
  EXPECT_EQ(l.batch, 3);
  EXPECT_EQ(l.seq_q, 64);
  EXPECT_EQ(l.seq_k, 5);
  EXPECT_EQ(l.varlen.cu_seqlens_k(), (std::vector<int>{0, 3, 8, 8}));
  EXPECT_DOUBLE_EQ(l.flops(), 2.5 * 4.0 * 32 * 128 * 25);
  EXPECT_THAT(l.str(), HasSubstr("varlen [0,5,64]/[3,5,0]"));
  EXPECT_EQ(problem_from_json(to_json(l)), l);
  EXPECT_EQ(with(R"({"seq_lens":[4,4]})").varlen.description(), json::parse(R"({"seq_lens":[4,4]})"));

  // Refused, each with a one-line reason.
  for (const char* bad : {R"({"lengths":"zipf","min":1,"max":2,"total_tokens":10})",
                          R"({"lengths":"uniform","min":5,"max":4,"total_tokens":10})",
                          R"({"lengths":"uniform","min":0,"max":4,"total_tokens":10})",
                          R"({"lengths":"uniform","min":1,"max":4})",
                          R"({"lengths":"uniform","min":1,"max":4,"total_tokens":10,"length":3})",
                          R"({"lengths":"uniform","min":1,"max":4,"total_tokens":10,"seed":-1})",
                          R"({"lengths":"uniform","min":1,"max":4,"total_tokens":16777217})",
                          R"({"lengths":"uniform","min":1,"max":1,"total_tokens":65536})",
                          R"({"lengths":"fixed","length":4,"total_tokens":10,"seed":1})",
                          R"({"lengths":"uniform","min":1,"max":4294967297,"total_tokens":10})",
                          R"({"seq_lens":[]})", R"({"seq_lens":[-1,4]})", R"({"seq_lens":[0,0]})",
                          R"({"seq_lens":[1.5]})", R"({"seq_lens":[4],"seq_lens_k":[4,4]})",
                          R"({"seq_lens":[4],"seq_lens_k":[0]})", R"({"seq_lens":[1048577]})",
                          R"({"lengths":"list"})", R"({"lengths":"fixed","seq_lens":[4]})", R"([4,4])", R"({})"}) {
    try {
      with(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(one(R"({"problems":[{"heads":2,"head_dim":64,"seq":8,"varlen":{"seq_lens":[8]}}]})"), UsageError);
  // Packed tensors past 2^31 - 1 elements (int32 offsets): 2^24 tokens x 1024 heads x 128.
  EXPECT_THROW(one(R"({"problems":[{"heads":1024,"head_dim":128,"varlen":{"lengths":"fixed","length":4096,"total_tokens":16777216}}]})"),
               UsageError);
}

// Paged K/V caches: the description (page size, seed, optional cache lengths), batch and seq_k derived from the
// lengths, identity (==, str, JSON, key), FLOPs and bytes of the keys held, the seeded block table, and bad
// descriptions refused in one line.
TEST(Problems, PagedCacheDescriptionAndIdentity) {
  auto one = [](const std::string& s) { return problems_from_json(json::parse(s)).at(0); };
  auto with = [&](const std::string& paged, const std::string& shape = R"("batch":2,"seq_q":1,"seq_k":1000,)") {
    return one(R"({"problems":[{"heads":32,"heads_k":8,)" + shape + R"("head_dim":128,"dtype":"bf16","paged":)" + paged + "}]}");
  };
  const Problem full = with(R"({"page_size":256})");
  ASSERT_TRUE(full.paged.enabled());
  EXPECT_EQ(full.batch, 2);
  EXPECT_EQ(full.seq_k, 1000);
  EXPECT_EQ(full.paged.seed, 0u);
  EXPECT_EQ(full.paged.seq_len(1, full.seq_k), 1000);
  EXPECT_EQ(full.paged.key(), R"({"page_size":256,"seed":0})");
  EXPECT_THAT(full.str(), HasSubstr("Sk1000 d128 bf16 paged page 256 seed 0"));
  // Contiguous K/V of the same shape is another problem; its JSON and store key are as before.
  Problem dense = full;
  dense.paged = Paged{};
  EXPECT_NE(dense, full);
  EXPECT_FALSE(to_json(dense).contains("paged"));
  EXPECT_EQ(dense.paged.key(), "");
  // Every sequence full: the bytes and FLOPs of the dense problem (the pool's padding is not counted).
  EXPECT_DOUBLE_EQ(full.bytes(), dense.bytes());
  EXPECT_DOUBLE_EQ(full.flops(), dense.flops());
  EXPECT_NE(with(R"({"page_size":256,"seed":1})"), full);  // another page order
  EXPECT_NE(with(R"({"page_size":128})"), full);

  // Per-sequence lengths: batch and seq_k (the longest) derived, and accepted back when they agree.
  const Problem lens = with(R"({"page_size":64,"seed":7,"seq_lens_k":[300,0,1,64]})", R"("seq_q":3,)");
  EXPECT_EQ(lens.batch, 4);
  EXPECT_EQ(lens.seq_k, 300);
  EXPECT_EQ(lens.seq_q, 3);
  EXPECT_EQ(lens.paged.seq_len(1, lens.seq_k), 0);
  EXPECT_THAT(lens.str(), HasSubstr("B4 H32/8 Sq3 Sk300 d128 bf16 paged page 64 seed 7 lens [300,0,1,64]"));
  const json j = to_json(lens);
  EXPECT_EQ(j["paged"], json::parse(R"({"page_size":64,"seed":7,"seq_lens_k":[300,0,1,64]})"));
  EXPECT_EQ(problem_from_json(j), lens);
  EXPECT_DOUBLE_EQ(lens.flops(), 4.0 * 32 * 3 * 365 * 128);  // Sq x the keys held, per query head
  EXPECT_DOUBLE_EQ(lens.bytes(), 32 * 4 * 3.0 * (2 * 128 * 2 + 4) + 8 * 365.0 * 2 * 128 * 2);
  for (const char* key : {"batch", "seq_k"}) {
    json bad = j;
    bad[key] = bad[key].get<int>() + 1;
    EXPECT_THROW(problem_from_json(bad), UsageError) << key;
  }
  EXPECT_EQ(with(R"({"page_size":16,"seq_lens_k":[0,0]})", R"("seq_q":1,)").seq_k, 1);  // no keys at all: Sk 1 for the grid

  // Refused, each with a one-line reason.
  for (const char* bad : {R"({})", R"({"page_size":0})", R"({"page_size":8})", R"({"page_size":100})",
                          R"({"page_size":1048592})", R"({"page_size":4294967552})", R"({"page_size":-256})",
                          R"({"page_size":256.0})", R"({"page_size":"256"})", R"({"page_size":256,"seed":-1})",
                          R"({"page_size":256,"seed":1e300})", R"({"page_size":256,"pages":4})",
                          R"({"page_size":256,"seq_lens_k":[]})", R"({"page_size":256,"seq_lens_k":[-1]})",
                          R"({"page_size":256,"seq_lens_k":[1048577]})", R"({"page_size":256,"seq_lens_k":"300"})",
                          R"([256])", R"(256)"}) {
    try {
      with(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(one(R"({"problems":[{"heads":2,"head_dim":64,"seq":8,"paged":{"page_size":16,"seq_lens_k":[8]}}]})"), UsageError);
  EXPECT_THROW(one(R"({"problems":[{"batch":1,"heads":2,"seq":8,"head_dim":64,"direction":"bwd","paged":{"page_size":16}}]})"),
               UsageError);
  EXPECT_THROW(one(R"({"problems":[{"heads":2,"head_dim":64,"varlen":{"seq_lens":[8]},"paged":{"page_size":16}}]})"),
               UsageError);
  // A block table past 2^24 entries: 2^20 sequences of 1024 keys in 16-key pages.
  EXPECT_THROW(one(R"({"problems":[{"batch":1048576,"heads":1,"seq_q":1,"seq_k":1024,"head_dim":64,"paged":{"page_size":16}}]})"),
               UsageError);
}

// The pools' layout (Paged::layout): token-major pages (FlashAttention's and vLLM's [num_pages, page_size, Hk, d])
// are another problem, their key, str and JSON say so; head-major ("hnd", the default) keeps the key it had before
// layouts existed (stored rows stay theirs). Bad layouts are refused in one line.
TEST(Problems, PagedLayoutIsPartOfTheIdentity) {
  auto with = [](const std::string& paged) {
    return problems_from_json(json::parse(R"({"problems":[{"heads":32,"heads_k":8,"batch":2,"seq_q":1,"seq_k":1000,)"
                                          R"("head_dim":128,"dtype":"bf16","paged":)" + paged + "}]}")).at(0);
  };
  const Problem hnd = with(R"({"page_size":256})"), hnd_named = with(R"({"page_size":256,"layout":"hnd"})");
  const Problem nhd = with(R"({"page_size":256,"layout":"nhd"})");
  EXPECT_EQ(hnd, hnd_named);
  EXPECT_EQ(hnd.paged.layout, PageLayout::hnd);
  EXPECT_EQ(hnd_named.paged.key(), R"({"page_size":256,"seed":0})");  // unchanged by the default written out
  EXPECT_EQ(nhd.paged.layout, PageLayout::nhd);
  EXPECT_NE(nhd, hnd);
  EXPECT_EQ(nhd.paged.key(), R"({"layout":"nhd","page_size":256,"seed":0})");
  EXPECT_THAT(nhd.str(), HasSubstr("paged page 256 seed 0 nhd"));
  EXPECT_EQ(problem_from_json(to_json(nhd)), nhd);  // round trip (the store reads the key back this way)
  EXPECT_DOUBLE_EQ(nhd.bytes(), hnd.bytes());        // the same bytes read
  EXPECT_EQ(nhd.paged.seq_len(1, nhd.seq_k), 1000);
  const Problem ragged = with(R"({"page_size":64,"seed":3,"seq_lens_k":[1000,0],"layout":"nhd"})");
  EXPECT_THAT(ragged.str(), HasSubstr("page 64 seed 3 lens [1000,0] nhd"));
  EXPECT_EQ(page_table(ragged.paged, ragged.batch, ragged.seq_k).table,
            page_table(with(R"({"page_size":64,"seed":3,"seq_lens_k":[1000,0]})").paged, 2, 1000).table);  // same table
  for (const char* bad : {R"({"page_size":256,"layout":"NHD"})", R"({"page_size":256,"layout":"bhsd"})",
                          R"({"page_size":256,"layout":1})", R"({"page_size":256,"layout":null})",
                          R"({"page_size":256,"layout":["nhd"]})", R"({"page_size":256,"layout":""})"}) {
    try {
      with(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      EXPECT_THAT(e.what(), HasSubstr("paged 'layout' must be \"hnd\"")) << bad;
    }
  }
  EXPECT_STREQ(to_string(PageLayout::nhd), "nhd");
  EXPECT_EQ(page_layout_from_string("hnd"), PageLayout::hnd);
  EXPECT_EQ(page_layout_from_string("x"), std::nullopt);
}

// The two layouts' offsets: the same (page, head, key) in both is the same element of a page transposed, a
// head-major page's rows d apart, a token-major page's heads_k*d apart, each page's elements addressed once.
TEST(Problems, PagedKeyOffsetsOfBothLayouts) {
  const int Hk = 3, P = 32, d = 64;
  std::vector<int> hits_hnd((size_t)2 * Hk * P * d, 0), hits_nhd(hits_hnd.size(), 0);
  for (int page = 0; page < 2; ++page)
    for (int h = 0; h < Hk; ++h)
      for (int r = 0; r < P; ++r) {
        const long long a = paged_key_offset(PageLayout::hnd, page, Hk, P, h, r, d);
        const long long b = paged_key_offset(PageLayout::nhd, page, Hk, P, h, r, d);
        EXPECT_EQ(a, paged_key_offset(page, Hk, P, h, r, d));
        EXPECT_EQ(b, (((long long)page * P + r) * Hk + h) * d);
        if (r > 0) {
          EXPECT_EQ(a - paged_key_offset(PageLayout::hnd, page, Hk, P, h, r - 1, d), d);
          EXPECT_EQ(b - paged_key_offset(PageLayout::nhd, page, Hk, P, h, r - 1, d), (long long)Hk * d);
        }
        for (int c = 0; c < d; ++c) ++hits_hnd[(size_t)(a + c)], ++hits_nhd[(size_t)(b + c)];
      }
  for (size_t i = 0; i < hits_hnd.size(); ++i) ASSERT_TRUE(hits_hnd[i] == 1 && hits_nhd[i] == 1) << i;
}

// The block table: every page a sequence uses once, in a seeded order that is not the logical one, -1 past a
// sequence's pages; the same on every machine (the values below are what splitmix64 gives).
TEST(Problems, PagedBlockTableIsASeededPermutation) {
  Paged pg;
  pg.page_size = 64;
  pg.seed = 7;
  pg.seq_lens_k = {300, 0, 1, 64, 65};
  const PageTable t = page_table(pg, 5, 300);
  EXPECT_EQ(t.max_pages, 5);
  EXPECT_EQ(t.num_pages, 5 + 0 + 1 + 1 + 2);
  EXPECT_EQ(t.cache_seqlens, pg.seq_lens_k);
  ASSERT_EQ(t.table.size(), 25u);
  std::vector<int> seen(t.num_pages, 0);
  bool moved = false;
  int logical = 0;  // the page's number had the batch's pages been laid out in order
  for (int b = 0; b < 5; ++b) {
    const int pages = (pg.seq_lens_k[b] + 63) / 64;
    for (int j = 0; j < t.max_pages; ++j) {
      const int e = t.table[(size_t)b * t.max_pages + j];
      if (j >= pages) {
        EXPECT_EQ(e, -1) << b << " " << j;
        continue;
      }
      ASSERT_GE(e, 0);
      ASSERT_LT(e, t.num_pages);
      seen[e]++;
      moved |= e != logical++;
    }
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  EXPECT_TRUE(moved);
  EXPECT_EQ(t.table, page_table(pg, 5, 300).table);  // deterministic
  // splitmix64's order: a change here changes the pages of every stored paged problem.
  EXPECT_EQ(t.table, (std::vector<int>{2, 3, 5, 0, 7, -1, -1, -1, -1, -1, 6, -1, -1, -1, -1, 1, -1, -1, -1, -1, 4, 8, -1, -1, -1}));
  Paged other = pg;
  other.seed = 8;
  EXPECT_NE(page_table(other, 5, 300).table, t.table);
  // Two pages are never left in order (a shuffle may give the identity; then the first two swap).
  for (unsigned long long seed = 0; seed < 64; ++seed) {
    Paged two;
    two.page_size = 16, two.seed = seed;
    const PageTable t2 = page_table(two, 1, 32);
    EXPECT_EQ(t2.table, (std::vector<int>{1, 0})) << seed;
  }
  // Without lengths: every sequence seq_k long.
  Paged uniform;
  uniform.page_size = 256;
  const PageTable tu = page_table(uniform, 3, 1000);
  EXPECT_EQ(tu.max_pages, 4);
  EXPECT_EQ(tu.num_pages, 12);
  EXPECT_EQ(tu.cache_seqlens, (std::vector<int>{1000, 1000, 1000}));
  EXPECT_EQ(std::count(tu.table.begin(), tu.table.end(), -1), 0);
  EXPECT_TRUE(page_table(Paged{}, 3, 1000).table.empty());  // contiguous K/V: no table
}

// The paged form of decode_splitkv: `kernel<Traits, true>` for both kernels, picked by a paged problem; the
// family's page condition (BLOCK_N divides the page size) keeps the search's candidates and `run` to the configs
// that can read the problem's pages; families without the form are refused with the reason.
TEST(Family, PagedFormFollowsTheProblem) {
  const Family& f = find_family("decode_splitkv");
  const Family& mma = find_family("fa2_mma");
  EXPECT_TRUE(f.paged);
  for (const auto& g : families()) EXPECT_FALSE(g.paged && g.varlen) << g.name << ": one second form at most";
  EXPECT_EQ(f.name_expressions(f.default_config, 128, false, DType::bf16, false, true),
            (std::vector<std::string>{"&flashtune::decode_splitkv_partial<flashtune::DecodeSplitkvTraits<128,16,64,4,2,1,false>, true>",
                                      "&flashtune::decode_splitkv_combine<flashtune::DecodeSplitkvTraits<128,16,64,4,2,1,false>, true>"}));
  Problem p = problems_from_json(json::parse(R"({"problems":[{"heads":8,"heads_k":2,"seq_q":1,"head_dim":128,
      "dtype":"bf16","paged":{"page_size":64,"seq_lens_k":[1,300]}}]})")).at(0);
  EXPECT_EQ(f.shape_reason(p), "");
  EXPECT_EQ(mma.shape_reason(p), "does not read paged K/V caches");
  EXPECT_EQ(f.paged_check({16, 64, 4, 2}, 64), nullptr);
  EXPECT_EQ(f.paged_check({16, 32, 2, 2}, 64), nullptr);
  ASSERT_NE(f.paged_check({16, 128, 4, 2}, 64), nullptr);
  EXPECT_THAT(f.paged_check({16, 128, 4, 2}, 64), HasSubstr("BLOCK_N must divide the page size"));
  EXPECT_EQ(f.paged_check({16, 256, 4, 1}, 768), nullptr);  // 768 = 3 x 256: not a power of two

  Problem dense = p;
  dense.paged = Paged{};
  const Space s = space_from_json(json::parse(R"({"family":"decode_splitkv","params":{"SPLITS":[4],"BLOCK_N":[64,128],
      "WARPS":[4],"STAGES":[1]},"head_dims":[128],"causal":[false],"dtypes":["bf16"]})"));
  EXPECT_EQ(s.variants().size(), 2u);  // default: the dense form only
  const auto vp = variants_for(s, {p}), vd = variants_for(s, {dense});
  ASSERT_EQ(vp.size(), 2u);
  for (const auto& v : vp) EXPECT_TRUE(v.paged && !v.varlen);
  for (const auto& v : vd) EXPECT_FALSE(v.paged);
  EXPECT_EQ(variants_for(s, {p, dense}).size(), 4u);
  // The search takes the configs that can read 64-key pages only.
  const Compiler sm90("sm_90");
  const auto cands = search_candidates(s, p, sm90, Shard{});
  ASSERT_EQ(cands.size(), 1u);
  EXPECT_EQ(cands[0].v.config[1], 64);
  EXPECT_EQ(search_candidates(s, dense, sm90, Shard{}).size(), 2u);
  EXPECT_NE(sm90.variant_hash(vp[0]), sm90.variant_hash(vd[0]));  // another kernel, another cache entry

  const Space both = space_from_json(json::parse(R"({"family":"decode_splitkv","params":{"SPLITS":[4],"BLOCK_N":[64,128],
      "WARPS":[4],"STAGES":[1]},"head_dims":[128],"causal":[false],"dtypes":["bf16"],"paged":[false,true]})"));
  EXPECT_EQ(both.size(), 4u);
  EXPECT_EQ(both.variants().size(), 4u);
  EXPECT_EQ(variants_for(both, {p}).size(), 2u);  // tune takes the problem's form either way
  EXPECT_THROW(space_from_json(json::parse(R"({"family":"fa2_mma","paged":[true]})")), UsageError);
  EXPECT_THROW(space_from_json(json::parse(R"({"family":"decode_splitkv","paged":[0]})")), UsageError);
  // The compiler refuses the paged form of a family that has none, before NVRTC.
  Variant v{&mma, mma.default_config, 64, false, DType::bf16, false, true};
  EXPECT_EQ(sm90.prune_before_compile(v), "does not read paged K/V caches");

  // Token-major pages (Paged::layout nhd): the paged kernels on PagedNhdTraits (the head-major ones keep their
  // names), picked by the problem's layout; the same configs and page condition.
  EXPECT_TRUE(f.paged_nhd);
  for (const auto& g : families()) EXPECT_TRUE(!g.paged_nhd || g.paged) << g.name;
  EXPECT_EQ(f.name_expressions(f.default_config, 128, false, DType::bf16, false, true, 0, PageLayout::nhd),
            (std::vector<std::string>{
                "&flashtune::decode_splitkv_partial<flashtune::PagedNhdTraits<flashtune::DecodeSplitkvTraits<128,16,64,4,2,1,false>>, true>",
                "&flashtune::decode_splitkv_combine<flashtune::PagedNhdTraits<flashtune::DecodeSplitkvTraits<128,16,64,4,2,1,false>>, true>"}));
  EXPECT_EQ(f.name_expressions(f.default_config, 128, false, DType::bf16, false, false, 0, PageLayout::nhd),
            f.name_expressions(f.default_config, 128, false, DType::bf16));  // a layout only of the paged form
  Problem nhd = p;
  nhd.paged.layout = PageLayout::nhd;
  EXPECT_EQ(f.shape_reason(nhd), "");
  EXPECT_EQ(mma.shape_reason(nhd), "does not read paged K/V caches");
  const auto vn = variants_for(s, {nhd});
  ASSERT_EQ(vn.size(), 2u);
  for (const auto& v : vn) EXPECT_TRUE(v.paged && v.page_layout == PageLayout::nhd);
  EXPECT_EQ(variants_for(s, {p, nhd}).size(), 4u);  // each layout its own kernels
  EXPECT_NE(sm90.variant_hash(vn[0]), sm90.variant_hash(vp[0]));
  const auto cn = search_candidates(s, nhd, sm90, Shard{});
  ASSERT_EQ(cn.size(), 1u);  // BLOCK_N 64 reads 64-key pages, as head-major
  EXPECT_EQ(cn[0].v.config[1], 64);
  EXPECT_EQ(cn[0].v.page_layout, PageLayout::nhd);
  // Spaces list the layouts to compile ("page_layouts", with "paged": [.., true]).
  const Space layouts = space_from_json(json::parse(R"({"family":"decode_splitkv","params":{"SPLITS":[4],"BLOCK_N":[64,128],
      "WARPS":[4],"STAGES":[1]},"head_dims":[128],"causal":[false],"dtypes":["bf16"],"paged":[false,true],
      "page_layouts":["hnd","nhd"]})"));
  EXPECT_EQ(layouts.size(), 6u);
  const auto lv = layouts.variants();
  ASSERT_EQ(lv.size(), 6u);
  EXPECT_EQ(std::count_if(lv.begin(), lv.end(), [](const Variant& x) { return x.page_layout == PageLayout::nhd; }), 2);
  for (const auto& x : lv) EXPECT_TRUE(x.paged || x.page_layout == PageLayout::hnd);
  for (const char* bad : {R"({"family":"decode_splitkv","paged":[false,true],"page_layouts":["NHD"]})",
                          R"({"family":"decode_splitkv","paged":[false,true],"page_layouts":[]})",
                          R"({"family":"decode_splitkv","paged":[false,true],"page_layouts":"nhd"})",
                          R"({"family":"decode_splitkv","page_layouts":["nhd"]})",
                          R"({"family":"fa2_mma","page_layouts":["nhd"]})"})
    EXPECT_THROW(space_from_json(json::parse(bad)), UsageError) << bad;
  Variant wrong{&mma, mma.default_config, 64, false, DType::bf16, false, false, 0, PageLayout::nhd};
  EXPECT_EQ(sm90.prune_before_compile(wrong), "a page layout goes with the paged form");
}

// The varlen form of a family's kernels: `kernel<Traits, true>`, picked by the problem; a family without it
// is refused with the reason, a space names the forms to compile.
TEST(Family, VarlenFormFollowsTheProblem) {
  const Family& f = find_family("fa2_mma");
  const Family& simt = find_family("fa2_simt");
  EXPECT_TRUE(f.varlen);
  EXPECT_TRUE(find_family("fa2_mma_bwd").varlen);
  EXPECT_FALSE(simt.varlen);
  EXPECT_EQ(f.name_expressions(f.default_config, 64, true, DType::bf16, true),
            std::vector<std::string>{"&flashtune::fa2_mma_fwd<flashtune::Fa2MmaTraits<64,64,64,4,2,1,true>, true>"});
  Problem p = problems_from_json(json::parse(
      R"({"problems":[{"heads":4,"head_dim":64,"dtype":"bf16","varlen":{"seq_lens":[3,300]}}]})")).at(0);
  EXPECT_EQ(f.shape_reason(p), "");
  EXPECT_EQ(simt.shape_reason(p), "does not support packed variable-length batches");
  Problem dense = p;
  dense.varlen = Varlen{};
  const Space s = space_from_json(json::parse(R"({"family":"fa2_mma","params":{"BLOCK_N":[32,64]},"head_dims":[64],
      "causal":[false],"dtypes":["bf16"]})"));
  EXPECT_EQ(s.variants().size(), 2u);  // default: the dense form only
  const auto vp = variants_for(s, {p}), vd = variants_for(s, {dense}), both = variants_for(s, {p, dense});
  ASSERT_EQ(vp.size(), 2u);
  for (const auto& v : vp) EXPECT_TRUE(v.varlen);
  for (const auto& v : vd) EXPECT_FALSE(v.varlen);
  EXPECT_EQ(both.size(), 4u);
  const Space packed = space_from_json(json::parse(R"({"family":"fa2_mma","params":{"BLOCK_N":[32,64]},"head_dims":[64],
      "causal":[false],"dtypes":["bf16"],"varlen":[false,true,true]})"));
  EXPECT_EQ(packed.size(), 4u);
  EXPECT_EQ(packed.variants().size(), 4u);
  EXPECT_EQ(variants_for(packed, {p}).size(), 2u);  // tune takes the problem's form either way
  EXPECT_THROW(space_from_json(json::parse(R"({"family":"fa2_simt","varlen":[true]})")), UsageError);
  EXPECT_THROW(space_from_json(json::parse(R"({"family":"fa2_mma","varlen":[1]})")), UsageError);
  EXPECT_TRUE(variants_for(space_from_json(json::parse(R"({"family":"fa2_simt","head_dims":[64]})")),
                           {[&] { Problem q = p; q.dtype = DType::fp32; return q; }()}).empty());
  // The compiler refuses the packed form of a family that has none, before NVRTC.
  Variant v{&simt, simt.default_config, 64, false, DType::fp32, true};
  EXPECT_EQ(Compiler("sm_90").prune_before_compile(v), "does not support packed variable-length batches");
}

// fa2_wgmma_bwd's packed form: every config the dense form has (DQ_RED 3 and LOAD 1 included). LOAD 1's images
// hold each sequence's padded blocks from a 16-row aligned start (heads round_up(total_q, 16) + batch (BM + 16)
// rows apart), so no two sequences' blocks overlap: the layout below is not where the GPU found it wrong.
TEST(Family, WgmmaBwdPackedForm) {
  const Family& f = find_family("fa2_wgmma_bwd");
  EXPECT_TRUE(f.varlen);
  const Compiler sm90("sm_90");
  for (int red : {0, 1, 2, 3}) {
    Variant v{&f, {64, 64, 2, 2, red, 0}, 128, true, DType::bf16, true};
    EXPECT_EQ(sm90.prune_before_compile(v), "") << red;
    v.config[5] = 1;
    EXPECT_EQ(sm90.prune_before_compile(v), "") << red;
    v.varlen = false;
    EXPECT_EQ(sm90.prune_before_compile(v), "") << red;
  }
  EXPECT_EQ(f.name_expressions({64, 64, 2, 2, 3, 1}, 128, true, DType::bf16, true).at(1),
            "&flashtune::fa2_wgmma_bwd_dkdv<flashtune::Fa2WgmmaBwdTraits<128,64,64,2,2,3,1,1,true>, true>");

  Problem p = problems_from_json(json::parse(
      R"({"problems":[{"heads":8,"heads_k":2,"head_dim":128,"dtype":"bf16","direction":"bwd",
          "varlen":{"seq_lens":[1,0,129,64,300]}}]})")).at(0);
  EXPECT_EQ(f.shape_reason(p), "");
  const long long total = 494;
  for (int bm : {64, 128}) {
    SCOPED_TRACE(bm);
    const long long head_rows = (total + 15) / 16 * 16 + 5LL * (bm + 16);
    EXPECT_EQ(fa2_wgmma_bwd_varlen_head_rows(total, 5, bm), head_rows);
    EXPECT_EQ(f.workspace_bytes({bm, 64, 2, 2, 0, 1}, p), (size_t)(8 * head_rows * (4 * 128 + 8)));
    EXPECT_EQ(f.workspace_bytes({bm, 64, 2, 2, 0, 0}, p), 0u);
    const std::vector<int> cu = p.varlen.cu_seqlens_q();
    for (size_t b = 0; b + 1 < cu.size(); ++b) {
      const long long at = fa2_wgmma_bwd_varlen_seq_row(cu[b], (int)b, bm);
      const long long end = at + fa2_wgmma_bwd_padded_rows(cu[b + 1] - cu[b], bm);
      EXPECT_EQ(at % 16, 0) << b;  // lse, delta bulk copies: 16-byte aligned
      EXPECT_LE(end, b + 2 < cu.size() ? fa2_wgmma_bwd_varlen_seq_row(cu[b + 1], (int)b + 1, bm) : head_rows) << b;
    }
    // The preprocess's writes (fa2_wgmma_bwd_preprocess<T, true>: its grid's rows of sequence z, head y, the
    // rows fa2_wgmma_bwd_image_row keeps), emulated over the Q and dO images of every head, then lse and delta:
    // each padded row of each sequence written once, by that sequence, nothing else. The grid covers the
    // longest sequence's blocks (p.seq_q: the maximum), so a shorter sequence's grid rows reach past its
    // padding: unguarded, its zeros landed on the next sequence's (or head's) images, racing with that
    // sequence's own rows (the H100's invalid packed LOAD 1 runs, 201 of 222).
    const Launch pre = f.launches({bm, 64, 2, 2, 0, 1}, p).at(0);
    ASSERT_EQ(pre.grid[1], 8u);
    ASSERT_EQ(pre.grid[2], 5u);
    const long long grid_rows = (long long)pre.grid[0] * kFa2WgmmaBwdRowsPerCta;
    const long long heads = 8, image_rows = 4 * heads * head_rows;  // Q, dO, lse, delta: rows of each
    std::vector<int> writer(image_rows, -1), writes(image_rows, 0);
    bool reaches_past = false;
    for (int z = 0; z < 5; ++z) {
      const int len = cu[z + 1] - cu[z];
      for (long long y = 0; y < heads; ++y)
        for (long long row = 0; row < grid_rows; ++row) {
          reaches_past |= row >= fa2_wgmma_bwd_padded_rows(len, bm);
          if (!fa2_wgmma_bwd_image_row((int)row, len, bm)) continue;
          for (int image = 0; image < 4; ++image) {
            const long long at = (image * heads + y) * head_rows + fa2_wgmma_bwd_varlen_seq_row(cu[z], z, bm) + row;
            ASSERT_LT(at, image_rows);
            ++writes[at];
            writer[at] = z;
          }
        }
    }
    EXPECT_TRUE(reaches_past);  // the guard is needed: [1, 0, 129, 64, 300]'s grid covers 300 rows of each
    for (int image = 0; image < 4; ++image)
      for (long long y = 0; y < heads; ++y)
        for (int z = 0; z < 5; ++z) {
          const long long at = (image * heads + y) * head_rows + fa2_wgmma_bwd_varlen_seq_row(cu[z], z, bm);
          const long long padded = fa2_wgmma_bwd_padded_rows(cu[z + 1] - cu[z], bm);
          for (long long r = 0; r < padded; ++r) {  // what the dK/dV kernel's bulk copies read
            ASSERT_EQ(writes[at + r], 1) << image << " " << y << " " << z << " " << r;
            ASSERT_EQ(writer[at + r], z) << image << " " << y << " " << z << " " << r;
          }
        }
    long long written = 0;
    for (int w : writes) written += w;
    long long padded_total = 0;
    for (int z = 0; z < 5; ++z) padded_total += fa2_wgmma_bwd_padded_rows(cu[z + 1] - cu[z], bm);
    EXPECT_EQ(written, 4 * heads * padded_total);  // no row outside a sequence's padded blocks
  }
  // The device stage's inputs: every ragged packed backward shape and every Llama-style point has packed variants
  // of the packed space that compile (LOAD 0).
  const std::string dir = std::string(FLASHTUNE_SOURCE_DIR) + "/configs/";
  const Space check = load_space(dir + "spaces/fa2_wgmma_bwd_varlen.json");
  EXPECT_EQ(check.varlen, std::vector<bool>{true});
  for (const Problem& q : load_problems(dir + "problems/ragged_varlen_bwd.json")) {
    const auto vs = variants_for(check, {q});
    EXPECT_FALSE(vs.empty()) << q.str();
    for (const auto& x : vs) EXPECT_TRUE(x.varlen);
  }
  for (const Problem& q : load_problems(dir + "problems/varlen_bwd_bf16.json")) {
    size_t packed_ok = 0;
    for (const auto& x : variants_for(check, {q})) packed_ok += x.varlen && sm90.prune_before_compile(x).empty();
    EXPECT_GT(packed_ok, 0u) << q.str();
  }
}

// Issue 32: a problem's window and softcap: read, checked (one line each), one spelling (causal is (-1, 0) and keeps
// the right edge at -1), in str, JSON and identity; FLOPs of the visible pairs; the same visible keys as the
// float64 reference's.
TEST(Problems, WindowAndSoftcapFieldsAndIdentity) {
  auto one = [](const std::string& fields) {
    return problems_from_json(json::parse(R"({"problems":[{"batch":2,"heads":4,"seq_q":300,"seq_k":500,"head_dim":128,"dtype":"bf16")" +
                                          fields + "}]}"))
        .at(0);
  };
  const Problem plain = one("");
  EXPECT_FALSE(plain.windowed() || plain.softcapped());
  EXPECT_FALSE(to_json(plain).contains("window"));  // plain problems keep their JSON, keys and shards
  EXPECT_FALSE(to_json(plain).contains("softcap"));
  const Problem w = one(R"(,"window":[128,16],"softcap":30)");
  EXPECT_EQ(w.window_left, 128);
  EXPECT_EQ(w.window_right, 16);
  EXPECT_EQ(w.softcap, 30.0);
  EXPECT_FALSE(w.causal);
  EXPECT_EQ(w.str(), "B2 H4 Sq300 Sk500 d128 bf16 window 128,16 softcap 30");
  EXPECT_EQ(problem_from_json(to_json(w)), w);
  EXPECT_NE(w, plain);
  // (L, 0) is causal with a left edge; causal drops the right edge; (-1, 0) is causal itself.
  const Problem c1 = one(R"(,"window":[64,0])"), c2 = one(R"(,"causal":true,"window":[64,9])"),
                c3 = one(R"(,"window":[-1,0])"), causal = one(R"(,"causal":true)");
  EXPECT_TRUE(c1.causal);
  EXPECT_EQ(c1.window_right, -1);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(c3, causal);
  EXPECT_FALSE(c3.windowed());
  EXPECT_EQ(c1.str(), "B2 H4 Sq300 Sk500 d128 bf16 causal window 64,-1");
  EXPECT_EQ(problem_from_json(to_json(c1)), c1);
  const Problem cap = one(R"(,"softcap":0.5)");
  EXPECT_EQ(problem_from_json(to_json(cap)), cap);
  EXPECT_EQ(cap.str(), "B2 H4 Sq300 Sk500 d128 bf16 softcap 0.5");
  // Bad values: one line naming the field.
  for (const char* bad : {R"(,"window":[-2,0])", R"(,"window":[0])", R"(,"window":"64,0")", R"(,"window":[1.5,0])",
                          R"(,"window":[1073741825,0])", R"(,"window":[0,18446744073709551615])", R"(,"softcap":-1)",
                          R"(,"softcap":"30")", R"(,"softcap":1e-9)", R"(,"softcap":1e300)", R"(,"softcap":null)"}) {
    try {
      one(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("'window'") != std::string::npos || m.find("'softcap'") != std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
  // FLOPs: the visible pairs, counted (Sk - Sq = 200: row i sees keys [i + 200 - 128, i + 200 + 16]).
  double pairs = 0;
  for (int i = 0; i < 300; ++i) pairs += std::min(499, i + 216) - std::max(0, i + 72) + 1;
  EXPECT_DOUBLE_EQ(w.flops(), 4.0 * 2 * 4 * pairs * 128);
  EXPECT_DOUBLE_EQ(plain.flops(), 4.0 * 2 * 4 * 300 * 500 * 128);
  EXPECT_DOUBLE_EQ(cap.flops(), plain.flops());  // a softcap masks nothing
  // A window past the sequence sees what causal (or nothing) sees.
  const Problem past = one(R"(,"causal":true,"window":[100000,-1])");
  double causal_pairs = 0;
  for (int i = 0; i < 300; ++i) causal_pairs += std::min(500, i + 201);
  EXPECT_DOUBLE_EQ(past.flops(), 4.0 * 2 * 4 * causal_pairs * 128);
  // The core's visible keys are the reference's, for every row of ragged shapes and edges.
  for (auto [sq, sk] : {std::pair{300, 500}, std::pair{500, 300}, std::pair{1, 77}})
    for (auto [l, r] : {std::pair{0, 0}, std::pair{1, 1}, std::pair{64, -1}, std::pair{-1, 3}, std::pair{100000, 100000}})
      for (bool causal : {false, true}) {
        Problem p = plain;
        p.seq_q = sq, p.seq_k = sk, p.causal = causal, p.window_left = l, p.window_right = r;
        ref::Shape rs{1, 1, sq, sk, 64, causal};
        rs.window_left = l, rs.window_right = r;
        for (int i = 0; i < sq; ++i) {
          const auto [first, end] = p.visible_keys(i, sq, sk);
          const ref::KeySpan k = ref::visible_range(rs, i);
          ASSERT_EQ(std::make_pair(first, end), std::make_pair((long long)k.first, (long long)k.end))
              << sq << "x" << sk << " window " << l << "," << r << " causal " << causal << " row " << i;
        }
      }
}

// Families say which modifications they have: fa3_wgmma, fa3_wgmma_bwd, fa2_mma and fa2_mma_bwd all, every other none, so that a
// problem with a window or a softcap is refused by the rest (shape_reason) and never runs silently without it;
// variants_for gives such a problem the modified variant, and its name expression wraps the traits.
TEST(Family, WindowAndSoftcapAreFa3WgmmaVariants) {
  Problem p{1, 2, 256, 256, 128, DType::bf16, false};
  Problem w = p;
  w.window_left = 64;
  Problem c = p;
  c.softcap = 30;
  for (const auto& f : families()) {
    if (f.name == "fa3_wgmma" || f.name == "fa3_wgmma_bwd" || f.name == "fa2_mma" || f.name == "fa2_mma_bwd") {
      // (the Hopper ones with a mask_mod too: test_mask_mod)
      EXPECT_EQ(f.mods & ~kModMask, kModWindow | kModSoftcap | kModAlibi);
      EXPECT_EQ((f.mods & kModMask) != 0, f.name == "fa3_wgmma" || f.name == "fa3_wgmma_bwd");
      EXPECT_EQ(f.shape_reason(w), "");
      EXPECT_EQ(f.shape_reason(c), "");
    } else {
      EXPECT_EQ(f.mods, 0u) << f.name;
      EXPECT_EQ(f.shape_reason(w), "does not support sliding windows (window)") << f.name;
      EXPECT_EQ(f.shape_reason(c), "does not support logit softcapping (softcap)") << f.name;
    }
  }
  const Family& f = find_family("fa3_wgmma");
  EXPECT_EQ(f.name_expressions(f.default_config, 128, true, DType::bf16).at(0),
            "&flashtune::fa3_wgmma_fwd<flashtune::Fa3WgmmaTraits<128,64,2,2,1,1,0,0,0,0,1,true>>");
  EXPECT_EQ(f.name_expressions(f.default_config, 128, true, DType::bf16, true, false, kModWindow | kModSoftcap).at(0),
            "&flashtune::fa3_wgmma_fwd<flashtune::AttnModTraits<flashtune::Fa3WgmmaTraits<128,64,2,2,1,1,0,0,0,0,1,true>, "
            "true, true>, true>");
  EXPECT_EQ(f.name_expressions(f.default_config, 64, false, DType::fp16, false, false, kModSoftcap).at(0),
            "&flashtune::fa3_wgmma_fwd<flashtune::AttnModTraits<flashtune::Fa3WgmmaTraits<64,64,2,2,1,1,0,0,0,0,0,false>, "
            "false, true>>");
  Space s = space_from_json(json::parse(R"({"family":"fa3_wgmma","params":{"BLOCK_N":[64]},"head_dims":[128],
                                            "causal":[false],"dtypes":["bf16"]})"));
  Problem wc = w;
  wc.softcap = 30;
  for (const auto& [problem, mods] : {std::pair{p, 0u}, std::pair{w, kModWindow}, std::pair{c, kModSoftcap},
                                      std::pair{wc, kModWindow | kModSoftcap}}) {
    const auto vs = variants_for(s, {problem});
    ASSERT_EQ(vs.size(), 1u) << problem.str();
    EXPECT_EQ(vs[0].mods, mods) << problem.str();
  }
  EXPECT_EQ(variants_for(s, {p, w, c}).size(), 3u);  // one variant per set of modifications the problems have
  const Compiler sm90("sm_90");
  Variant v = variants_for(s, {w})[0];
  EXPECT_EQ(sm90.prune_before_compile(v), "");
  EXPECT_NE(sm90.variant_hash(v), sm90.variant_hash(variants_for(s, {p})[0]));
  Variant m = v;
  m.family = &find_family("fa2_simt");
  m.config = m.family->default_config;
  EXPECT_EQ(Compiler("sm_80").prune_before_compile(m), "has no window form");
  // The backward: every kernel (preprocess, dK/dV, convert) on the wrapped traits; a backward problem with a window
  // gets fa3_wgmma_bwd's modified variant and every other backward family's but fa2_mma_bwd's one-line reason.
  const Family& b = find_family("fa3_wgmma_bwd");
  const auto bn = b.name_expressions(b.default_config, 64, true, DType::bf16, false, false, kModWindow);
  ASSERT_EQ(bn.size(), 3u);
  for (const auto& e : bn) EXPECT_THAT(e, HasSubstr("<flashtune::AttnModTraits<flashtune::Fa3WgmmaBwdTraits<64,"));
  EXPECT_THAT(bn[0], HasSubstr("true>, true, false>>"));
  Problem wb = w;
  wb.direction = "bwd";
  const Space bs = space_from_json(json::parse(R"({"family":"fa3_wgmma_bwd","params":{"BLOCK_M":[64]},"head_dims":[128],
                                                  "causal":[false],"dtypes":["bf16"]})"));
  ASSERT_EQ(variants_for(bs, {wb}).size(), 1u);
  EXPECT_EQ(variants_for(bs, {wb})[0].mods, kModWindow);
  EXPECT_EQ(sm90.prune_before_compile(variants_for(bs, {wb})[0]), "");
  for (const auto& f : families())
    if (f.direction == "bwd" && f.name != "fa3_wgmma_bwd" && f.name != "fa2_mma_bwd") {
      EXPECT_EQ(f.shape_reason(wb), "does not support sliding windows (window)") << f.name;
      Variant o = variants_for(bs, {wb})[0];
      o.family = &f;
      o.config = f.default_config;
      EXPECT_EQ(sm90.prune_before_compile(o), "has no window form") << f.name;
    }
  // Space files: "mods" lists the forms to compile-check; a family without them refuses the list.
  const Space sm = space_from_json(json::parse(R"({"family":"fa3_wgmma","params":{"BLOCK_N":[64]},"head_dims":[128],
      "causal":[true],"dtypes":["bf16"],"mods":["none","window","softcap","window+softcap"]})"));
  EXPECT_EQ(sm.variants().size(), 4u);
  EXPECT_EQ(sm.size(), 4u);
  for (const auto& [text, needle] : {std::pair{R"({"family":"fa2_simt","mods":["window"]})", "family fa2_simt has no window form"},
                                     std::pair{R"({"family":"fa3_wgmma","mods":["dropout"]})", "'mods' holds"},
                                     std::pair{R"({"family":"fa3_wgmma","mods":["alibi+alibi"]})", "'mods' holds"},
                                     std::pair{R"({"family":"fa2_simt","mods":["softcap+alibi"]})",
                                               "family fa2_simt has no softcap+alibi form"}}) {
    try {
      space_from_json(json::parse(text));
      ADD_FAILURE() << text << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr(needle));
    }
  }
}

TEST(Problems, RejectsBadShapes) {
  auto bad = [](const char* text) { return problems_from_json(json::parse(text)); };
  EXPECT_THROW(bad(R"({"problems":[{"batch":0,"heads":1,"seq":8,"head_dim":64}]})"), UsageError);
  EXPECT_THROW(bad(R"({"problems":[{"batch":1,"heads":1,"seq":8}]})"), UsageError);
  EXPECT_THROW(bad(R"({"problems":[{"batch":1,"heads":1,"seq":8,"head_dim":64,"dtype":"fp8"}]})"), UsageError);
  EXPECT_THROW(bad(R"({"problems":[{"batch":1,"heads":1,"seq":8,"head_dim":64,"causal":1}]})"), UsageError);
  EXPECT_THROW(bad(R"({"grid":{"tokens":1000,"hidden":2048,"seq":[1024],"head_dim":[64]}})"), UsageError);
  EXPECT_THROW(bad(R"({"problems":[]})"), UsageError);
}

TEST(Problems, FlopsFollowFlashAttentionConvention) {
  Problem p{4, 16, 4096, 4096, 128, DType::fp32, false};
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 4 * 16 * 4096.0 * 4096 * 128);
  p.causal = true;
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * 4 * 16 * 4096.0 * 4096 * 128);
  EXPECT_EQ(p.seq_bucket(), 4096);
  p.seq_k = 4097;
  EXPECT_EQ(p.seq_bucket(), 8192);
}

namespace {
std::vector<std::string> committed_json(const std::string& sub) {  // configs/<sub>/*.json, sorted
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/" + sub))
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

TEST(CommittedConfigs, EveryFileParses) {  // every committed file, discovered
  const auto spaces = committed_json("spaces"), problems = committed_json("problems");
  EXPECT_FALSE(spaces.empty());
  EXPECT_FALSE(problems.empty());
  for (const auto& s : spaces) EXPECT_NO_THROW(load_space(s)) << s;
  for (const auto& p : problems) EXPECT_NO_THROW(load_problems(p)) << p;
}

TEST(CommittedConfigs, EveryFamilyHasASpaceFile) {
  // configs/spaces/<family>.json is what the NVRTC tests compile (a sample in CI, all of it on the GPU
  // machine) and what gpu_validate_families.sh validates: a family without one would go untested.
  for (const auto& f : families()) {
    const std::string path = std::string(FLASHTUNE_SOURCE_DIR) + "/configs/spaces/" + f.name + ".json";
    ASSERT_TRUE(std::filesystem::exists(path)) << "family " << f.name << " has no space file " << path;
    EXPECT_EQ(load_space(path).family, &f) << path << " names another family";
  }
}

namespace {
CUresult refuse_encode(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                       const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                       CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_ERROR_INVALID_VALUE;
}
}  // namespace

// fa3_wgmma's maps: Q, K, V, O in that order, 4-D (d, seq, heads, batch) with kv heads for K and V,
// boxes of the swizzle's columns x the tile rows, byte strides of the contiguous layout.
TEST(Family, Fa3TensorMapsFollowTheProblem) {
  const Family& f = find_family("fa3_wgmma");
  Problem p;
  p.batch = 3, p.heads = 8, p.heads_k = 2, p.seq_q = 333, p.seq_k = 517, p.head_dim = 96, p.dtype = DType::bf16;
  const Config c = f.parse_config("BLOCK_N=80,CONSUMERS=3");
  const auto specs = f.tensor_maps(c, p);
  ASSERT_EQ(specs.size(), 4u);
  const AttnTensorMaps m = encode_tensor_maps(&record_tensor_map, specs, p, {0x1000, 0x2000, 0x3000, 0x4000});
  const cuuint64_t row = 2 * 96;
  struct Want { cuuint64_t addr, seq, heads, box_rows; };
  const Want want[4] = {{0x1000, 333, 8, 192}, {0x2000, 517, 2, 80}, {0x3000, 517, 2, 80}, {0x4000, 333, 8, 64}};
  for (int i = 0; i < 4; ++i) {
    const auto* w = reinterpret_cast<const cuuint64_t*>(m.map[i].bits);
    EXPECT_EQ(w[0], want[i].addr) << i;
    EXPECT_EQ(w[1], 96u) << i;
    EXPECT_EQ(w[2], want[i].seq) << i;
    EXPECT_EQ(w[3], want[i].heads) << i;
    EXPECT_EQ(w[4], 3u) << i;
    EXPECT_EQ(w[5], row) << i;
    EXPECT_EQ(w[6], row * want[i].seq) << i;
    EXPECT_EQ(w[7], row * want[i].seq * want[i].heads) << i;
    EXPECT_EQ(w[8], 32u) << i;  // d = 96: 64-byte swizzle, 32 columns per box
    EXPECT_EQ(w[9], want[i].box_rows) << i;
    EXPECT_EQ(w[12], (cuuint64_t)CU_TENSOR_MAP_SWIZZLE_64B) << i;
    EXPECT_EQ(w[13], (cuuint64_t)CU_TENSOR_MAP_DATA_TYPE_BFLOAT16) << i;
  }
  // d = 128: 128-byte swizzle, 64 columns.
  p.head_dim = 128;
  EXPECT_EQ(f.tensor_maps(c, p)[0].box_cols, 64);
  EXPECT_EQ(f.tensor_maps(c, p)[0].swizzle_bytes, 128);
  // Refused: a spec the problem cannot have, and the driver's refusal, each named.
  TensorMapSpec bad{"dq", 64, 64, 128};
  EXPECT_THAT(tensor_map_error(bad, p), HasSubstr("unknown tensor"));
  bad = {"q", 300, 64, 128};
  EXPECT_THAT(tensor_map_error(bad, p), HasSubstr("rows"));
  bad = {"q", 64, 128, 128};
  EXPECT_THAT(tensor_map_error(bad, p), HasSubstr("columns"));
  EXPECT_THROW(encode_tensor_maps(&record_tensor_map, {bad}, p, {}), std::invalid_argument);
  EXPECT_THROW(encode_tensor_maps(&refuse_encode, specs, p, {}), std::runtime_error);
  p.dtype = DType::fp32;
  EXPECT_THAT(tensor_map_error(specs[0], p), HasSubstr("16-bit"));
  // The other families take no maps.
  EXPECT_TRUE(find_family("fa2_mma").tensor_maps(find_family("fa2_mma").default_config, p).empty());
}

// A strided view's map (Family::map_only_inputs): the view's byte strides for (seq, heads, batch), its
// address; an extent-1 dimension keeps the contiguous stride; views no map can read are named and refused.
TEST(Family, Fa3TensorMapsOfStridedViews) {
  const Family& f = find_family("fa3_wgmma");
  EXPECT_EQ(f.map_only_inputs, (std::vector<std::string>{"q", "k", "v"}));
  EXPECT_EQ(find_family("fa3_wgmma_bwd").map_only_inputs, (std::vector<std::string>{"q", "k", "v"}));
  EXPECT_TRUE(find_family("fa2_mma").map_only_inputs.empty());
  Problem p;
  p.batch = 2, p.heads = 4, p.seq_q = 333, p.seq_k = 517, p.head_dim = 128, p.dtype = DType::bf16;
  const Config c = f.parse_config("BLOCK_N=80,CONSUMERS=3");
  const int64_t q_bshd[4] = {333 * 4 * 128, 128, 4 * 128, 1};            // [B, S, H, d] seen as [B, H, S, d]
  const int64_t k_qkv[4] = {517 * 3 * 4 * 128, 128, 3 * 4 * 128, 1};     // k of a fused [B, S, 3, H, d] projection
  FwdTensors t{0x1000, 0x2000, 0x3000, 0x4000};
  t.strides = {q_bshd, k_qkv, nullptr, nullptr, nullptr};
  const AttnTensorMaps m = encode_tensor_maps(&record_tensor_map, f.tensor_maps(c, p), p, t);
  const auto* wq = reinterpret_cast<const cuuint64_t*>(m.map[0].bits);
  EXPECT_EQ(wq[0], 0x1000u);
  EXPECT_EQ(wq[5], 2u * 4 * 128);
  EXPECT_EQ(wq[6], 2u * 128);
  EXPECT_EQ(wq[7], 2u * 333 * 4 * 128);
  const auto* wk = reinterpret_cast<const cuuint64_t*>(m.map[1].bits);
  EXPECT_EQ(wk[5], 2u * 3 * 4 * 128);
  EXPECT_EQ(wk[6], 2u * 128);
  EXPECT_EQ(wk[7], 2u * 517 * 3 * 4 * 128);
  const auto* wv = reinterpret_cast<const cuuint64_t*>(m.map[2].bits);  // no strides given: contiguous
  EXPECT_EQ(wv[5], 2u * 128);
  EXPECT_EQ(wv[6], 2u * 128 * 517);
  // map_can_read: d unit-stride, strides multiples of 16 bytes, 16-byte aligned, extent-1 dims free.
  const int64_t ext[4] = {2, 4, 333, 128};
  EXPECT_TRUE(map_can_read(ext, q_bshd, 2, 0x1000));
  EXPECT_FALSE(map_can_read(ext, q_bshd, 2, 0x1008));                   // address
  const int64_t odd_row[4] = {333 * (4 * 128 + 4), 128, 4 * 128 + 4, 1};  // 8 bytes past a multiple of 16
  EXPECT_FALSE(map_can_read(ext, odd_row, 2, 0x1000));
  const int64_t d_strided[4] = {333 * 4 * 256, 256, 4 * 256, 2};
  EXPECT_FALSE(map_can_read(ext, d_strided, 2, 0x1000));
  const int64_t broadcast[4] = {0, 128, 4 * 128, 1};                     // a batch stride of 0
  EXPECT_FALSE(map_can_read(ext, broadcast, 2, 0x1000));
  const int64_t one_batch[4] = {1, 4, 333, 128}, any_batch_stride[4] = {7, 128, 4 * 128, 1};
  EXPECT_TRUE(map_can_read(one_batch, any_batch_stride, 2, 0x1000));
  t.strides = {odd_row, nullptr, nullptr, nullptr, nullptr};
  EXPECT_THROW(encode_tensor_maps(&record_tensor_map, f.tensor_maps(c, p), p, t), std::invalid_argument);
}

// A packed variable-length batch's maps: (d, heads, total tokens, 1) over the token-major tensors, strides
// of a head's d and a token's heads x d, boxes of 1 head x the rows (the same shared-memory image as the
// dense box of rows x 1 head): the kernel addresses a sequence's rows from its first token.
TEST(Family, Fa3TensorMapsOfPackedBatches) {
  const Family& f = find_family("fa3_wgmma");
  EXPECT_TRUE(f.varlen);
  const Problem p = problems_from_json(json::parse(R"({"problems":[{"heads":8,"heads_k":2,"head_dim":64,"dtype":"fp16",
      "varlen":{"seq_lens":[1,300,0,32],"seq_lens_k":[5,517,7,0]}}]})")).at(0);
  const Config c = f.parse_config("BLOCK_N=80,CONSUMERS=3");
  const AttnTensorMaps m = encode_tensor_maps(&record_tensor_map, f.tensor_maps(c, p), p, {0x1000, 0x2000, 0x3000, 0x4000});
  const cuuint64_t row = 2 * 64;
  struct Want { cuuint64_t heads, tokens, box_rows; };
  const Want want[4] = {{8, 333, 192}, {2, 529, 80}, {2, 529, 80}, {8, 333, 64}};
  for (int i = 0; i < 4; ++i) {
    const auto* w = reinterpret_cast<const cuuint64_t*>(m.map[i].bits);
    EXPECT_EQ(w[1], 64u) << i;
    EXPECT_EQ(w[2], want[i].heads) << i;
    EXPECT_EQ(w[3], want[i].tokens) << i;
    EXPECT_EQ(w[4], 1u) << i;
    EXPECT_EQ(w[5], row) << i;                                   // the next head: d elements on
    EXPECT_EQ(w[6], row * want[i].heads) << i;                   // the next token: H x d
    EXPECT_EQ(w[7], row * want[i].heads * want[i].tokens) << i;  // (one of it)
    EXPECT_EQ(w[8], 64u) << i;
    EXPECT_EQ(w[9], 1u) << i;
    EXPECT_EQ(w[10], want[i].box_rows) << i;
    EXPECT_EQ(w[11], 1u) << i;
    EXPECT_EQ(w[13], (cuuint64_t)CU_TENSOR_MAP_DATA_TYPE_FLOAT16) << i;
  }
}

// fa3_wgmma's PERSISTENT: one CTA per SM (at most one per tile) along x when the launch knows the SM
// count, else the plain grid (which the kernel's tile loop also covers); q_empty's 8 bytes; the tile
// order visits every tile once, causal ones longest first.
TEST(Family, Fa3PersistentGrid) {
  const Family& f = find_family("fa3_wgmma");
  EXPECT_EQ(f.params[6].name, "PERSISTENT");
  EXPECT_EQ(f.default_config[6], 0);
  Problem p;
  p.batch = 3, p.heads = 8, p.heads_k = 2, p.seq_q = 333, p.seq_k = 517, p.head_dim = 128, p.dtype = DType::bf16;
  const Config plain = f.parse_config("BLOCK_N=128,CONSUMERS=2"), persistent = f.parse_config("BLOCK_N=128,CONSUMERS=2,PERSISTENT=1");
  EXPECT_THAT(f.traits(persistent, 128, true, DType::bf16), HasSubstr("<128,128,2,2,1,1,0,1,0,0,1,true>"));
  auto grid = [&](const Config& c, int sm_count) {
    Problem q = p;
    q.sm_count = sm_count;
    const Launch l = f.launches(c, q).at(0);
    return std::vector<unsigned>{l.grid[0], l.grid[1], l.grid[2]};
  };
  const std::vector<unsigned> per_tile{3, 8, 3};  // ceil(333 / 128) query blocks, heads, batch: 72 tiles
  EXPECT_EQ(grid(plain, 0), per_tile);
  EXPECT_EQ(grid(plain, 132), per_tile);
  EXPECT_EQ(grid(persistent, 0), per_tile);  // SM count unknown: the plain grid
  EXPECT_EQ(grid(persistent, 132), (std::vector<unsigned>{72, 1, 1}));  // fewer tiles than SMs
  EXPECT_EQ(grid(persistent, 66), (std::vector<unsigned>{66, 1, 1}));
  EXPECT_EQ(grid(persistent, 1), (std::vector<unsigned>{1, 1, 1}));
  // Persistent: q_empty's 8 bytes, and O staged in a tile of its own (128 x 128 x 2 bytes) where it fits,
  // so that the next tile's Q loads during the epilogue; at d 256, BLOCK_N 80 it does not (Q's slot).
  EXPECT_TRUE(fa3_wgmma_separate_o(128, 128, 2, 2, 0, 1));
  EXPECT_EQ(f.launches(persistent, p).at(0).smem_bytes, f.launches(plain, p).at(0).smem_bytes + 8u + 32768u);
  EXPECT_FALSE(fa3_wgmma_separate_o(128, 128, 2, 2, 0, 0));  // the plain grid: one tile per CTA
  EXPECT_FALSE(fa3_wgmma_separate_o(256, 80, 2, 2, 0, 1));
  EXPECT_EQ(fa3_wgmma_smem_bytes(256, 80, 2, 2, 0, 1), fa3_wgmma_smem_bytes(256, 80, 2, 2, 0, 0) + 8);
  EXPECT_EQ(f.launches(persistent, p).at(0).threads, 384u);
  EXPECT_THAT(f.check({128, 2, 2, 1, 1, 0, 2, 0, 0}, 128), HasSubstr("PERSISTENT"));
  EXPECT_THAT(f.check({128, 2, 2, 1, 1, 0, 1, 0}, 128), HasSubstr("9 values"));  // a config of another length

  // Causal in sections of `group` (head, batch) pairs (0: one section), the last one narrower when the
  // group does not divide the 6 pairs: each section's query blocks longest first, its own pairs only.
  for (int group : {-1, 0, 1, 2, 4, 6, 9}) {
    const bool causal = group >= 0;
    const int qblocks = 5, heads = 3, batch = 2, pairs = heads * batch, g = group > 0 && group < pairs ? group : pairs;
    std::vector<int> seen(qblocks * heads * batch, 0);
    int prev_qblock = qblocks, prev_first = 0;
    for (int t = 0; t < qblocks * heads * batch; ++t) {
      const Fa3Tile x = fa3_wgmma_tile(t, qblocks, heads, batch, causal, group);
      ASSERT_TRUE(x.qblock >= 0 && x.qblock < qblocks && x.head >= 0 && x.head < heads && x.batch >= 0 && x.batch < batch);
      ++seen[(x.batch * heads + x.head) * qblocks + x.qblock];
      if (causal) {
        const int first = t / (g * qblocks) * g, bh = x.batch * heads + x.head;
        EXPECT_TRUE(bh >= first && bh < first + g) << group << " " << t;  // a pair of its section
        if (first != prev_first) prev_qblock = qblocks, prev_first = first;
        EXPECT_LE(x.qblock, prev_qblock) << group << " " << t;  // the later the query block, the more visible keys
        prev_qblock = x.qblock;
      } else {
        EXPECT_EQ(x.qblock, t % qblocks) << t;  // the query block fastest, as the plain grid
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), qblocks * heads * batch) << group;
  }
  // Sections keep K and V within 16 MiB (S 1k, d 64: 256 KiB a pair, 64 pairs), but span the grid's CTAs.
  EXPECT_EQ(fa3_wgmma_causal_group(1024, 64, 512, 32), 64);
  EXPECT_EQ(fa3_wgmma_causal_group(1024, 64, 512, 132), 132);
  EXPECT_EQ(fa3_wgmma_causal_group(1024, 64, 10, 132), 10);
  EXPECT_EQ(fa3_wgmma_causal_group(16384, 128, 16, 132), 16);  // one section: every pair
  EXPECT_EQ(fa3_wgmma_causal_group(16384, 128, 16, 1), 2);
  EXPECT_EQ(fa3_wgmma_causal_group(1 << 20, 256, 8, 0), 1);
}

// fa3_wgmma's TWO_CTAS (default 0: tables emitted before it, zero-filled, keep their meaning):
// two CTAs per SM split the registers (budgets within the launch allocation of __launch_bounds__(threads, 2))
// and the shared memory (233472 / 2 - 1024 each), and the persistent grid has two CTAs per SM. One CTA per
// SM keeps FlashAttention-3's budgets.
TEST(Family, Fa3TwoCtasPerSm) {
  const Family& f = find_family("fa3_wgmma");
  EXPECT_EQ(f.params[7].name, "TWO_CTAS");
  EXPECT_EQ(f.default_config[7], 0);
  for (int c = 1; c <= 3; ++c) {
    EXPECT_EQ(fa3_wgmma_ctas_by_regs(c, 1), 1) << c;  // one CTA per SM, as before
    EXPECT_EQ(fa3_wgmma_cta_regs(c, 1), fa3_wgmma_cta_regs(c)) << c;
  }
  EXPECT_EQ(fa3_wgmma_consumer_regs(1, 1), 240);
  EXPECT_EQ(fa3_wgmma_consumer_regs(3, 1), 160);
  EXPECT_EQ(fa3_wgmma_producer_regs(3, 1), 32);
  EXPECT_EQ(fa3_wgmma_producer_regs(2, 1), 24);
  // Within the launch allocation (168 x 384 at two consumers): 32 + 2 x 240 would leave the consumers'
  // setmaxnreg.inc waiting for 1024 registers that never free (every such kernel hung on the H100).
  EXPECT_EQ(fa3_wgmma_cta_regs(2, 1), 64512);
  EXPECT_EQ(fa3_wgmma_cta_regs(3, 1), 65536);
  for (int c = 1; c <= 3; ++c)
    for (int ctas = 1; ctas <= 2; ++ctas)
      for (int mc = 0; mc <= 1; ++mc) {
        EXPECT_LE(fa3_wgmma_cta_regs(c, ctas, mc), fa3_wgmma_launch_regs(c, ctas) * fa3_wgmma_threads(c)) << c << ctas << mc;
        EXPECT_TRUE(fa3_wgmma_regs_ok(c, ctas, mc)) << c << ctas << mc;
      }
  EXPECT_EQ(fa3_wgmma_launch_regs(1, 2), 128);
  EXPECT_EQ(fa3_wgmma_producer_regs(1, 2), 24);
  EXPECT_EQ(fa3_wgmma_consumer_regs(1, 2), 232);
  EXPECT_EQ(fa3_wgmma_cta_regs(1, 2), 32768);  // exactly the launch allocation: 128 x 256 threads
  EXPECT_EQ(fa3_wgmma_consumer_regs(2, 2), 104);  // 80 x 384 threads = 30720 >= 128 x (24 + 2 x 104)
  EXPECT_EQ(fa3_wgmma_ctas_by_regs(1, 2), 2);
  EXPECT_EQ(fa3_wgmma_ctas_by_regs(2, 2), 2);

  // Pruning: shared memory per CTA, the consumer budget, the value itself.
  EXPECT_EQ(fa3_wgmma_check(64, 192, 1, 2, 0, 0, 0, 1, 1), nullptr);
  EXPECT_EQ(fa3_wgmma_check(128, 80, 1, 2, 1, 0, 0, 1, 1), nullptr);
  EXPECT_EQ(fa3_wgmma_check(64, 80, 2, 2, 0, 0, 0, 0, 1), nullptr);  // 32 + 40 accumulators of 104 - 32
  EXPECT_THAT(fa3_wgmma_check(128, 96, 1, 2, 0, 0, 0, 0, 1), HasSubstr("shared memory"));  // 115784 > 115712
  EXPECT_EQ(fa3_wgmma_check(128, 96, 1, 2, 0, 0, 0, 0, 0), nullptr);  // one CTA per SM: the device's limit
  EXPECT_THAT(fa3_wgmma_check(256, 64, 1, 2, 0, 0, 0, 0, 1), HasSubstr("shared memory"));
  EXPECT_THAT(fa3_wgmma_check(64, 96, 2, 2, 0, 0, 0, 0, 1), HasSubstr("accumulators"));
  EXPECT_THAT(fa3_wgmma_check(128, 64, 2, 2, 0, 0, 0, 0, 1), HasSubstr("accumulators"));
  EXPECT_THAT(fa3_wgmma_check(32, 64, 3, 2, 0, 0, 0, 0, 1), HasSubstr("accumulators"));
  EXPECT_THAT(fa3_wgmma_check(64, 64, 1, 2, 0, 0, 0, 0, 2), HasSubstr("TWO_CTAS"));

  Problem p;
  p.batch = 16, p.heads = 16, p.seq_q = 1024, p.seq_k = 1024, p.head_dim = 128, p.dtype = DType::bf16;
  p.sm_count = 132;
  const Config two = f.parse_config("BLOCK_N=80,CONSUMERS=1,PINGPONG=0,PERSISTENT=1,TWO_CTAS=1"),
               one = f.parse_config("BLOCK_N=80,CONSUMERS=1,PINGPONG=0,PERSISTENT=1");
  EXPECT_THAT(f.traits(two, 128, true, DType::bf16), HasSubstr("<128,80,1,2,1,0,0,1,1,0,1,true>"));
  EXPECT_EQ(f.launches(two, p).at(0).grid[0], 264u);  // 4096 tiles of 64 rows, two CTAs on each of 132 SMs
  EXPECT_EQ(f.launches(one, p).at(0).grid[0], 132u);
  EXPECT_EQ(f.launches(two, p).at(0).threads, 256u);
  // One CTA per SM stages O apart (16384 bytes more); two do not fit that in half the SM's shared memory.
  EXPECT_EQ(f.launches(two, p).at(0).smem_bytes + 16384u, f.launches(one, p).at(0).smem_bytes);
  EXPECT_FALSE(fa3_wgmma_separate_o(128, 80, 1, 2, 0, 1, 2));
  p.batch = 1, p.heads = 2, p.seq_q = 333;  // 12 tiles: one CTA each
  EXPECT_EQ(f.launches(two, p).at(0).grid[0], 12u);
  p.sm_count = 0;  // unknown: the plain grid
  EXPECT_EQ(f.launches(two, p).at(0).grid[0], 6u);
}

// fa3_wgmma's MULTICAST (last tunable, default 0: tables emitted before it, zero-filled, keep their meaning):
// clusters of two CTAs along x on the plain grid, its query blocks rounded up to whole clusters; each CTA
// copies half of a K or V block (the maps' box rows); non-causal, dense, PERSISTENT 0 only, each refused with
// its reason (the compile stage prunes causal and packed variants before NVRTC sees them).
TEST(Family, Fa3MulticastClusters) {
  const Family& f = find_family("fa3_wgmma");
  EXPECT_EQ(f.params.back().name, "MULTICAST");
  EXPECT_EQ(f.default_config.back(), 0);
  Problem p;
  p.batch = 3, p.heads = 8, p.heads_k = 2, p.seq_q = 333, p.seq_k = 517, p.head_dim = 128, p.dtype = DType::bf16;
  p.sm_count = 132;
  const Config mc = f.parse_config("BLOCK_N=176,CONSUMERS=2,MULTICAST=1"), plain = f.parse_config("BLOCK_N=176,CONSUMERS=2");
  EXPECT_THAT(f.traits(mc, 128, false, DType::bf16), HasSubstr("<128,176,2,2,1,1,0,0,0,1,1,false>"));
  const Launch l = f.launches(mc, p).at(0), l0 = f.launches(plain, p).at(0);
  EXPECT_EQ(l.cluster_x, 2u);
  EXPECT_EQ(l0.cluster_x, 1u);
  EXPECT_EQ(l.grid[0], 4u);  // ceil(333 / 128) = 3 query blocks, rounded up to two clusters
  EXPECT_EQ(l0.grid[0], 3u);
  EXPECT_EQ(l.grid[1], 8u);
  EXPECT_EQ(l.grid[2], 3u);
  EXPECT_EQ(l.smem_bytes, l0.smem_bytes);  // the same slots: each CTA's copies fill half of both CTAs'
  p.seq_q = 256;  // two query blocks: one cluster, no spare
  EXPECT_EQ(f.launches(mc, p).at(0).grid[0], 2u);
  p.seq_q = 1;
  EXPECT_EQ(f.launches(mc, p).at(0).grid[0], 2u);
  // K and V boxes of half a block's rows; Q and O as before.
  const auto maps = f.tensor_maps(mc, p), maps0 = f.tensor_maps(plain, p);
  EXPECT_EQ(maps[0].box_rows, 128);
  EXPECT_EQ(maps[1].box_rows, 88);
  EXPECT_EQ(maps[2].box_rows, 88);
  EXPECT_EQ(maps0[1].box_rows, 176);
  EXPECT_EQ(maps[3].box_rows, 64);
  EXPECT_EQ(fa3_wgmma_kv_box_rows(64, 1), 32);
  // The producer's multicast copies take 32 registers (24 spilled): two consumers give up 8 each.
  EXPECT_EQ(fa3_wgmma_producer_regs(2, 1, 1), 32);
  EXPECT_EQ(fa3_wgmma_consumer_regs(2, 1, 1), 232);
  EXPECT_EQ(fa3_wgmma_consumer_regs(3, 1, 1), 160);
  EXPECT_EQ(fa3_wgmma_consumer_regs(1, 1, 1), 240);
  // Where it is refused, and why.
  EXPECT_EQ(f.check(mc, 128), nullptr);
  EXPECT_THAT(f.check(f.parse_config("BLOCK_N=176,CONSUMERS=2,PERSISTENT=1,MULTICAST=1"), 128), HasSubstr("PERSISTENT 0"));
  EXPECT_THAT(fa3_wgmma_check(128, 128, 2, 2, 1, 1, 0, 0, 0, 2), HasSubstr("MULTICAST must be 0 or 1"));
  EXPECT_EQ(f.causal_check(mc, false), nullptr);
  EXPECT_THAT(f.causal_check(mc, true), HasSubstr("non-causal only"));
  EXPECT_EQ(f.causal_check(plain, true), nullptr);
  EXPECT_THAT(f.varlen_check(mc), HasSubstr("dense only"));
  EXPECT_EQ(f.varlen_check(plain), nullptr);
  EXPECT_EQ(f.check(f.parse_config("BLOCK_N=80,CONSUMERS=1,PINGPONG=0,TWO_CTAS=1,MULTICAST=1"), 64), nullptr);
  // The compile stage prunes with those reasons, before NVRTC.
  Compiler c("sm_90");
  EXPECT_THAT(c.prune_before_compile(Variant{&f, mc, 128, true, DType::bf16}), HasSubstr("non-causal only"));
  Variant packed{&f, mc, 128, false, DType::bf16};
  packed.varlen = true;
  EXPECT_THAT(c.prune_before_compile(packed), HasSubstr("dense only"));
  EXPECT_EQ(c.prune_before_compile(Variant{&f, mc, 128, false, DType::bf16}), "");
}

// fa3_wgmma_bwd's budgets, prunes, shared memory, workspace and grids (templates/fa3_wgmma_bwd_traits.h): the
// same functions the kernel's static_asserts and the family's check call.
// fa3_wgmma_bwd's DETERMINISTIC protocol over the whole grid (emulate_det_grid) for every scheduler that allows it
// (SCHED 0, 1 and 3): fa3_bwd_dkdv_grid's dims, bwd_grouped_pair's pairs, key blocks counted from the last down under
// DETERMINISTIC 2. Never a deadlock, whatever the residency, and every (pair, head, block) receives its contributors
// in key-block order; the last group's CTAs past the pairs have no work.
TEST(Family, Fa3BwdDeterministicGridNeverDeadlocks) {
  auto emulate = [](int sched, int order, bool causal, int sq, int sk, int batch, int hk, int group, int slots,
                    int pair_group, bool launch_down) {
    constexpr int BM = 64, CONSUMERS = 2, BN = 64 * CONSUMERS;
    const GridDims g = fa3_bwd_dkdv_grid(batch, hk, sk, CONSUMERS, sched, pair_group);
    auto cta_at = [&](int x, int y, int z) {
      const bool grouped = sched == 1 || sched == 3;
      const int index = grouped ? y : x, count = grouped ? g.y : g.x;
      return EmulatedCta{grouped ? bwd_grouped_pair(x, z, g.x) : z * hk + y, launch_down ? count - 1 - index : index};
    };
    return emulate_det_grid(DetGridCase{order, causal, BM, BN, sq, sk, batch * hk, group}, g, slots, cta_at);
  };
  for (int sched : {0, 1, 3})
    for (bool causal : {false, true})
      for (int order : {1, 2}) {
        if (order == 2 && !causal) continue;  // the causal check's prune
        for (int slots : {1, 3, 16})
          for (auto [sq, sk] : {std::pair{517, 1000}, std::pair{1000, 333}, std::pair{300, 300}})
            for (int pair_group : {1, 2, 5}) {
              if (sched != 3 && pair_group != 1) continue;
              SCOPED_TRACE("sched " + std::to_string(sched) + " order " + std::to_string(order) + " causal " +
                           std::to_string(causal) + " slots " + std::to_string(slots) + " sq " + std::to_string(sq) +
                           " sk " + std::to_string(sk) + " pair group " + std::to_string(pair_group));
              // 3 sequences x 2 kv heads (6 pairs; 5 per group leaves a short last group), 2 query heads each.
              EXPECT_TRUE(
                  emulate(sched, order, causal, sq, sk, 3, 2, 2, slots, sched == 1 ? 6 : pair_group, order == 2));
            }
      }
  // The control: descending turns launched ascending deadlock with few resident CTAs, under either order of the grid.
  for (int sched : {0, 3}) EXPECT_FALSE(emulate(sched, 2, true, 1000, 1000, 1, 1, 1, 2, 1, false)) << sched;
}

TEST(Family, Fa3BwdBudgetsAndPrunes) {
  // setmaxnreg: one CTA per SM, 128 (C + 1) threads; the budgets add up to at most the launch allocation.
  // (fa3_wgmma's budgets at one CTA per SM, which the traits take.)
  EXPECT_EQ(fa3_wgmma_launch_regs(2, 1), 168);
  EXPECT_EQ(fa3_wgmma_producer_regs(2), 24);
  EXPECT_EQ(fa3_wgmma_consumer_regs(2), 240);
  EXPECT_EQ(fa3_wgmma_consumer_regs(1), 240);
  EXPECT_EQ(fa3_wgmma_producer_regs(3), 32);
  EXPECT_EQ(fa3_wgmma_consumer_regs(3), 160);
  for (int c = 1; c <= 3; ++c) EXPECT_TRUE(fa3_wgmma_regs_ok(c, 1)) << c;
  EXPECT_EQ((Fa3WgmmaBwdTraits<128, 64, 2, 2, 0, 1, 0, 0, 1, 1, false>::kConsumerRegs), 240);
  EXPECT_EQ((Fa3WgmmaBwdTraits<128, 64, 2, 2, 0, 1, 0, 0, 1, 1, false>::kThreads), 384);
  // FlashAttention-3's tiles: d 128 64 x 128 and d 64 128 x 128, two consumers.
  EXPECT_EQ(fa3_bwd_check(128, 64, 2, 2, 0, 1, 0), nullptr);
  EXPECT_EQ(fa3_bwd_check(64, 128, 2, 2, 0, 0, 1), nullptr);
  EXPECT_EQ(fa3_bwd_check(96, 64, 1, 2, 0, 0, 0), nullptr);
  // Prunes, each with its reason.
  EXPECT_THAT(fa3_bwd_check(256, 64, 1, 2, 0, 0, 0), HasSubstr("D must be"));
  EXPECT_THAT(fa3_bwd_check(64, 112, 1, 2, 0, 0, 0), HasSubstr("BLOCK_M"));
  EXPECT_THAT(fa3_bwd_check(64, 32, 1, 2, 0, 0, 0), HasSubstr("BLOCK_M"));
  // dQ^T (BLOCK_M 80 or 96, FlashAttention-3's dQ_swapAB): FlashAttention-3's 80 x 128 tile at d 128 non-causal, each
  // consumer one row tile of the head dim (one chain of 80 columns); the accumulators' margin 32 there (128 + 80).
  EXPECT_EQ(fa3_bwd_check(128, 80, 2, 2, 0, 0, 0), nullptr);
  EXPECT_EQ(fa3_bwd_check(128, 80, 2, 2, 0, 1, 0), nullptr);     // DQ_OVERLAP 1: one chain a consumer
  EXPECT_EQ(fa3_bwd_check(128, 80, 2, 2, 0, 0, 1), nullptr);     // DQ_TURNS: both row tiles by one consumer
  EXPECT_EQ(fa3_bwd_check(64, 96, 1, 2, 0, 0, 0), nullptr);      // d 64: one row tile, one consumer
  EXPECT_THAT(fa3_bwd_check(64, 80, 2, 2, 0, 0, 0), HasSubstr("dQ pieces"));   // one row tile for two consumers
  EXPECT_THAT(fa3_bwd_check(96, 80, 1, 2, 0, 0, 0), HasSubstr("dQ pieces"));   // d 96: 32-column swizzle groups
  EXPECT_THAT(fa3_bwd_check(128, 96, 2, 2, 0, 0, 0), HasSubstr("accumulators"));  // 128 + 96 > 240 - 32
  EXPECT_TRUE(fa3_bwd_dq_transposed(80) && fa3_bwd_dq_transposed(96) && !fa3_bwd_dq_transposed(64));
  EXPECT_EQ(fa3_bwd_dq_row_tiles(128, 80), 2);
  EXPECT_EQ(fa3_bwd_dq_chunk(128, 80, 2), 80);
  EXPECT_EQ(fa3_bwd_dq_steps(128, 80, 2), 1);
  EXPECT_EQ(fa3_bwd_dq_steps(128, 80, 2, 1), 2);
  // 80 x 128 at d 128: K, V, two Q/dO slots of 80 rows, two dS^T tiles, one dQ^T tile fit; two do not.
  EXPECT_EQ(fa3_bwd_smem_bytes(128, 80, 2, 2), 1024 + 65536 + 4 * 20480 + 2 * 20480 + 40960 + 4 * 320 + 40);
  EXPECT_THAT(fa3_bwd_check(128, 80, 2, 2, 0, 0, 0, 0, 2), HasSubstr("shared memory"));
  // dQ^T's staging order: chain c is row tile c of the head dim (d 64 c ..), its float4 j 128 + thread at
  // head-dim row 16 warp + lane / 4 and query column 8 j + 2 (lane % 4).
  {
    int row = -1, col = -1;
    fa3_bwd_dq_place(0, 80, 80, row, col);
    EXPECT_EQ(row, 0); EXPECT_EQ(col, 0);
    fa3_bwd_dq_place(16 * 80 + 128 * 9 + 32 * 3 + 4 * 7 + 3, 80, 80, row, col);  // chain 1, j 9, warp 3, lane 31
    EXPECT_EQ(row, 64 + 48 + 7); EXPECT_EQ(col, 72 + 6);
  }
  EXPECT_THAT(fa3_bwd_check(64, 64, 4, 2, 0, 0, 0), HasSubstr("CONSUMERS"));
  EXPECT_THAT(fa3_bwd_check(64, 64, 1, 3, 0, 0, 0), HasSubstr("STAGES"));
  EXPECT_THAT(fa3_bwd_check(64, 64, 1, 0, 0, 0, 0), HasSubstr("STAGES"));
  EXPECT_THAT(fa3_bwd_check(64, 64, 1, 2, 4, 0, 0), HasSubstr("SCHED"));
  EXPECT_EQ(fa3_bwd_check(64, 64, 1, 2, 3, 0, 0), nullptr);  // SCHED 3: groups of pairs
  EXPECT_THAT(fa3_bwd_check(128, 128, 2, 2, 0, 0, 0), HasSubstr("accumulators"));  // 128 + 128 > 240 - 48
  EXPECT_THAT(fa3_bwd_check(64, 64, 3, 2, 0, 0, 0), HasSubstr("accumulators"));   // 128 > 160 - 48
  EXPECT_THAT(fa3_bwd_check(96, 64, 2, 2, 0, 0, 0), HasSubstr("dQ pieces"));      // 48 columns of 32-column groups
  EXPECT_THAT(fa3_bwd_check(64, 64, 3, 2, 0, 0, 1), HasSubstr("two consumer"));
  EXPECT_THAT(fa3_bwd_check(128, 64, 2, 2, 0, 1, 1), HasSubstr("DQ_OVERLAP 1"));  // a whole d 128 dQ: two chains
  // Deterministic dQ: ordered by key block under SCHED 0 and 1, not with SCHED 2's rotated walks.
  EXPECT_EQ(fa3_bwd_check(128, 64, 2, 2, 0, 1, 0, 1), nullptr);
  EXPECT_EQ(fa3_bwd_check(64, 128, 2, 2, 1, 0, 1, 1), nullptr);
  EXPECT_THAT(fa3_bwd_check(64, 128, 2, 2, 2, 0, 1, 1), HasSubstr("DETERMINISTIC 1 needs SCHED 0 or 1"));
  EXPECT_THAT(fa3_bwd_check(64, 128, 2, 2, 0, 0, 1, 3), HasSubstr("DETERMINISTIC must be"));
  EXPECT_EQ(fa3_bwd_check(64, 128, 2, 2, 0, 0, 1, 2), nullptr);
  // The turns' order: Family.BwdDqTurnsFollowTheWalks (shared with fa2_wgmma_bwd).
  // Two dQ staging tiles: 32 KB more at d 128 BLOCK_M 64 (231464 bytes of 232448), too many with three consumers.
  EXPECT_EQ(fa3_bwd_check(128, 64, 2, 2, 0, 1, 0, 1, 2), nullptr);
  EXPECT_EQ(fa3_bwd_smem_bytes(128, 64, 2, 2, 2), fa3_bwd_smem_bytes(128, 64, 2, 2) + 4 * 64 * 128);
  EXPECT_THAT(fa3_bwd_check(128, 64, 2, 2, 0, 1, 0, 0, 3), HasSubstr("DQ_STAGES must be"));
  // DQ_STAGES 0: dQ added from the registers, no staging tile or writer (and so no fixed order: not deterministic).
  EXPECT_EQ(fa3_bwd_check(128, 64, 2, 2, 0, 1, 0, 0, 0), nullptr);
  EXPECT_EQ(fa3_bwd_check(64, 128, 2, 2, 0, 0, 1, 0, 0), nullptr);
  EXPECT_THAT(fa3_bwd_check(128, 64, 2, 2, 0, 0, 1, 1, 0), HasSubstr("DETERMINISTIC needs DQ_STAGES 1 or 2"));
  EXPECT_THAT(fa3_bwd_check(128, 64, 2, 2, 0, 0, 1, 2, 0), HasSubstr("DETERMINISTIC needs DQ_STAGES 1 or 2"));
  EXPECT_EQ(fa3_bwd_smem_bytes(128, 64, 2, 2, 0), fa3_bwd_smem_bytes(128, 64, 2, 2, 1) - 4 * 64 * 128);
  EXPECT_TRUE((Fa3WgmmaBwdTraits<128, 64, 2, 2, 0, 1, 0, 0, 0, 1, false>::kDqDirect));
  EXPECT_THAT(fa3_bwd_check(64, 64, 3, 2, 0, 0, 0, 0, 2), HasSubstr("accumulators"));
  EXPECT_THAT(fa3_bwd_check(64, 128, 2, 2, 0, 0, 1, 0, 2), HasSubstr("shared memory"));  // 40 bytes over
  EXPECT_EQ(fa3_bwd_check(64, 128, 2, 1, 0, 0, 1, 0, 2), nullptr);
  // dQ chains per consumer and step.
  EXPECT_EQ(fa3_bwd_dq_steps(128, 64, 2), 1);
  EXPECT_EQ(fa3_bwd_dq_steps(128, 64, 2, 1), 2);
  EXPECT_EQ(fa3_bwd_dq_steps(64, 128, 2, 1), 2);
  EXPECT_EQ(fa3_bwd_dq_steps(64, 128, 1), 2);
  // Shared memory: K, V, two Q/dO slots, two dS^T tiles, the dQ tile, lse/delta slots, 5 mbarriers, the slack.
  EXPECT_EQ(fa3_bwd_smem_bytes(128, 64, 2, 2), 1024 + 65536 + 65536 + 32768 + 32768 + 1024 + 40);
  EXPECT_LE(fa3_bwd_smem_bytes(64, 128, 2, 2), kMaxSmemBytesSm90);
  // Workspace: lse2, delta and dq_accum over rows padded to whole query blocks, then a turn counter per block.
  EXPECT_EQ(fa3_bwd_padded_rows(100, 64), 128);
  EXPECT_EQ(fa3_bwd_workspace_bytes(2, 3, 100, 64, 64), 2LL * 3 * 128 * (8 + 4 * 64) + 2LL * 3 * 2 * 4);
  // Grids: the preprocess over padded rows, the convert over query blocks, dK/dV by key block (SCHED 1: pairs first).
  const GridDims pre = fa3_bwd_preprocess_grid(2, 3, 100, 64), cv = fa3_bwd_convert_grid(2, 3, 100, 64);
  EXPECT_EQ(pre.x, 4); EXPECT_EQ(pre.y, 3); EXPECT_EQ(pre.z, 2);
  EXPECT_EQ(cv.x, 2); EXPECT_EQ(cv.y, 3); EXPECT_EQ(cv.z, 2);
  const GridDims g0 = fa3_bwd_dkdv_grid(2, 4, 1000, 2, 0), g1 = fa3_bwd_dkdv_grid(2, 4, 1000, 2, 1),
                 g2 = fa3_bwd_dkdv_grid(2, 4, 1000, 2, 2);
  EXPECT_EQ(g0.x, 8); EXPECT_EQ(g0.y, 4); EXPECT_EQ(g0.z, 2);
  EXPECT_EQ(g1.x, 8); EXPECT_EQ(g1.y, 8); EXPECT_EQ(g1.z, 1);
  EXPECT_EQ(g2.x, g0.x); EXPECT_EQ(g2.y, g0.y); EXPECT_EQ(g2.z, g0.z);
  // SCHED 3: groups of pairs whose Q and dO fit 16 MB (8 pairs here: 2 x 4 pairs, 3 per group), key blocks
  // within a group, the last group short by one pair.
  const GridDims g3 = fa3_bwd_dkdv_grid(2, 4, 1000, 2, 3, 3);
  EXPECT_EQ(g3.x, 3); EXPECT_EQ(g3.y, 8); EXPECT_EQ(g3.z, 3);
  EXPECT_EQ(bwd_pair_group(512, 1, 1024, 64), 64);     // 256 KB a pair
  EXPECT_EQ(bwd_pair_group(64, 4, 8192, 128), 1);      // 16 MB a pair (4 query heads of 8k at d 128)
  EXPECT_EQ(bwd_pair_group(1000, 4, 100000, 128), 1);  // past the share: one pair at a time
  EXPECT_EQ(bwd_pair_group(8, 1, 1024, 64), 8);        // never past the pairs
  EXPECT_EQ(bwd_pair_group(0, 1, 1024, 64), 1);
  EXPECT_EQ(bwd_pair_group(16, 4, 2048, 128), 4);      // GQA 32/8 at 2k: 4 MB a pair
}

// The dQ staging order (fa3_bwd_dq_place): every element of a query block's BM x D tile once, and each
// consumer's piece (kDqPieceBytes from piece x kDqPieceBytes) exactly the rows and columns it computes, so
// that one bulk add per piece lands it and the convert maps it back.
template <class T>
void expect_dq_layout_covers_pieces() {
  constexpr int BM = T::kBlockM, D = T::kHeadDim, P = T::kDqPieces, per_piece = BM * D / 4 / P;
  std::vector<int> seen(BM * D, -1);
  for (int f = 0; f < BM * D / 4; ++f) {
    int row, col;
    fa3_bwd_dq_place(f, D, T::kDqChunk, row, col);
    ASSERT_TRUE(row >= 0 && row + 8 < BM && col >= 0 && col + 1 < D) << f;
    for (int e = 0; e < 4; ++e) {
      const int at = (row + 8 * (e >> 1)) * D + col + (e & 1);
      EXPECT_EQ(seen[at], -1) << "element " << at << " placed twice";
      seen[at] = f / per_piece;
    }
  }
  for (int c = 0; c < P; ++c) {  // the piece of consumer c (dq_piece): row tiles, or one row tile's columns
    const int row0 = T::kDqTurns ? 0 : 64 * (c / T::kDqColPieces) * (BM / 64 > P ? BM / 64 / P : 1),
              rows = T::kDqTurns ? BM : BM / 64 > P ? BM / P : 64,
              col0 = T::kDqTurns ? 0 : (c % T::kDqColPieces) * T::kDqCols, cols = T::kDqCols;
    for (int r = 0; r < BM; ++r)
      for (int x = 0; x < D; ++x) {
        const bool mine = r >= row0 && r < row0 + rows && x >= col0 && x < col0 + cols;
        if (mine) EXPECT_EQ(seen[r * D + x], c) << "row " << r << " col " << x;
      }
  }
}

TEST(Family, Fa3BwdDqLayoutCoversPieces) {
  expect_dq_layout_covers_pieces<Fa3WgmmaBwdTraits<64, 128, 2, 2, 0, 1, 0, 0, 1, 1, true>>();   // 2 row tiles
  expect_dq_layout_covers_pieces<Fa3WgmmaBwdTraits<128, 64, 2, 2, 0, 1, 0, 0, 2, 1, false>>();  // 2 column halves
  expect_dq_layout_covers_pieces<Fa3WgmmaBwdTraits<64, 64, 1, 2, 0, 0, 0, 0, 1, 0, false>>();   // one row tile
  expect_dq_layout_covers_pieces<Fa3WgmmaBwdTraits<64, 128, 2, 2, 0, 0, 1, 0, 1, 1, true>>();   // DQ_TURNS: one
  expect_dq_layout_covers_pieces<Fa3WgmmaBwdTraits<96, 64, 1, 2, 0, 0, 0, 0, 1, 0, false>>();   // d 96, 32-col chunks
  expect_dq_layout_covers_pieces<Fa3WgmmaBwdTraits<64, 128, 1, 2, 0, 0, 0, 0, 1, 1, false>>();  // one consumer
  EXPECT_EQ((Fa3WgmmaBwdTraits<128, 64, 2, 2, 0, 1, 0, 0, 2, 1, false>::kDqPieces), 2);
  EXPECT_EQ((Fa3WgmmaBwdTraits<128, 64, 2, 2, 0, 1, 0, 0, 2, 1, false>::kDqPieceBytes), 4 * 64 * 128 / 2);
  EXPECT_EQ((Fa3WgmmaBwdTraits<64, 128, 2, 2, 0, 0, 1, 0, 1, 1, false>::kDqPieces), 1);
}

// The family: Hopper only, GQA, dense only; its maps Q, K, V and dO (query-side geometry, the backward's dO
// address), its three launches and its workspace.
TEST(Family, Fa3BwdFamilyMapsAndLaunches) {
  const Family& f = find_family("fa3_wgmma_bwd");
  EXPECT_EQ(f.direction, "bwd");
  EXPECT_TRUE(f.hopper_only);
  EXPECT_TRUE(f.gqa);
  EXPECT_FALSE(f.varlen);
  EXPECT_TRUE(f.workspace_written);
  for (int d : f.head_dims) EXPECT_EQ(f.check(f.default_config, d), nullptr) << d;
  Problem p;
  p.direction = "bwd", p.batch = 2, p.heads = 8, p.heads_k = 2, p.seq_q = 333, p.seq_k = 517, p.head_dim = 128;
  p.dtype = DType::bf16;
  const Config c = f.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=0");
  EXPECT_FALSE(f.reproducible(c));
  EXPECT_TRUE(f.reproducible(f.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=1")));
  EXPECT_THAT(f.check({64, 2, 2, 0, 1, 0}, 128), HasSubstr("8 values"));
  const Config det2 = f.parse_config("BLOCK_M=64,CONSUMERS=2,DETERMINISTIC=2");
  EXPECT_TRUE(f.reproducible(det2));
  EXPECT_EQ(f.causal_check(det2, true), nullptr);
  EXPECT_THAT(f.causal_check(det2, false), HasSubstr("causal mask"));  // a config stored before DETERMINISTIC
  const auto specs = f.tensor_maps(c, p);
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[3].tensor, "do");
  for (const auto& m : specs) EXPECT_EQ(tensor_map_error(m, p), "") << m.tensor;
  const AttnTensorMaps m = encode_tensor_maps(&record_tensor_map, specs, p, {0x1000, 0x2000, 0x3000, 0x4000, 0x5000});
  struct Want { cuuint64_t addr, seq, heads, box_rows; };
  const Want want[4] = {{0x1000, 333, 8, 64}, {0x2000, 517, 2, 128}, {0x3000, 517, 2, 128}, {0x5000, 333, 8, 64}};
  for (int i = 0; i < 4; ++i) {
    const auto* w = reinterpret_cast<const cuuint64_t*>(m.map[i].bits);
    EXPECT_EQ(w[0], want[i].addr) << i;
    EXPECT_EQ(w[2], want[i].seq) << i;
    EXPECT_EQ(w[3], want[i].heads) << i;
    EXPECT_EQ(w[8], 64u) << i;  // d 128: 128-byte swizzle, 64 columns per box
    EXPECT_EQ(w[9], want[i].box_rows) << i;
  }
  const auto ls = f.launches(c, p);
  ASSERT_EQ(ls.size(), 3u);
  EXPECT_EQ(ls[0].threads, (unsigned)kFa3BwdRowThreads);
  EXPECT_EQ(ls[1].threads, 384u);
  EXPECT_EQ(ls[1].smem_bytes, (unsigned)fa3_bwd_smem_bytes(128, 64, 2, 2));
  EXPECT_EQ(ls[1].grid[0], 5u);  // ceil(517 / 128) key blocks
  EXPECT_EQ(ls[1].grid[1], 2u);  // kv heads
  EXPECT_EQ(ls[2].grid[0], 6u);  // ceil(333 / 64) query blocks
  EXPECT_EQ(f.workspace_bytes(c, p), (size_t)fa3_bwd_workspace_bytes(2, 8, 333, 128, 64));
  // d 96: 64-byte swizzle, 32 columns; two consumers would split dQ into 48-column pieces.
  p.head_dim = 96;
  EXPECT_EQ(f.tensor_maps(c, p)[0].box_cols, 32);
  EXPECT_EQ(f.tensor_maps(c, p)[0].swizzle_bytes, 64);
  EXPECT_THAT(f.check(c, 96), HasSubstr("dQ pieces"));
  EXPECT_EQ(f.shape_reason(p), "");  // dense grouped-query attention is served (there is no packed form yet)
}

// A mask_mod refuses fa3_wgmma_bwd's DQ_TURNS 1 (dK and dQ measured wrong on the H200) and DETERMINISTIC; the runtime
// runs a refused pick with both off (mods_fallback), which the check takes; configs without a mask are untouched.
TEST(Family, Fa3BwdMaskRefusesTurnsAndFallsBack) {
  const Family& f = find_family("fa3_wgmma_bwd");
  const Config pick = f.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=3,DQ_TURNS=1,DQ_STAGES=1");
  EXPECT_EQ(f.mods_check(pick, 0), nullptr);
  EXPECT_EQ(f.mods_check(pick, kModWindow | kModSoftcap), nullptr);
  EXPECT_THAT(f.mods_check(pick, kModMask), HasSubstr("DQ_TURNS 1"));
  const Config alt = f.mods_fallback(pick, kModMask);
  EXPECT_EQ(alt, f.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=3,DQ_TURNS=0,DQ_STAGES=1"));
  EXPECT_EQ(f.check(alt, 128), nullptr);
  EXPECT_EQ(f.mods_check(alt, kModMask), nullptr);
  EXPECT_EQ(f.mods_fallback(pick, kModWindow), pick);
  const Config det = f.parse_config("BLOCK_M=64,CONSUMERS=2,DETERMINISTIC=1,DQ_STAGES=1");
  EXPECT_THAT(f.mods_check(det, kModMask), HasSubstr("DETERMINISTIC"));
  EXPECT_EQ(f.mods_check(f.mods_fallback(det, kModMask), kModMask), nullptr);
  // BLOCK_M 80 and 96 (dQ transposed) with any modification: not validated on a GPU in the modified forms; the
  // runtime runs BLOCK_M 64 with the rest of the pick (the plain call keeps 80).
  const Config t80 = f.parse_config("BLOCK_M=80,CONSUMERS=2,STAGES=2,SCHED=0,DQ_TURNS=1,DQ_STAGES=1");
  EXPECT_EQ(f.mods_check(t80, 0), nullptr);
  for (unsigned m : {kModWindow, kModSoftcap, kModAlibi, kModMask}) {
    if (m != kModMask) EXPECT_THAT(f.mods_check(t80, m), HasSubstr("BLOCK_M 80 or 96")) << m;
    else EXPECT_NE(f.mods_check(t80, m), nullptr);  // (DQ_TURNS 1's refusal is met first)
    EXPECT_EQ(f.mods_check(f.mods_fallback(t80, m), m), nullptr) << m;
  }
  EXPECT_THAT(f.mods_check(f.parse_config("BLOCK_M=80,CONSUMERS=2,DQ_STAGES=1"), kModMask), HasSubstr("BLOCK_M 80 or 96"));
  EXPECT_EQ(f.mods_fallback(t80, kModWindow), f.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_TURNS=1,DQ_STAGES=1"));
  EXPECT_EQ(f.mods_fallback(t80, kModMask), f.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_TURNS=0,DQ_STAGES=1"));
  EXPECT_EQ(f.mods_fallback(pick, kModSoftcap), pick);  // 64 and 128 are not refused
  // fa3_wgmma: MULTICAST off with a mask_mod.
  const Family& fw = find_family("fa3_wgmma");
  const Config mc = fw.parse_config("BLOCK_N=128,CONSUMERS=2,STAGES=2,MULTICAST=1");
  ASSERT_NE(fw.mods_check(mc, kModMask), nullptr);
  const Config mc0 = fw.mods_fallback(mc, kModMask);
  EXPECT_EQ(mc0, fw.parse_config("BLOCK_N=128,CONSUMERS=2,STAGES=2,MULTICAST=0"));
  EXPECT_EQ(fw.mods_check(mc0, kModMask), nullptr);
  EXPECT_EQ(fw.mods_fallback(mc, 0), mc);
}

// A window's blocks (issue 32): fa3_wgmma_bwd's key blocks walk the query blocks fa3_bwd_window_query_blocks gives,
// and its dQ turns count the key blocks fa3_bwd_window_key_blocks gives; both must be exactly the block pairs
// that share a visible (query, key) pair (Problem::visible_keys, the problem's own definition), for ragged shapes
// and windows of every kind, else a query block's turns would wait for a key block that never adds (a hang) or a
// key block would skip rows that see it. The band without a window is causal's: the same turns as bwd_dq_turn.
namespace {
// The window tests' cases: windows of every kind (a point, one side, both, past the sequence, none), causal and not,
// ragged shapes, every block size pair given; each with its problem, band, each row's visible keys, the block pairs
// that share a visible (query, key) pair (Problem::visible_keys, the problem's own definition) and a name.
struct WindowCase {
  Problem p;
  WindowBand band;
  int BM, BN, num_m, num_n;
  std::vector<std::pair<long long, long long>> visible;  // row i: keys [first, end)
  std::vector<std::vector<char>> meet;                     // [query block][key block]
  std::string at;                                          // for failure messages
  bool sees(int i, long long j) const { return visible[i].first <= j && j < visible[i].second; }
};
template <class F>
void for_each_window_case(std::initializer_list<int> bms, std::initializer_list<int> bns, F f) {
  for (const auto& [left, right] : {std::pair{0, 0}, std::pair{1, -1}, std::pair{64, -1}, std::pair{65, 65},
                                    std::pair{-1, 1}, std::pair{3, 17}, std::pair{100000, 100000}, std::pair{-1, -1},
                                    std::pair{0, -1}, std::pair{200, 0}, std::pair{128, 128}})
    for (bool causal : {false, true})
      for (const auto& [sq, sk] : {std::pair{1, 700}, std::pair{333, 517}, std::pair{517, 333}, std::pair{64, 64},
                                   std::pair{129, 1000}, std::pair{200, 65}})
        for (int BM : bms)
          for (int BN : bns) {
            WindowCase c{Problem{1, 1, sq, sk, 64, DType::bf16, causal}, window_band(left, right, causal, sq, sk), BM, BN,
                         (sq + BM - 1) / BM, (sk + BN - 1) / BN, {}, {}, {}};
            c.p.window_left = left, c.p.window_right = right;
            c.visible.resize(sq);
            c.meet.assign(c.num_m, std::vector<char>(c.num_n, 0));
            for (int i = 0; i < sq; ++i) {
              c.visible[i] = c.p.visible_keys(i, sq, sk);
              for (long long j = c.visible[i].first; j < c.visible[i].second; ++j) c.meet[i / BM][j / BN] = 1;
            }
            c.at = "window " + std::to_string(left) + "," + std::to_string(right) + (causal ? " causal " : " ") +
                   std::to_string(sq) + "x" + std::to_string(sk) + " BM " + std::to_string(BM) + " BN " + std::to_string(BN);
            f(c);
          }
}
}  // namespace

TEST(Family, Fa3BwdWindowBlocksArePairsThatMeet) {
  for_each_window_case({64, 128}, {64, 128, 192}, [](const WindowCase& c) {
    const int sq = c.p.seq_q, sk = c.p.seq_k, BM = c.BM, BN = c.BN, num_m = c.num_m, num_n = c.num_n;
    const int left = c.p.window_left, right = c.p.window_right;
    const bool causal = c.p.causal;
    const WindowBand& band = c.band;
    const auto& meet = c.meet;
    const std::string& at = c.at;
    for (int i = 0; i < sq; ++i) {  // the band is the problem's mask, row by row
      const auto [first, end] = c.visible[i];
      const IndexRange keys = band.keys_of_rows(i, i + 1, sk);
      if (first < end) ASSERT_EQ(std::make_pair((long long)keys.first, (long long)keys.end), std::make_pair(first, end)) << i;
      else ASSERT_TRUE(keys.empty()) << i;
    }
    for (int n = 0; n < num_n; ++n) {  // a key block's walk
      int first = 0, blocks = 0;
      fa3_bwd_window_query_blocks(band, n * BN, BM, BN, sq, sk, first, blocks);
      for (int m = 0; m < num_m; ++m)
        ASSERT_EQ(m >= first && m < first + blocks, (bool)meet[m][n]) << at << " key block " << n << " query block " << m;
    }
    for (int m = 0; m < num_m; ++m) {  // a query block's adders and their turns
      int first = 0, last = -1;
      fa3_bwd_window_key_blocks(band, m, BM, BN, sq, sk, first, last);
      std::set<int> up, down;
      for (int n = 0; n < num_n; ++n) {
        ASSERT_EQ(n >= first && n <= last, (bool)meet[m][n]) << at << " query block " << m << " key block " << n;
        if (!meet[m][n]) continue;
        up.insert(fa3_bwd_window_turn(1, band, n, m, BM, BN, sq, sk));
        down.insert(fa3_bwd_window_turn(2, band, n, m, BM, BN, sq, sk));
        if (left < 0 && right < 0) {  // no window: the plain kernels' turns (DETERMINISTIC 2 is causal only)
          if (causal)
            EXPECT_EQ(fa3_bwd_window_turn(2, band, n, m, BM, BN, sq, sk), bwd_dq_turn(2, n, m, BM, BN, sq, sk)) << at;
          EXPECT_EQ(fa3_bwd_window_turn(1, band, n, m, BM, BN, sq, sk), bwd_dq_turn(1, n, m, BM, BN, sq, sk)) << at;
        }
      }
      std::set<int> want;  // each turn 0 .. count - 1 taken once
      for (int t = 0; t <= last - first; ++t) want.insert(t);
      EXPECT_EQ(up, want) << at << " query block " << m;
      EXPECT_EQ(down, want) << at << " query block " << m;
    }
  });
}

// fa2_mma's window (issue 32): a query block's loop reads exactly the key blocks that hold a key some of its rows
// see (fa2_mma_window_blocks against Problem::visible_keys, the problem's own definition), for ragged shapes and
// windows of every kind, so that blocks wholly outside the band are skipped and none that holds a visible key is;
// and a block a warp's rows leave unmasked (fa2_mma_window_masks false) is wholly visible to every one of its rows
// inside the sequence (no key past seq_k, none outside the band), so that skipping the per-element mask there never
// lets a masked score through. The modified kernels' name expression wraps the traits (ALIBI written when true).
TEST(Family, Fa2MmaWindowReadsTheBlocksThatMeet) {
  for_each_window_case({64, 128}, {32, 64, 128}, [](const WindowCase& c) {
    const int sq = c.p.seq_q, sk = c.p.seq_k, BM = c.BM, BN = c.BN, num_m = c.num_m, num_n = c.num_n;
    const WindowBand& band = c.band;
    const auto& visible = c.visible;
    const auto& meet = c.meet;
    const std::string& at = c.at;
    for (int m = 0; m < num_m; ++m) {
      const BlockSpan span = fa2_mma_window_blocks(band, m * BM, BM, BN, sq, sk);
      for (int n = 0; n < num_n; ++n)
        ASSERT_EQ(n >= span.first && n < span.first + span.count, (bool)meet[m][n]) << at << " query block " << m << " key block " << n;
      for (int rows : {16, 32})  // a warp's rows: 16 or 32 per warp (fa2_mma_rows_per_warp)
        for (int row0 = m * BM; row0 < (m + 1) * BM; row0 += rows)
          for (int n = span.first; n < span.first + span.count; ++n) {
            if (fa2_mma_window_masks(band, row0, rows, n * BN, BN, sk)) continue;
            for (int i = row0; i < row0 + rows && i < sq; ++i)
              ASSERT_TRUE(visible[i].first <= n * BN && n * BN + BN <= visible[i].second)
                  << at << " rows from " << row0 << " key block " << n << " left unmasked, row " << i;
          }
    }
  });
  const Family& f = find_family("fa2_mma");
  EXPECT_EQ(f.name_expressions(f.default_config, 128, true, DType::bf16, true, false, kModWindow | kModSoftcap | kModAlibi).at(0),
            "&flashtune::fa2_mma_fwd<flashtune::AttnModTraits<flashtune::Fa2MmaTraits<128,64,64,4,2,1,true>, true, true, "
            "true>, true>");
  EXPECT_EQ(f.name_expressions(f.default_config, 64, false, DType::fp16, false, false, kModSoftcap).at(0),
            "&flashtune::fa2_mma_fwd<flashtune::AttnModTraits<flashtune::Fa2MmaTraits<64,64,64,4,2,0,false>, false, true>>");
  EXPECT_EQ(f.name_expressions(f.default_config, 64, false, DType::fp16).at(0),
            "&flashtune::fa2_mma_fwd<flashtune::Fa2MmaTraits<64,64,64,4,2,0,false>>");  // the plain kernel's, as it was
}

// fa2_mma_bwd's window (issue 32): a key block's CTA walks exactly the query blocks that hold a row seeing one of its
// keys, and the deterministic dQ pass's query block exactly the key steps holding a key one of its rows sees
// (fa2_mma_bwd_window_query_blocks / _key_blocks against Problem::visible_keys), for ragged shapes and windows of
// every kind: no block wholly outside the band is visited, none with a visible pair skipped (a key block none sees
// walks nothing: dK = dV = 0; a query block none meets reads nothing: dQ = 0); and a pair of tiles left unmasked
// (fa2_mma_bwd_window_masks false, either orientation) is wholly visible for every row inside the sequence.
TEST(Family, Fa2MmaBwdWindowWalksTheBlocksThatMeet) {
  for_each_window_case({32, 64}, {64, 128}, [](const WindowCase& c) {
    const int sq = c.p.seq_q, sk = c.p.seq_k, BM = c.BM, BN = c.BN, num_m = c.num_m, num_n = c.num_n;
    const WindowBand& band = c.band;
    const auto& visible = c.visible;
    const auto& meet = c.meet;
    const std::string& at = c.at;
    auto seen = [&](int i, int j) { return c.sees(i, j); };
    // The dK/dV walk: key block n visits query blocks [first, end).
    for (int n = 0; n < num_n; ++n) {
      const IndexRange mb = fa2_mma_bwd_window_query_blocks(band, n * BN, BM, BN, sq, sk);
      for (int m = 0; m < num_m; ++m)
        ASSERT_EQ(m >= mb.first && m < mb.end, (bool)meet[m][n]) << at << " key block " << n << " query block " << m;
      for (int keys : {16, 32, 64})  // a warp's key rows (16 MTN)
        for (int k0 = n * BN; k0 < (n + 1) * BN; k0 += keys)
          for (int m = mb.first; m < mb.end; ++m) {
            if (fa2_mma_bwd_window_masks(band, m * BM, BM, k0, keys, sk)) continue;
            for (int i = m * BM; i < (m + 1) * BM && i < sq; ++i)
              for (int j = k0; j < k0 + keys; ++j)
                ASSERT_TRUE(j < sk && seen(i, j)) << at << " keys from " << k0 << " query block " << m << " unmasked, " << i << "," << j;
          }
    }
    // The deterministic dQ pass: query block m reads key steps of KS keys [first, end).
    for (int KS : {32, 64}) {
      const int num_s = (sk + KS - 1) / KS;
      for (int m = 0; m < num_m; ++m) {
        const IndexRange kb = fa2_mma_bwd_window_key_blocks(band, m * BM, BM, KS, sq, sk);
        for (int n = 0; n < num_s; ++n) {
          bool any = false;
          for (int i = m * BM; i < (m + 1) * BM && i < sq && !any; ++i)
            any = visible[i].first < std::min<long long>((n + 1) * KS, sk) && visible[i].second > n * KS;
          ASSERT_EQ(n >= kb.first && n < kb.end, any) << at << " KS " << KS << " query block " << m << " step " << n;
        }
        for (int rows : {16, 32})  // a warp's rows (16 MT)
          for (int r0 = m * BM; r0 < (m + 1) * BM; r0 += rows)
            for (int n = kb.first; n < kb.end; ++n) {
              if (fa2_mma_bwd_window_masks(band, r0, rows, n * KS, KS, sk)) continue;
              for (int i = r0; i < r0 + rows && i < sq; ++i)
                ASSERT_TRUE(visible[i].first <= n * KS && n * KS + KS <= visible[i].second)
                    << at << " rows from " << r0 << " step " << n << " unmasked, row " << i;
            }
      }
    }
  });
  const Family& f = find_family("fa2_mma_bwd");
  EXPECT_EQ(f.mods, kModWindow | kModSoftcap | kModAlibi);
  const auto names = f.name_expressions(f.default_config, 128, true, DType::bf16, true, false, kModWindow | kModAlibi);
  ASSERT_EQ(names.size(), 3u);  // every kernel on the wrapped traits
  EXPECT_EQ(names.at(1), "&flashtune::fa2_mma_bwd_dkdv<flashtune::AttnModTraits<flashtune::Fa2MmaBwdTraits<128,32,64,8,2,2,1,1,true>, "
                         "true, false, true>, true>");
  EXPECT_EQ(f.name_expressions(f.default_config, 64, false, DType::fp16).at(2),
            "&flashtune::fa2_mma_bwd_dq<flashtune::Fa2MmaBwdTraits<64,32,64,8,2,2,1,0,false>>");  // the plain one, as it was
}

// ALiBi (issue 32): a boolean of the problem's identity (the slopes are data), its JSON field, str, the families
// that have it (fa3_wgmma, fa3_wgmma_bwd; the rest refuse it in one line), its variants and name expression (the
// fourth AttnModTraits argument, written only when true), and "mods" names joined by '+'.
TEST(Family, AlibiIsAFa3Variant) {
  auto one = [](const std::string& fields) {
    return problems_from_json(json::parse(R"({"problems":[{"batch":2,"heads":4,"seq_q":300,"seq_k":500,"head_dim":128,"dtype":"bf16")" +
                                          fields + "}]}"))
        .at(0);
  };
  const Problem plain = one(""), a = one(R"(,"alibi":true)"), off = one(R"(,"alibi":false)");
  EXPECT_TRUE(a.alibi);
  EXPECT_EQ(off, plain);
  EXPECT_NE(a, plain);
  EXPECT_FALSE(to_json(plain).contains("alibi"));  // plain problems keep their JSON
  EXPECT_EQ(a.str(), "B2 H4 Sq300 Sk500 d128 bf16 alibi");
  EXPECT_EQ(problem_from_json(to_json(a)), a);
  EXPECT_EQ(a.flops(), plain.flops());  // the bias adds no pairs
  EXPECT_THROW(one(R"(,"alibi":1)"), UsageError);
  const Problem all = one(R"(,"window":[64,-1],"softcap":30,"alibi":true)");
  EXPECT_EQ(problem_mods(all), kModWindow | kModSoftcap | kModAlibi);
  EXPECT_EQ(problem_mods(a), kModAlibi);
  for (const auto& f : families()) {
    if (f.name == "fa3_wgmma" || f.name == "fa3_wgmma_bwd" || f.name == "fa2_mma" || f.name == "fa2_mma_bwd") EXPECT_EQ(f.shape_reason(a), "") << f.name;
    else EXPECT_EQ(f.shape_reason(a), "does not support ALiBi (alibi)") << f.name;
  }
  const Family& f = find_family("fa3_wgmma");
  EXPECT_EQ(f.name_expressions(f.default_config, 64, false, DType::fp16, false, false, kModAlibi).at(0),
            "&flashtune::fa3_wgmma_fwd<flashtune::AttnModTraits<flashtune::Fa3WgmmaTraits<64,64,2,2,1,1,0,0,0,0,0,false>, "
            "false, false, true>>");
  const Space s = space_from_json(json::parse(R"({"family":"fa3_wgmma","params":{"BLOCK_N":[64]},"head_dims":[128],
      "causal":[false],"dtypes":["bf16"],"mods":["none","alibi","softcap+alibi","window+softcap+alibi"]})"));
  EXPECT_EQ(s.variants().size(), 4u);
  const auto vs = variants_for(space_from_json(json::parse(R"({"family":"fa3_wgmma","params":{"BLOCK_N":[64]},
      "head_dims":[128],"causal":[false],"dtypes":["bf16"]})")), {a});
  ASSERT_EQ(vs.size(), 1u);
  EXPECT_EQ(vs[0].mods, kModAlibi);
  EXPECT_EQ(mods_string(kModWindow | kModSoftcap | kModAlibi), "window+softcap+alibi");
  unsigned m = 0;
  EXPECT_TRUE(mods_from_string("alibi+window", m));
  EXPECT_EQ(m, kModWindow | kModAlibi);
  EXPECT_FALSE(mods_from_string("alibi+", m));
  EXPECT_FALSE(mods_from_string("", m));
  Variant v = vs[0];
  v.family = &find_family("fa2_simt");
  v.config = v.family->default_config;
  EXPECT_EQ(Compiler("sm_80").prune_before_compile(v), "has no alibi form");
}
