// flashtune run: one config on one problem, validated, timed.
#include "tuner/cli/verbs.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/compile.hpp"
#include "core/input_files.hpp"
#include "core/util.hpp"
#include "results/select.hpp"
#include "results/store.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/space/space.hpp"
#include "tuner/sweep/sweep.hpp"

using nlohmann::json;

namespace flashtune::cli {

namespace {

// A comma-separated list of integers as JSON numbers (ranges are the problem parser's to check).
json int_list_option(const std::string& flag, const std::string& text) {
  json out = json::array();
  for (const std::string& part : split(text, ',')) {
    long long v = 0;
    if (!plain_integer(part, v)) throw UsageError(flag + " must be comma-separated integers, got '" + brief(part) + "'");
    if (out.size() >= (size_t)kMaxVarlenSeqs) throw UsageError(flag + " has more than " + std::to_string(kMaxVarlenSeqs) + " lengths");
    out.push_back(v);
  }
  return out;
}

// --shape B,H,Sq,Sk,d; with --varlen FILE|JSON or --seq-lens L,.. [--seq-lens-k L,..] (a packed
// variable-length batch: the lengths give B, Sq and Sk) --shape H,d.
Problem parse_shape(const std::string& shape, const Args& a) {
  const bool packed = a.has("varlen") || a.has("seq-lens");
  if (a.has("varlen") && a.has("seq-lens")) throw UsageError("give --varlen or --seq-lens, not both");
  if (a.has("seq-lens-k") && !a.has("seq-lens")) throw UsageError("--seq-lens-k goes with --seq-lens");
  auto parts = split(shape, ',');
  if (!packed && parts.size() != 5) throw UsageError("--shape must be B,H,Sq,Sk,d, got '" + brief(shape) + "'");
  if (packed && parts.size() != 2)
    throw UsageError("--shape must be H,d with --varlen or --seq-lens (the lengths give B, Sq, Sk), got '" + brief(shape) + "'");
  json j;
  const std::vector<const char*> keys = packed ? std::vector<const char*>{"heads", "head_dim"}
                                               : std::vector<const char*>{"batch", "heads", "seq_q", "seq_k", "head_dim"};
  for (size_t i = 0; i < keys.size(); ++i) {
    long long v = 0;
    if (!plain_integer(parts[i], v))
      throw UsageError("--shape field " + std::string(keys[i]) + " is not an integer: '" + brief(parts[i]) + "'");
    j[keys[i]] = v;
  }
  if (a.has("paged")) {  // a paged K/V cache: the problem file's "paged" object, the shape as for a dense one
    const std::string v = a.get("paged");
    j["paged"] = !v.empty() && v[0] == '{' ? parse_json_bounded(v, "--paged") : read_json_file(v);
  }
  if (a.has("varlen")) {
    const std::string v = a.get("varlen");
    j["varlen"] = !v.empty() && v[0] == '{' ? parse_json_bounded(v, "--varlen") : read_json_file(v);
  } else if (a.has("seq-lens")) {
    j["varlen"] = {{"seq_lens", int_list_option("--seq-lens", a.get("seq-lens"))}};
    if (a.has("seq-lens-k")) j["varlen"]["seq_lens_k"] = int_list_option("--seq-lens-k", a.get("seq-lens-k"));
  }
  j["dtype"] = a.get("dtype", "fp32");
  j["causal"] = a.has("causal");
  if (a.has("heads-k")) j["heads_k"] = a.get_int("heads-k", 1, 1, 1 << 16);
  mask_options(a, j);
  try {
    return problem_from_json(j);
  } catch (const UsageError& e) {
    throw UsageError(std::string(a.has("varlen") ? "--varlen: " : a.has("paged") ? "--paged: " : "") + e.what());
  }
}

}  // namespace

int cmd_run(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune run --family F (--params K=V,... | --best) --shape B,H,Sq,Sk,d [--dtype fp32]\n"
              "                     [--causal] [--direction fwd|bwd] [--seed N] [--check] [--check-determinism]\n"
              "                     [--json] [--db PATH] [--device N] [--timeout S] [--inputs DIR] [--save-outputs DIR]\n"
              "                     [--input-dist normal|heavy] [--input-scale X] [--heads-k N] [--pause-us N]\n"
              "                     [--window L,R] [--softcap C] [--alibi] [--mask-mod TEXT [--mask-tensor N=FILE,..]]\n"
              "       flashtune run ... --shape H,d (--varlen FILE|JSON | --seq-lens L,L,.. [--seq-lens-k L,L,..])\n"
              "       flashtune run ... --shape B,H,Sq,Sk,d --paged FILE|JSON\n"
              "Runs one config of a family on one problem in the worker: validated against the float64\n"
              "reference (forward: sampled rows, every row with --check; backward: every element of dQ, dK,\n"
              "dV), then timed. --check-determinism runs it twice and reports whether the outputs' bits\n"
              "agree. --best takes the stored best config for this device and problem from --db (the\n"
              "problem's own, else its sequence bucket's: grouped-query problems need their own).\n"
              "--inputs DIR reads the inputs instead of generating seeded ones: DIR/q.bin, k.bin, v.bin (and\n"
              "do.bin for a backward), raw little-endian values in the --dtype (fp32, or fp16/bf16 bits), layout\n"
              "[B,H,S,d] contiguous, sizes exactly as --shape says; the float64 reference is computed from them\n"
              "(a backward's over every head: B*H*Sq*Sk*d at most 2^34). Such a run is not stored in --db.\n"
              "Files holding NaN or Inf are refused (exit 2).\n"
              "--input-dist normal|heavy and --input-scale X (0.001 to 1000) choose the generated inputs: seeded\n"
              "normal numbers, or Student-t with 3 degrees of freedom (heavy), times X for q, k, v (a backward's\n"
              "dO is of the same kind, unscaled). Default normal, 1. Tolerances scale with the inputs.\n"
              "--save-outputs DIR writes the validated run's outputs there as raw files: forward o.bin (dtype)\n"
              "and lse.bin (fp32, [B,H,Sq]); backward dq.bin, dk.bin, dv.bin (dtype).\n"
              "--heads-k N: grouped-query attention (N divides H): K, V, dK, dV have N heads, query head h\n"
              "reads kv head h / (H / N) (families fa2_mma, fa2_mma_bwd).\n"
              "--varlen FILE|JSON (a problem file's \"varlen\" object, from a file or inline when it starts with\n"
              "'{') or --seq-lens L,L,.. (query lengths; keys the same unless --seq-lens-k): a packed\n"
              "variable-length batch, Q and O (total_q, H, d), K and V (total_k, Hk, d), LSE (H, total_q),\n"
              "causal per sequence; --shape is then H,d (families fa2_mma, fa2_mma_bwd; --best needs the\n"
              "problem's own stored row). --save-outputs writes the packed tensors.\n"
              "--paged FILE|JSON (a problem file's \"paged\" object: {\"page_size\": P, \"seed\": S, \"seq_lens_k\": [..],\n"
              "\"layout\": \"hnd\"|\"nhd\"}): K and V in a paged cache, pools of (num_pages, Hk, P, d) pages (nhd:\n"
              "(num_pages, P, Hk, d), FlashAttention's and vLLM's) in a seeded order through a block\n"
              "table, each sequence its own cache length (B and Sk of --shape: the lengths' count and longest);\n"
              "family decode_splitkv, whose BLOCK_N must divide P; --best needs the problem's own stored row.\n"
              "--window L,R: sliding-window attention (FlashAttention's window_size; -1 unbounded): query i sees\n"
              "key j iff i + Sk - Sq - L <= j <= i + Sk - Sq + R (bottom-right aligned like --causal, which is\n"
              "-1,0 and overrides R). --softcap C: scores s become C tanh(s / C) before the softmax (0: off).\n"
              "--alibi: ALiBi (FlashAttention's alibi_slopes): scores get -slope_h |i + Sk - Sq - j| after any softcap,\n"
              "with seeded slopes (FlashAttention's geometric 2^(-8 (h+1) / H), doubled on odd batches: [B, H]).\n"
              "Families without them (all but fa3_wgmma and fa3_wgmma_bwd) refuse such a problem (exit 2).\n"
              "--mask-mod TEXT: a mask predicate, the body of bool mask(int b, int h, int q_idx, int kv_idx) (statements\n"
              "with a return, or one expression), true where query q_idx of head h in batch entry b sees key kv_idx\n"
              "(positions in the sequence), ANDed with --causal; --mask-tensor NAME=FILE,.. names raw int32 files it\n"
              "reads as NAME[i] (0 outside the file; at most 4). Dense problems, fa3_wgmma and fa3_wgmma_bwd; not with\n"
              "--window. A predicate NVRTC rejects is one line naming the error (exit 2). docs/kernels.md, \"mask_mod\".\n"
              "--pause-us N: the GPU left idle N microseconds (0 to 100000) before each timed repeat (tune's option).\n"
              "Exit 1 if the kernel is not valid.");
    return 0;
  }
  Args a = parse(argc, argv,
                 {"family", "params", "shape", "dtype", "seed", "db", "device", "timeout", "direction", "inputs",
                  "save-outputs", "input-dist", "input-scale", "heads-k", "varlen", "seq-lens", "seq-lens-k", "paged",
                  "window", "softcap", "mask-mod", "mask-tensor", "pause-us"},
                 {"causal", "check", "json", "best", "check-determinism", "alibi"});
  no_positional(a, "run");
  if (!a.has("family")) throw UsageError("run needs --family");
  if (!a.has("shape")) throw UsageError("run needs --shape B,H,Sq,Sk,d (or H,d with --varlen or --seq-lens)");
  if (a.has("params") == a.has("best")) throw UsageError("run needs exactly one of --params and --best");
  if (a.has("best") && !a.has("db")) throw UsageError("--best needs --db");
  const Family& f = find_family(a.get("family"));
  Problem p = parse_shape(a.get("shape"), a);
  check_mask_mods_compile({p});  // a mask_mod's NVRTC error in one line, first
  if (a.has("inputs") && p.mask_mod.enabled())
    throw UsageError("--inputs with --mask-mod: the validation's mask comes from the predicate on generated inputs");
  if (a.has("inputs") && p.varlen.enabled())
    throw UsageError("--inputs reads dense [B,H,S,d] files; a packed variable-length batch uses generated inputs");
  if (a.has("inputs") && p.paged.enabled())
    throw UsageError("--inputs reads dense [B,H,S,d] files; a paged K/V cache uses generated inputs");
  if (a.has("inputs") && (a.has("input-dist") || a.has("input-scale")))
    throw UsageError("--inputs reads the inputs from files; --input-dist and --input-scale are for generated ones");
  p.inputs = input_dist_option(a, p.inputs);
  p.direction = a.get("direction", f.direction);
  if (p.direction != f.direction)
    throw UsageError("family " + f.name + " computes the " + f.direction + " direction, not " + p.direction);
  if (std::find(f.dtypes.begin(), f.dtypes.end(), p.dtype) == f.dtypes.end())
    throw UsageError("family " + f.name + " does not support dtype " + to_string(p.dtype));
  if (std::find(f.head_dims.begin(), f.head_dims.end(), p.head_dim) == f.head_dims.end())
    throw UsageError("family " + f.name + " does not support head_dim " + std::to_string(p.head_dim));
  if (const std::string why = f.shape_reason(p); !why.empty()) throw UsageError("family " + f.name + " " + why);
  RunOptions o = run_options(a);
  if (a.has("check")) o.max_rows = p.rows_q();  // every row
  o.check_determinism = a.has("check-determinism");
  std::unique_ptr<Store> store;  // --best: opened read-only for the lookup; for storing the run, read-write after it
  if (a.has("db")) store = std::make_unique<Store>(a.get("db"), a.has("best") ? Store::Mode::read_only : Store::Mode::read_write);
  Config cfg = a.has("params") ? f.parse_config(a.get("params")) : Config{};  // bad params fail before any GPU work
  auto check_pages = [&](const Config& c) {  // a paged problem: the config must read its pages
    if (p.paged.enabled())
      if (const char* why = f.paged_check(c, p.paged.page_size))
        throw UsageError("family " + f.name + " " + f.config_string(c) + ": " + why + " (" +
                         std::to_string(p.paged.page_size) + ")");
  };
  if (a.has("params")) check_pages(cfg);
  if (a.has("inputs")) {  // checked here, before any GPU work: every file there, every size exact
    const double work = (double)p.batch * p.heads * p.seq_q * p.seq_k * p.head_dim;
    if (p.direction == "bwd" && work > kMaxFileBwdReferenceWork)
      throw UsageError("--inputs with a backward: B*H*Sq*Sk*d = " + std::to_string((long long)work) +
                       " is over 2^34, too slow for the float64 reference of every head");
    if (const std::string why = check_input_files(a.get("inputs"), p); !why.empty()) throw UsageError("--inputs: " + why);
    o.inputs_dir = std::filesystem::absolute(a.get("inputs")).string();
  }
  if (a.has("save-outputs")) {
    std::error_code ec;
    std::filesystem::create_directories(a.get("save-outputs"), ec);
    if (ec || !std::filesystem::is_directory(a.get("save-outputs")))
      throw UsageError("--save-outputs: cannot create folder '" + a.get("save-outputs") + "'");
    o.save_outputs_dir = std::filesystem::absolute(a.get("save-outputs")).string();
    std::vector<std::string> inputs;  // no output file may be one of the run's inputs
    if (a.has("db")) inputs.push_back(a.get("db"));
    for (const char* n : {"q.bin", "k.bin", "v.bin", "do.bin"})
      if (a.has("inputs")) inputs.push_back(a.get("inputs") + "/" + n);
    for (const char* n : {"o.bin", "lse.bin", "dq.bin", "dk.bin", "dv.bin"})
      for (const std::string& in : inputs)
        if (same_file(o.save_outputs_dir + "/" + n, in) || (a.has("db") && is_store_file(o.save_outputs_dir + "/" + n, a.get("db"))))
          throw UsageError("--save-outputs: '" + o.save_outputs_dir + "/" + n + "' is the input '" + in + "'");
  }
  GpuSession gpu(o);
  if (!gpu.has_gpu()) {
    std::fprintf(stderr, "flashtune: no GPU found (%s)\n", gpu.no_gpu_reason().c_str());
    return 1;
  }
  if (a.has("best")) {
    ResultFilter filter{f.name, gpu.device().name, to_string(p.dtype), f.direction, p.head_dim, (int)p.causal, false};  // every status: see select.cpp's superseded
    const StoredChoice pick = stored_choice(store->results(filter), p);  // the problem's own best, else its bucket's
    if (pick.source.empty())
      throw UsageError("no stored valid " + f.name + " result for " + gpu.device().name + " " + to_string(p.dtype) +
                       " d" + std::to_string(p.head_dim) + (p.causal ? " causal" : "") + " in " + a.get("db"));
    cfg = f.parse_config(pick.config);
    store = std::make_unique<Store>(a.get("db"));
  }
  check_pages(cfg);  // --best: its pick is the problem's own row, which read these pages
  const Variant v = variant_for(f, cfg, p);
  Compiler compiler(gpu.device().arch);
  KernelRecord k = compiler.compile_all({v}, store.get())[0];
  ResultRecord r = gpu.run(k, v, p);
  // A run on file inputs is not a (problem, seed) measurement: it stays out of the store.
  if (store && k.status == "compiled" && o.inputs_dir.empty()) store->put_result(r, gpu.device());
  if (a.has("json")) {
    json j = {{"family", f.name}, {"config", k.config}, {"problem", to_json(p)}, {"status", r.status},
              {"error", r.error}, {"max_abs", r.max_abs}, {"max_rel", r.max_rel}, {"mse", r.mse},
              {"ms_median", r.ms_median}, {"ms_p20", r.ms_p20}, {"ms_p80", r.ms_p80}, {"reps", r.reps},
              {"tflops", r.tflops}, {"gbps", r.gbps}, {"registers", k.res.registers}, {"device", gpu.device().name},
              {"detail", r.detail.empty() ? json::object() : json::parse(r.detail, nullptr, false)}};
    if (!o.inputs_dir.empty()) j["inputs"] = o.inputs_dir;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s %s on %s [%s]\n", f.name.c_str(), k.config.c_str(), p.str().c_str(), gpu.device().name.c_str());
    std::printf("  status %s%s%s\n", r.status.c_str(), r.error.empty() ? "" : ": ", r.error.c_str());
    std::printf("  errors vs float64 reference: max_abs %.3g  max_rel %.3g  mse %.3g  %s\n", r.max_abs, r.max_rel, r.mse,
                r.detail.c_str());
    if (r.status == "ok")
      std::printf("  time %.4f ms (p20 %.4f, p80 %.4f, %d reps)  %.2f TFLOP/s  %.1f GB/s  %d registers\n", r.ms_median,
                  r.ms_p20, r.ms_p80, r.reps, r.tflops, r.gbps, k.res.registers);
  }
  return r.status == "ok" ? 0 : 1;
}

}  // namespace flashtune::cli
