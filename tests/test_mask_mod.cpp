// mask_mod (issue 32, part 3): the predicate's checks and normalisation, its hash, the wrapper, NVRTC's error as one
// line, the problem field (tensors from files, lists, segments; identity), and the block summary's emulation.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/compile.hpp"
#include "core/family.hpp"
#include "core/mask_mod.hpp"
#include "core/mask_summary.hpp"
#include "core/nvrtc_api.hpp"
#include "core/problem.hpp"
#include "core/util.hpp"
#include "templates/mask_mod.h"
#include "tuner/space/sample.hpp"
#include "tuner/space/space.hpp"

using namespace flashtune;
using nlohmann::json;

namespace {

std::string refusal(const std::string& text, std::vector<std::string> names = {}) {
  try {
    make_mask_predicate(text, std::move(names));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool has_nvrtc() {
  try {
    nvrtc();
    return true;
  } catch (const NvrtcUnavailable&) {
    return false;
  }
}

}  // namespace

TEST(MaskMod, NormalisesCommentsAndWhiteSpace) {
  const MaskPredicate a = make_mask_predicate("  return doc[q_idx] ==   doc[kv_idx]; // same document\n", {"doc"});
  EXPECT_EQ(a.body, "return doc[q_idx] == doc[kv_idx];");
  const MaskPredicate b = make_mask_predicate("return /* why */ doc[q_idx]\n\t== doc[kv_idx];", {"doc"});
  EXPECT_EQ(b.body, a.body);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.hash().size(), 16u);
  EXPECT_EQ(a.type_name(), "flashtune::MaskMod_" + a.hash());
  EXPECT_FALSE(a.expression);
  // One expression: its value, a trailing ';' dropped.
  const MaskPredicate e = make_mask_predicate("kv_idx <= q_idx;", {});
  EXPECT_EQ(e.body, "return (kv_idx <= q_idx);");
  EXPECT_TRUE(e.expression);
  EXPECT_EQ(make_mask_predicate("kv_idx <= q_idx", {}), e);
  // The names are sorted and part of the identity.
  const MaskPredicate two = make_mask_predicate("return doc[q_idx] == pos[kv_idx];", {"pos", "doc"});
  EXPECT_EQ(two.names, (std::vector<std::string>{"doc", "pos"}));
  EXPECT_NE(two.hash(), make_mask_predicate("return doc[q_idx] == pos[kv_idx];", {"doc"}).hash() + "x");
  EXPECT_NE(make_mask_predicate("return q_idx >= kv_idx;", {}).hash(), make_mask_predicate("return q_idx > kv_idx;", {}).hash());
}

TEST(MaskMod, ReadsBatchAndHeadLexically) {
  const MaskPredicate none = make_mask_predicate("kv_idx <= q_idx", {});
  EXPECT_FALSE(none.reads_batch);
  EXPECT_FALSE(none.reads_head);
  const MaskPredicate both = make_mask_predicate("return prefix[b] + kv_idx <= q_idx + h;", {"prefix"});
  EXPECT_TRUE(both.reads_batch);
  EXPECT_TRUE(both.reads_head);
  // Letters inside numbers and longer names are not b or h.
  const MaskPredicate hex = make_mask_predicate("return (q_idx & 0xbb) != 0x1h0 + hb;", {});
  EXPECT_FALSE(hex.reads_batch);
  EXPECT_FALSE(hex.reads_head);
}

TEST(MaskMod, RefusesWhatWouldBeMoreThanABody) {
  EXPECT_NE(refusal("#include <cstdio>\nreturn true;").find("may not hold '#'"), std::string::npos);
  EXPECT_NE(refusal("return q_idx \\\n > 0;").find("may not hold '\\'"), std::string::npos);
  EXPECT_NE(refusal("asm(\"trap;\"); return true;").find("may not hold '\"'"), std::string::npos);
  EXPECT_NE(refusal("return 'a' > 0;").find("may not hold '''"), std::string::npos);
  EXPECT_NE(refusal("return 1'000 > q_idx;").find("may not hold '''"), std::string::npos);
  EXPECT_NE(refusal("return q_idx <% 3;").find("'<%'"), std::string::npos);
  EXPECT_NE(refusal("%:define X\nreturn 1;").find("'%:'"), std::string::npos);
  EXPECT_NE(refusal("return q_idx ??= 1;").find("'??'"), std::string::npos);
  EXPECT_NE(refusal("k<<<1, 1>>>(); return 1;").find("'<<<'"), std::string::npos);
  EXPECT_NE(refusal("return 1; } __global__ void evil() {").find("unbalanced '}' at column 11"), std::string::npos);
  EXPECT_NE(refusal("return (q_idx > 1;").find("unclosed '('"), std::string::npos);
  EXPECT_NE(refusal("return doc[q_idx) > 1];", {"doc"}).find("unbalanced ')'"), std::string::npos);
  EXPECT_NE(refusal("return true; /* { */ }").find("unbalanced '}'"), std::string::npos);  // comments stripped first
  EXPECT_NE(refusal("return true; /* never closed").find("not closed"), std::string::npos);
  EXPECT_NE(refusal("asm volatile(); return 1;").find("identifier 'asm'"), std::string::npos);
  EXPECT_NE(refusal("__asm__ (); return 1;").find("identifier '__asm__'"), std::string::npos);
  EXPECT_NE(refusal("_Pragma(x) return 1;").find("identifier '_Pragma'"), std::string::npos);
  EXPECT_NE(refusal("return ft_args.tensor[0].length > 0;").find("identifier 'ft_args'"), std::string::npos);
  EXPECT_NE(refusal("").find("is empty"), std::string::npos);
  EXPECT_NE(refusal(" // nothing\n").find("is empty"), std::string::npos);
  EXPECT_NE(refusal(std::string("return q_idx\x01 > 0;")).find("not printable ASCII"), std::string::npos);
  EXPECT_NE(refusal("return q_idx > 0; " + std::string(kMaxMaskModBytes, ' ')).find("bytes, more than"), std::string::npos);
  std::string long_expr = "q_idx";
  while (long_expr.size() <= kMaxMaskModNormalised) long_expr += " + q_idx";
  EXPECT_NE(refusal(long_expr).find("once normalised, more than 2000"), std::string::npos);
  EXPECT_NE(refusal("q_idx; kv_idx").find("neither one expression"), std::string::npos);
}

TEST(MaskMod, ChecksTensorNames) {
  EXPECT_NE(refusal("return true;", {"doc"}).find("tensor 'doc' is not read"), std::string::npos);
  EXPECT_NE(refusal("return int_[0] > 0;", {"int"}).find("tensor name 'int' is a keyword"), std::string::npos);
  EXPECT_NE(refusal("return q_idx > 0;", {"q_idx"}).find("a parameter of the predicate"), std::string::npos);
  EXPECT_NE(refusal("return x[0] > 0;", {"1x"}).find("is not a C identifier"), std::string::npos);
  EXPECT_NE(refusal("return x[0] > 0;", {"x y"}).find("is not a C identifier"), std::string::npos);
  EXPECT_NE(refusal("return ft_x[0] > 0;", {"ft_x"}).find("identifier 'ft_x'"), std::string::npos);
  EXPECT_NE(refusal("return a[0] + b_[0] + c[0] + d[0] + e[0] > 0;", {"a", "b_", "c", "d", "e"}).find("at most 4"),
            std::string::npos);
  EXPECT_NE(refusal("return a[0] > 0;", {"a", "a"}).find("named twice"), std::string::npos);
  EXPECT_NE(refusal("return x[0] > 0;", {std::string(33, 'x')}).find("at most 32"), std::string::npos);
  EXPECT_TRUE(is_cxx_keyword("return"));
  EXPECT_FALSE(is_cxx_keyword("doc"));
}

TEST(MaskMod, WrapperPutsTheBodyOnItsLine) {
  const MaskPredicate m = make_mask_predicate("return doc[q_idx] == doc[kv_idx];", {"doc"});
  const std::vector<std::string> lines = split(m.wrapper_source(), '\n');
  ASSERT_GE(lines.size(), (size_t)kMaskBodyLine);
  EXPECT_EQ(lines[kMaskBodyLine - 1], std::string(kMaskBodyIndent, ' ') + m.body);
  EXPECT_NE(m.wrapper_source().find("struct MaskMod_" + m.hash()), std::string::npos);
  EXPECT_NE(m.wrapper_source().find("const MaskTensor doc = ft_args.tensor[0];"), std::string::npos);
  EXPECT_NE(m.wrapper_source().find("kReadsBatch = false, kReadsHead = false"), std::string::npos);
  EXPECT_EQ(mask_program_source(m, "fa3_wgmma.cuh"), m.wrapper_source() + "#include \"fa3_wgmma.cuh\"\n");
}

TEST(MaskMod, CompileErrorIsOneLineWithItsColumn) {
  // NVRTC 13's form: "<file>(<line>): error: <message>", the source line (two spaces of margin), a caret.
  const MaskPredicate m = make_mask_predicate("doc[q_idx] == dox[kv_idx]", {"doc"});
  const std::string log = "mask_mod.cu(11): error: identifier \"dox\" is undefined\n      " + m.body + "\n" +
                          std::string(6 + m.body.find("dox"), ' ') + "^\n\n1 error detected in the compilation of "
                          "\"mask_mod.cu\".\n";
  EXPECT_EQ(mask_compile_error(log, m), "identifier \"dox\" is undefined (at column 15: \"dox[kv_idx]\")");
  EXPECT_EQ(mask_compile_error("x.cu(13): error: expected a \";\"\n", m),
            "expected a \";\" (in the wrapper after the predicate: is a return missing, or a brace?)");
  EXPECT_EQ(mask_compile_error("something odd\n", m), "something odd");
}

TEST(MaskMod, NvrtcChecksThePredicate) {
  if (!has_nvrtc()) GTEST_SKIP() << "no NVRTC on this machine";
  check_mask_compiles(make_mask_predicate("return doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx;", {"doc"}));
  check_mask_compiles(make_mask_predicate("int d = q_idx - kv_idx; if (d < 0) return false; return d < 128;", {}));
  check_mask_compiles(sample_mask_predicate());
  auto error = [](const MaskPredicate& m) {
    try {
      check_mask_compiles(m);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string undefined = error(make_mask_predicate("return dox[q_idx] == doc[kv_idx];", {"doc"}));
  EXPECT_EQ(undefined, "mask_mod does not compile: identifier \"dox\" is undefined (at column 8: \"dox[q_idx] == "
                       "doc[kv_idx];\")");
  EXPECT_EQ(undefined.find('\n'), std::string::npos);
  EXPECT_NE(error(make_mask_predicate("return doc;", {"doc"})).find("no suitable conversion"), std::string::npos);
  EXPECT_NE(error(make_mask_predicate("if (q_idx > 0) return true;", {})).find("without a return"), std::string::npos);
}

TEST(MaskMod, ProblemFieldLoadsTensorsAndKeepsIdentity) {
  const std::string dir = make_private_tmpdir("ft-mask");
  const std::string file = dir + "/doc.bin";
  {
    std::ofstream f(file, std::ios::binary);
    const int32_t v[] = {0, 0, 0, 1, 1, 2, 2, 2};
    f.write(reinterpret_cast<const char*>(v), sizeof v);
  }
  const json base = {{"batch", 1}, {"heads", 2}, {"seq", 8}, {"head_dim", 64}, {"dtype", "bf16"}, {"causal", true}};
  json from_file = base, from_list = base, from_segments = base;
  from_file["mask_mod"] = {{"predicate", "doc[q_idx] == doc[kv_idx]"}, {"tensors", {{"doc", file}}}};
  from_list["mask_mod"] = {{"predicate", "doc[q_idx] ==  doc[kv_idx];"}, {"tensors", {{"doc", {0, 0, 0, 1, 1, 2, 2, 2}}}}};
  from_segments["mask_mod"] = {{"predicate", "doc[q_idx] == doc[kv_idx]"}, {"tensors", {{"doc", {{"segments", {3, 2, 3}}}}}}};
  const Problem a = problem_from_json(from_file), b = problem_from_json(from_list), c = problem_from_json(from_segments);
  ASSERT_TRUE(a.mask_mod.enabled());
  EXPECT_EQ(*a.mask_mod.values[0], (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(a, b);  // the same predicate and the same values: one problem, however given
  EXPECT_EQ(a, c);
  EXPECT_EQ(a.mask_mod.key(), c.mask_mod.key());
  EXPECT_NE(a.str().find("mask_mod " + a.mask_mod.predicate.hash() + "(doc)"), std::string::npos);
  EXPECT_EQ(problem_mods(a), (unsigned)kModMask);
  json other = from_segments;
  other["mask_mod"]["tensors"]["doc"]["segments"] = {4, 4};
  EXPECT_FALSE(problem_from_json(other) == a);  // another layout: another problem
  // to_json and back; the key's digests back to the identity (without values).
  EXPECT_EQ(problem_from_json(to_json(c)), c);
  json keyed = base;
  keyed["mask_mod"] = json::parse(a.mask_mod.key());
  const Problem k = problem_from_json(keyed);
  EXPECT_EQ(k, a);
  EXPECT_FALSE(k.mask_mod.has_values());
  EXPECT_TRUE(a.mask_mod.has_values());
  // Refusals, one line each.
  auto refused = [&](json j) {
    try {
      problem_from_json(j);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json w = from_list;
  w["window"] = {16, -1};
  EXPECT_NE(refused(w).find("do not combine"), std::string::npos);
  json v = from_list;
  v.erase("seq");
  v.erase("batch");
  v["varlen"] = {{"seq_lens", {4, 4}}};
  EXPECT_NE(refused(v).find("dense problems"), std::string::npos);
  json missing = base;
  missing["mask_mod"] = {{"predicate", "doc[q_idx] > 0"}, {"tensors", {{"doc", dir + "/none.bin"}}}};
  EXPECT_NE(refused(missing).find("does not exist"), std::string::npos);
  json ragged = base;
  {
    std::ofstream f(dir + "/odd.bin", std::ios::binary);
    f << "abc";
  }
  ragged["mask_mod"] = {{"predicate", "doc[q_idx] > 0"}, {"tensors", {{"doc", dir + "/odd.bin"}}}};
  EXPECT_NE(refused(ragged).find("int32 values"), std::string::npos);
  json big = base;
  big["mask_mod"] = {{"predicate", "doc[q_idx] > 0"}, {"tensors", {{"doc", {1, 5000000000ll}}}}};
  EXPECT_NE(refused(big).find("int32 values"), std::string::npos);
  json unknown = base;
  unknown["mask_mod"] = {{"predicate", "q_idx > 0"}, {"extra", 1}};
  EXPECT_NE(refused(unknown).find("unknown mask_mod field"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// The variant of a mask problem: kModMask and its predicate, the type in the name expression (so the hash), the
// wrapper before the template; refused combinations pruned with their reasons.
TEST(MaskMod, VariantsCarryThePredicate) {
  const Family& f = find_family("fa3_wgmma");
  const Family& b = find_family("fa3_wgmma_bwd");
  ASSERT_TRUE(f.mods & kModMask);
  ASSERT_TRUE(b.mods & kModMask);
  json j = {{"batch", 1}, {"heads", 2}, {"seq", 256}, {"head_dim", 128}, {"dtype", "bf16"}, {"causal", true},
            {"mask_mod", {{"predicate", "doc[q_idx] == doc[kv_idx]"}, {"tensors", {{"doc", {{"segments", {100, 156}}}}}}}}};
  const Problem p = problem_from_json(j);
  EXPECT_EQ(f.shape_reason(p), "");
  EXPECT_EQ(find_family("fa2_mma").shape_reason(p), "does not support a mask predicate (mask_mod)");
  const Variant v = variant_for(f, f.default_config, p);
  ASSERT_TRUE(v.mask);
  EXPECT_EQ(v.mods, (unsigned)kModMask);
  const std::string expr = v.name_expressions().at(0);
  EXPECT_NE(expr.find(", false, false, false, " + p.mask_mod.predicate.type_name() + ">"), std::string::npos) << expr;
  Compiler c("sm_90");
  EXPECT_EQ(c.prune_before_compile(v), "");
  Variant other = v;
  other.mask = std::make_shared<const MaskPredicate>(make_mask_predicate("kv_idx <= q_idx", {}));
  EXPECT_NE(c.variant_hash(v), c.variant_hash(other));
  Variant multicast = v;
  multicast.config = f.parse_config("MULTICAST=1");
  EXPECT_NE(c.prune_before_compile(multicast).find("MULTICAST with a mask_mod"), std::string::npos);
  Variant packed = v;
  packed.varlen = true;
  EXPECT_EQ(c.prune_before_compile(packed), "a mask_mod is dense only");
  Variant lost = v;
  lost.mask = nullptr;
  EXPECT_NE(c.prune_before_compile(lost).find("needs its predicate"), std::string::npos);
  Variant det = variant_for(b, b.parse_config("DETERMINISTIC=1"), p);
  EXPECT_NE(c.prune_before_compile(det).find("DETERMINISTIC with a mask_mod"), std::string::npos);
  EXPECT_EQ(f.mask_blocks(f.parse_config("CONSUMERS=3,BLOCK_N=112")), (std::pair{192, 112}));
  EXPECT_EQ(b.mask_blocks(b.parse_config("BLOCK_M=128,CONSUMERS=2")), (std::pair{128, 128}));
  EXPECT_EQ(mods_string(kModSoftcap | kModMask), "softcap+mask");
  unsigned m = 0;
  EXPECT_TRUE(mods_from_string("alibi+mask", m));
  EXPECT_EQ(m, kModAlibi | kModMask);
}

TEST(MaskMod, SpaceTakesAPredicateForItsMaskForm) {
  json s = {{"family", "fa3_wgmma"}, {"params", {{"BLOCK_N", {64, 128}}}}, {"head_dims", {128}}, {"dtypes", {"bf16"}},
            {"mods", {"mask", "softcap+mask"}},
            {"mask_mod", {{"predicate", "doc[q_idx] == doc[kv_idx]"}, {"tensors", {"doc"}}}}};
  const Space space = space_from_json(s);
  ASSERT_TRUE(space.mask);
  const auto vs = space.variants();
  EXPECT_EQ(vs.size(), 8u);
  for (const auto& v : vs) {
    EXPECT_TRUE(v.mods & kModMask);
    EXPECT_EQ(v.mask, space.mask);
  }
  json without = s;
  without.erase("mask_mod");
  EXPECT_THROW(space_from_json(without), UsageError);
  json windowed = s;
  windowed["mods"] = {"window+mask"};
  EXPECT_THROW(space_from_json(windowed), UsageError);
  // The families' defaults hold mask variants (with the sample predicate), for the CI's compile coverage.
  int masked = 0;
  for (const auto& v : default_variants(find_family("fa3_wgmma_bwd"))) masked += v.mask != nullptr;
  EXPECT_GT(masked, 0);
}

// The block summary, emulated on the host: every list holds exactly the blocks with a visible pair, in order, its
// partial bit set iff some pair of the block is masked; the backward's union over a group likewise.
TEST(MaskMod, BlockListsHoldTheBlocksThatMeet) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int seq_q = 1 + (int)(rng() % 300), seq_k = 1 + (int)(rng() % 300);
    const int bq = trial % 2 ? 64 : 128, bk = trial % 3 ? 64 : 112;
    const bool causal = trial % 4 == 1;
    const int docs = 1 + (int)(rng() % 5);
    std::vector<int> doc_q(seq_q), doc_k(seq_k);
    for (auto& d : doc_q) d = (int)(rng() % docs);
    for (auto& d : doc_k) d = (int)(rng() % docs);
    std::sort(doc_q.begin(), doc_q.end());
    std::sort(doc_k.begin(), doc_k.end());
    const int window = 1 + (int)(rng() % 200);
    auto visible = [&](int head) {
      return [&, head](int q, int k) { return doc_q[q] == doc_k[k] && (head == 0 || k >= q - window); };
    };
    const int qb = ceil_div(seq_q, bq), kb = ceil_div(seq_k, bk);
    // Two heads' states, [h][qb][kb].
    std::vector<unsigned char> states(2 * qb * kb);
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < qb; ++r)
        for (int c = 0; c < kb; ++c)
          states[(h * qb + r) * kb + c] = mask_block_state(r * bq, std::min(seq_q, (r + 1) * bq), c * bk, (c + 1) * bk,
                                                           seq_q, seq_k, causal, visible(h));
    auto pair_state = [&](int h, int r, int c) {
      bool any = false, all = true;
      for (int q = r * bq; q < std::min(seq_q, (r + 1) * bq); ++q)
        for (int k = c * bk; k < (c + 1) * bk; ++k) {
          const bool v = k < seq_k && (!causal || k <= q + seq_k - seq_q) && visible(h)(q, k);
          any |= v;
          all &= v;
        }
      return std::pair{any, all};
    };
    // Forward: head 1's rows of query blocks.
    for (int r = 0; r < qb; ++r) {
      std::vector<int> index(kb);
      const int n = mask_list_row(&states[(1 * qb + r) * kb], kb, 1, 1, 0, index.data());
      int at = 0;
      for (int c = 0; c < kb; ++c) {
        const auto [any, all] = pair_state(1, r, c);
        if (!any) continue;
        ASSERT_LT(at, n);
        EXPECT_EQ(MaskBlockList::block(index[at]), c);
        EXPECT_EQ(MaskBlockList::partial(index[at]), !all);
        ++at;
      }
      EXPECT_EQ(at, n);
    }
    // Backward: rows of key blocks, columns query blocks, the union over both heads.
    for (int c = 0; c < kb; ++c) {
      std::vector<int> index(qb);
      const int n = mask_list_row(&states[c], qb, kb, 2, (long long)qb * kb, index.data());
      int at = 0;
      for (int r = 0; r < qb; ++r) {
        const auto [any0, all0] = pair_state(0, r, c);
        const auto [any1, all1] = pair_state(1, r, c);
        if (!any0 && !any1) continue;
        ASSERT_LT(at, n);
        EXPECT_EQ(MaskBlockList::block(index[at]), r);
        EXPECT_EQ(MaskBlockList::partial(index[at]), !(all0 && all1));
        ++at;
      }
      EXPECT_EQ(at, n);
    }
  }
  const MaskTensor t{nullptr, 0};
  EXPECT_EQ(t[-1], 0);  // out of range reads 0, never the pointer
  const int data[] = {5, 6};
  const MaskTensor u{data, 2};
  EXPECT_EQ(u[1], 6);
  EXPECT_EQ(u[2], 0);
  EXPECT_EQ(u[-1], 0);
  const MaskBlockList list{nullptr, nullptr, 10, 30, 10};
  EXPECT_EQ(list.row(2, 1, 3), 2 * 30 + 10 + 3);
}

// The summary's plan, emulated on the host: the states kernel's grid and layout, the lists kernel's rows over them,
// and the attention kernel's MaskBlockList::row(b, h, block) finding the list of its (batch, head, block), forward
// (query heads) and backward (kv heads, the union of their groups), with and without b and h read.
TEST(MaskMod, SummaryPlanAddressesEachKernelsList) {
  const int B = 2, H = 4, Hk = 2, Sq = 150, Sk = 190;
  for (const char* text : {"return (q_idx / 40) == (kv_idx / 50);", "return (q_idx + 7 * h + 3 * b) % 5 != 0 && kv_idx >= h;"})
    for (bool backward : {false, true})
      for (bool causal : {false, true}) {
        const MaskPredicate m = make_mask_predicate(text, {});
        auto visible = [&](int b, int h, int q, int k) {
          return m.reads_head ? (q + 7 * h + 3 * b) % 5 != 0 && k >= h : (q / 40) == (k / 50);
        };
        const int bq = 64, bk = backward ? 128 : 112;
        const MaskSummaryPlan plan = mask_summary_plan(m, backward, B, H, Hk, Sq, Sk, causal, bq, bk);
        const MaskStatesArgs& s = plan.states;
        ASSERT_EQ(plan.states_grid[2], (unsigned)(s.batches * s.heads));
        std::vector<unsigned char> states(plan.states_bytes);
        for (int bh = 0; bh < s.batches * s.heads; ++bh)
          for (int r = 0; r < s.q_blocks; ++r)
            for (int c = 0; c < s.k_blocks; ++c)
              states[((size_t)bh * s.q_blocks + r) * s.k_blocks + c] = mask_block_state(
                  r * bq, std::min(Sq, (r + 1) * bq), c * bk, (c + 1) * bk, Sq, Sk, causal,
                  [&](int q, int k) { return visible(bh / s.heads, bh % s.heads, q, k); });
        const MaskListsArgs& l = plan.lists;
        std::vector<int> count(plan.count_bytes / 4), index(plan.index_bytes / 4);
        for (long long x = 0; x < (long long)l.outers * l.rows; ++x) {
          const long long o = x / l.rows, r = x % l.rows;
          count[x] = mask_list_row(states.data() + o * l.outer_stride + r * l.row_stride, l.cols, l.col_stride, l.group,
                                   l.group_stride, index.data() + x * l.cols);
        }
        // Each kernel's (batch, head, block): the blocks that hold a visible pair for it (a kv head: for any of its
        // query heads), in order, partial unless every pair is visible (for every query head).
        const int heads_seen = backward ? Hk : H, rows = backward ? s.k_blocks : s.q_blocks;
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < heads_seen; ++h)
            for (int r = 0; r < rows; ++r) {
              const long long row = plan.blocks.row(b, h, r);
              std::vector<int> want;
              for (int c = 0; c < (backward ? s.q_blocks : s.k_blocks); ++c) {
                bool any = false, all = true;
                for (int hq = backward ? h * (H / Hk) : h; hq < (backward ? (h + 1) * (H / Hk) : h + 1); ++hq) {
                  const int qb = backward ? c : r, kb = backward ? r : c;
                  for (int q = qb * bq; q < std::min(Sq, (qb + 1) * bq); ++q)
                    for (int k = kb * bk; k < (kb + 1) * bk; ++k) {
                      const bool v = k < Sk && (!causal || k <= q + Sk - Sq) && visible(b, hq, q, k);
                      any |= v;
                      all &= v;
                    }
                }
                if (any) want.push_back(mask_list_entry(c, !all));
              }
              ASSERT_LT(row, (long long)count.size());
              EXPECT_EQ(std::vector<int>(index.begin() + row * plan.blocks.cols,
                                         index.begin() + row * plan.blocks.cols + count[row]),
                        want)
                  << text << (backward ? " bwd" : " fwd") << (causal ? " causal" : "") << " b" << b << " h" << h
                  << " block " << r;
            }
      }
  EXPECT_EQ(mask_dense_elements(make_mask_predicate("kv_idx <= q_idx + b", {}), 3, 4, 10, 20), 3 * 10 * 20);
}

// The summary's program compiles (NVRTC, no GPU): its three kernels, lowered.
TEST(MaskMod, SummaryProgramCompiles) {
  if (!has_nvrtc()) GTEST_SKIP() << "no NVRTC on this machine";
  const MaskSummaryProgram prog = compile_mask_summary(sample_mask_predicate(), "sm_90");
  EXPECT_FALSE(prog.cubin.empty());
  ASSERT_EQ(prog.lowered.size(), 3u);
  for (const auto& n : prog.lowered) EXPECT_FALSE(n.empty());
  EXPECT_NE(prog.lowered[0].find("mask_mod_block_states"), std::string::npos);
}
