// mask_mod (issue 32, part 3): the user's mask predicate as text, checked, normalised and hashed; the source
// wrapped around it for NVRTC; a compile of it alone whose error is one line. docs/kernels.md, "mask_mod", is the
// design; templates/mask_mod.h the device side.
#pragma once
#include <string>
#include <vector>

namespace flashtune {

inline constexpr size_t kMaxMaskModBytes = 4000;       // the text as given
inline constexpr size_t kMaxMaskModNormalised = 2000;  // once comments are gone and white space collapsed
inline constexpr size_t kMaxMaskTensorName = 32;

// A checked predicate: the one spelling that is hashed, stored and compiled.
struct MaskPredicate {
  std::string body;                // normalised: statements with a return, or `return (EXPR);`
  std::vector<std::string> names;  // the tensors' names, sorted (bound to MaskModArgs::tensor[i] in this order)
  bool reads_batch = false;        // `b` occurs in the text (else one block summary serves every batch entry)
  bool reads_head = false;         // `h` occurs likewise
  bool expression = false;         // given as one expression (body is "return (" + it + ");"); not identity

  bool enabled() const { return !body.empty(); }
  // 16 hex digits of content_hash(body + '\0' + names joined by ','): the predicate's identity.
  std::string hash() const;
  // "flashtune::MaskMod_<hash>": the struct the wrapper defines, AttnModTraits' fifth argument.
  std::string type_name() const;
  // The wrapper: `#include "mask_mod.h"`, then the struct around the body (the body alone on line
  // kMaskBodyLine, after kMaskBodyIndent spaces, so that an NVRTC error's line and caret map back to it).
  std::string wrapper_source() const;
  bool operator==(const MaskPredicate& o) const { return body == o.body && names == o.names; }
};
inline constexpr int kMaskBodyLine = 11;
inline constexpr int kMaskBodyIndent = 4;

// Checks and normalises the user's text (docs/kernels.md, "Validation of the text") with the tensors' names:
// throws UsageError, one line starting "mask_mod" and naming what is wrong. `names` in any order.
MaskPredicate make_mask_predicate(const std::string& text, std::vector<std::string> names);

// A predicate for compile coverage (the sample, the families' defaults): a document mask over two tensors that reads
// b and h too, "return doc[q_idx] == doc[kv_idx] && kv_idx + prefix[b] >= q_idx - 256 * (h + 1);".
MaskPredicate sample_mask_predicate();

// A C++ keyword (C++17, and the CUDA words a name must not shadow).
bool is_cxx_keyword(const std::string& word);

// The program NVRTC compiles for a kernel with this predicate: the wrapper, then `#include "<template_file>"`.
std::string mask_program_source(const MaskPredicate&, const std::string& template_file);

// The first error of an NVRTC log as one line: its message without the file and line prefix, and where it is on the
// body's line (kMaskBodyLine) the column in the normalised text and the text from there ("... (at column 14:
// "dox[q_idx] == ...")"). The log's first line when it holds no "error".
std::string mask_compile_error(const std::string& log, const MaskPredicate&);

// Compiles the wrapper with a kernel that calls it, alone (no attention template; ~0.1 s), for `arch` ("sm_90a").
// Throws UsageError "mask_mod does not compile: <mask_compile_error>" when NVRTC rejects it; NvrtcUnavailable when
// there is no NVRTC.
void check_mask_compiles(const MaskPredicate&, const std::string& arch = "sm_90a");

}  // namespace flashtune
