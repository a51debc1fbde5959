#include "core/mask_mod.hpp"

#include <algorithm>
#include <set>

#include "core/embedded.hpp"
#include "core/nvrtc_api.hpp"
#include "core/util.hpp"
#include "templates/mask_mod.h"

namespace flashtune {

namespace {

bool ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool ident_char(char c) { return ident_start(c) || (c >= '0' && c <= '9'); }
bool digit(char c) { return c >= '0' && c <= '9'; }
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

[[noreturn]] void refuse(const std::string& why) { throw UsageError("mask_mod " + why); }

// Comments out (each one space), then every run of white space one space, trimmed. An unclosed /* is refused.
std::string normalise(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 2, "//") == 0) {
      const size_t nl = text.find('\n', i);
      i = nl == std::string::npos ? text.size() : nl;
      out += ' ';
    } else if (text.compare(i, 2, "/*") == 0) {
      const size_t end = text.find("*/", i + 2);
      if (end == std::string::npos) refuse("has a /* comment that is not closed");
      i = end + 2;
      out += ' ';
    } else {
      out += text[i++];
    }
  }
  std::string collapsed;
  for (char c : out) {
    if (space(c)) {
      if (!collapsed.empty() && collapsed.back() != ' ') collapsed += ' ';
    } else {
      collapsed += c;
    }
  }
  while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
  return collapsed;
}

// The identifiers of a normalised text, in order (numbers' letters, 1e5 or 0x1f, are not identifiers).
std::vector<std::string> identifiers(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    if (digit(s[i]) || (s[i] == '.' && i + 1 < s.size() && digit(s[i + 1]))) {  // a number: digits, letters, '.', exponent signs
      size_t j = i + 1;
      while (j < s.size() && (ident_char(s[j]) || s[j] == '.' ||
                              ((s[j] == '+' || s[j] == '-') && (s[j - 1] == 'e' || s[j - 1] == 'E' || s[j - 1] == 'p' || s[j - 1] == 'P'))))
        ++j;
      i = j;
    } else if (ident_start(s[i])) {
      size_t j = i + 1;
      while (j < s.size() && ident_char(s[j])) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace

bool is_cxx_keyword(const std::string& w) {
  static const std::set<std::string> words = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char",
      "char16_t", "char32_t", "char8_t", "class", "compl", "concept", "const", "consteval", "constexpr", "constinit",
      "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete", "do", "double",
      "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
      "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq", "nullptr", "operator", "or",
      "or_eq", "private", "protected", "public", "register", "reinterpret_cast", "requires", "return", "short",
      "signed", "sizeof", "static", "static_assert", "static_cast", "struct", "switch", "template", "this",
      "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual",
      "void", "volatile", "wchar_t", "while", "xor", "xor_eq", "_Pragma"};
  return words.count(w) > 0;
}

MaskPredicate make_mask_predicate(const std::string& text, std::vector<std::string> names) {
  if (text.size() > kMaxMaskModBytes)
    refuse("is " + std::to_string(text.size()) + " bytes, more than " + std::to_string(kMaxMaskModBytes));
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = (unsigned char)text[i];
    if (!(c >= 0x20 && c < 0x7f) && c != '\t' && c != '\n' && c != '\r')
      refuse("holds a character that is not printable ASCII (byte " + std::to_string(c) + " at " + std::to_string(i) + ")");
  }
  MaskPredicate m;
  std::string s = normalise(text);
  if (s.empty()) refuse("is empty (give the body of bool mask(int b, int h, int q_idx, int kv_idx))");
  if (s.size() > kMaxMaskModNormalised)
    refuse("is " + std::to_string(s.size()) + " characters once normalised, more than " + std::to_string(kMaxMaskModNormalised));
  // Characters and sequences that would make the text more than a function body: directives, line continuations,
  // literals (so no _Pragma("...") or asm("...")), digraphs and trigraphs (%: is '#'), launches.
  for (char c : std::string("#\\\"'`$@"))
    if (const size_t at = s.find(c); at != std::string::npos)
      refuse(std::string("may not hold '") + c + "' (directives, line continuations and literals are refused): at column " +
             std::to_string(at + 1) + ": \"" + brief(s.substr(at), 30) + "\"");
  for (const char* seq : {"<%", "%>", "<:", ":>", "%:", "??", "<<<"})
    if (const size_t at = s.find(seq); at != std::string::npos)
      refuse(std::string("may not hold '") + seq + "' (digraphs, trigraphs and launches; add a space if it is two operators): at column " +
             std::to_string(at + 1));
  // (), [] and {} balanced and nested in the order written: the body cannot close the wrapper's function.
  std::string open;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' || c == '[' || c == '{') open += c;
    if (c == ')' || c == ']' || c == '}') {
      const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (open.empty() || open.back() != want)
        refuse(std::string("has an unbalanced '") + c + "' at column " + std::to_string(i + 1));
      open.pop_back();
    }
  }
  if (!open.empty()) refuse(std::string("has an unclosed '") + open.back() + "'");
  bool has_return = false;
  const std::vector<std::string> ids = identifiers(s);
  for (const std::string& w : ids) {
    if (w == "asm" || w == "_Pragma" || w.rfind("__", 0) == 0 || w.rfind("ft_", 0) == 0)
      refuse("may not use the identifier '" + brief(w, 40) + "' (asm, _Pragma, and names starting __ or ft_ are refused)");
    has_return |= w == "return";
    m.reads_batch |= w == "b";
    m.reads_head |= w == "h";
  }
  if (has_return) {
    m.body = s;
  } else {  // one expression: its value is the answer (a trailing ';' is the user's statement end)
    if (s.back() == ';') s.pop_back();
    while (!s.empty() && s.back() == ' ') s.pop_back();
    if (s.empty() || s.find(';') != std::string::npos)
      refuse("is neither one expression nor statements with a return (\"" + brief(s, 40) + "\")");
    m.body = "return (" + s + ");";
    m.expression = true;
  }
  if (names.size() > (size_t)kMaxMaskTensors)
    refuse("reads at most " + std::to_string(kMaxMaskTensors) + " tensors, got " + std::to_string(names.size()));
  const std::set<std::string> used(ids.begin(), ids.end());
  for (const std::string& n : names) {
    if (n.empty() || n.size() > kMaxMaskTensorName || !ident_start(n[0]) ||
        !std::all_of(n.begin(), n.end(), [](char c) { return ident_char(c); }))
      refuse("tensor name '" + brief(n, 40) + "' is not a C identifier of at most " + std::to_string(kMaxMaskTensorName) + " characters");
    if (is_cxx_keyword(n) || n == "b" || n == "h" || n == "q_idx" || n == "kv_idx" || n == "asm" ||
        n.rfind("__", 0) == 0 || n.rfind("ft_", 0) == 0)
      refuse("tensor name '" + n + "' is a keyword, a parameter of the predicate (b, h, q_idx, kv_idx) or starts with __ or ft_");
    if (!used.count(n)) refuse("tensor '" + n + "' is not read by the predicate");
  }
  std::sort(names.begin(), names.end());
  if (std::adjacent_find(names.begin(), names.end()) != names.end())
    refuse("tensor '" + *std::adjacent_find(names.begin(), names.end()) + "' is named twice");
  m.names = std::move(names);
  return m;
}

MaskPredicate sample_mask_predicate() {
  return make_mask_predicate("return doc[q_idx] == doc[kv_idx] && kv_idx + prefix[b] >= q_idx - 256 * (h + 1);",
                             {"doc", "prefix"});
}

std::string MaskPredicate::hash() const {
  std::string key = body + '\0';
  for (size_t i = 0; i < names.size(); ++i) key += (i ? "," : "") + names[i];
  return content_hash(key).substr(0, 16);
}

std::string MaskPredicate::type_name() const { return "flashtune::MaskMod_" + hash(); }

std::string MaskPredicate::wrapper_source() const {
  // Line numbers matter: the body is line kMaskBodyLine (mask_compile_error maps NVRTC's errors back to it).
  std::string bind = "(void)ft_args;", unused;
  if (!names.empty()) {
    bind = "const MaskTensor ";
    for (size_t i = 0; i < names.size(); ++i) {
      bind += (i ? ", " : "") + names[i] + " = ft_args.tensor[" + std::to_string(i) + "]";
      unused += "(void)" + names[i] + "; ";
    }
    bind += ";";
  }
  const std::string out = std::string("#include \"mask_mod.h\"\n") +                                    // 1
                          "namespace flashtune {\n" +                                                  // 2
                          "struct MaskMod_" + hash() + " {\n" +                                        // 3
                          "  static constexpr int kTensors = " + std::to_string(names.size()) + ";\n" +  // 4
                          "  static constexpr bool kReadsBatch = " + (reads_batch ? "true" : "false") +
                          ", kReadsHead = " + (reads_head ? "true" : "false") + ";\n" +  // 5
                          "  __device__ __forceinline__ static bool test(const MaskModArgs& ft_args, int b, int h, "
                          "int q_idx, int kv_idx) {\n" +                               // 6
                          "    " + bind + "\n" +                                       // 7
                          "    (void)b; (void)h; (void)q_idx; (void)kv_idx; " + unused + "\n" +  // 8
                          "    // the user's predicate (flashtune mask_mod), normalised:\n" +    // 9
                          "    // bool mask(int b, int h, int q_idx, int kv_idx)\n" +             // 10
                          std::string(kMaskBodyIndent, ' ') + body + "\n" +                      // 11
                          "  }\n"
                          "};\n"
                          "}  // namespace flashtune\n";
  return out;
}

std::string mask_program_source(const MaskPredicate& m, const std::string& template_file) {
  return m.wrapper_source() + "#include \"" + template_file + "\"\n";
}

std::string mask_compile_error(const std::string& log, const MaskPredicate& m) {
  const std::vector<std::string> lines = split(log, '\n');
  size_t at = lines.size();
  for (size_t i = 0; i < lines.size() && at == lines.size(); ++i)
    if (lines[i].find("error") != std::string::npos) at = i;
  if (at == lines.size()) return lines.empty() ? "NVRTC failed" : brief(trim(lines[0]), 200);
  const std::string& line = lines[at];
  // "<file>(<line>): error: <message>" (or "catastrophic error"): the message, and the line it names.
  std::string message = line;
  int where = -1;
  if (const size_t colon = line.find("): "); colon != std::string::npos) {
    const size_t paren = line.rfind('(', colon);
    if (paren != std::string::npos) where = std::atoi(line.substr(paren + 1, colon - paren - 1).c_str());
    message = line.substr(colon + 3);
  }
  if (message.rfind("error: ", 0) == 0) message = message.substr(7);
  message = brief(trim(message), 160);
  // The caret line after the source line, where the error is on the body's line: the column in the user's text
  // (the expression form's added "return (" not counted).
  // NVRTC shows the source line (indented by its own margin, two spaces in NVRTC 13) and a caret under the token.
  if (where == kMaskBodyLine && at + 2 < lines.size()) {
    const size_t caret = lines[at + 2].find('^'), base = lines[at + 1].find_first_not_of(' ');  // the body's start
    const size_t added = m.expression ? 8 : 0;  // "return ("
    if (caret != std::string::npos && base != std::string::npos && caret >= base + added &&
        lines[at + 2].find_first_not_of(' ') == caret && caret - base < m.body.size()) {
      const size_t col = caret - base;  // in the body
      const size_t end = m.expression ? m.body.size() - 2 : m.body.size();  // not the expression form's ");"
      message += " (at column " + std::to_string(col - added + 1) + ": \"" + brief(m.body.substr(col, end - col), 30) + "\")";
    }
  } else if (where > kMaskBodyLine) {
    message += " (in the wrapper after the predicate: is a return missing, or a brace?)";
  }
  return message;
}

void check_mask_compiles(const MaskPredicate& m, const std::string& arch) {
  const NvrtcApi& nv = nvrtc();
  const EmbeddedHeaders headers = embedded_headers();
  const std::string source = m.wrapper_source() +
                             "__global__ void flashtune_mask_check(const flashtune::MaskModArgs a, int b, int h, int q, "
                             "int k, int* out) {\n  *out = " + m.type_name() + "::test(a, b, h, q, k) ? 1 : 0;\n}\n";
  nvrtcProgram prog;
  if (nv.CreateProgram(&prog, source.c_str(), "mask_mod.cu", headers.count(), headers.sources.data(),
                       headers.names.data()) != NVRTC_SUCCESS)
    throw UsageError("mask_mod: NVRTC could not create a program");
  const std::string target = "--gpu-architecture=" + arch;
  const char* opts[] = {target.c_str(), "--std=c++17", "-DFLASHTUNE_NVRTC=1"};
  const nvrtcResult rc = nv.CompileProgram(prog, 3, opts);
  size_t n = 0;
  nv.GetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  if (n) nv.GetProgramLog(prog, log.data());
  nv.DestroyProgram(&prog);
  while (!log.empty() && log.back() == '\0') log.pop_back();
  if (rc != NVRTC_SUCCESS) throw UsageError("mask_mod does not compile: " + mask_compile_error(log, m));
  // A path without a return is undefined behaviour in device code: an error here, not NVRTC's warning.
  if (log.find("missing return statement") != std::string::npos)
    throw UsageError("mask_mod does not compile: a path of the predicate ends without a return");
}

}  // namespace flashtune
