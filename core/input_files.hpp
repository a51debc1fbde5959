// File-backed inputs (`flashtune run --inputs DIR`): raw little-endian arrays in the problem's dtype
// (fp32, or fp16 / bf16 bit patterns), layout [B, H, S, d] contiguous. Forward: q.bin, k.bin, v.bin;
// backward also do.bin. Shared by the CLI (checked before any GPU work) and the worker (which reads them).
#pragma once
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace flashtune {

constexpr long long kMaxInputFileBytes = 1ll << 40;  // 1 TiB: a file --inputs may name

struct InputFile {
  std::string name;  // "q", "k", "v", "do"
  size_t bytes;      // exact size the file must have
};

inline std::vector<InputFile> input_files(const Problem& p) {
  const size_t e = dtype_bytes(p.dtype), bh = (size_t)p.batch * p.heads, bhk = (size_t)p.batch * p.kv_heads();
  const size_t q = bh * p.seq_q * p.head_dim * e, k = bhk * p.seq_k * p.head_dim * e;
  std::vector<InputFile> f = {{"q", q}, {"k", k}, {"v", k}};
  if (p.direction == "bwd") f.push_back({"do", q});
  return f;
}

inline std::string input_path(const std::string& dir, const std::string& name) { return dir + "/" + name + ".bin"; }

// Index of the first NaN or Inf among raw values of dtype t (fp32, or fp16/bf16 bit patterns), or -1.
// A non-finite input has no meaningful float64 reference: the run is refused before any GPU work.
inline long long first_non_finite(const uint8_t* bytes, size_t n_bytes, DType t) {
  if (t == DType::fp32) {
    for (size_t i = 0; i + 4 <= n_bytes; i += 4) {
      uint32_t w;
      std::memcpy(&w, bytes + i, 4);
      if ((w & 0x7f800000u) == 0x7f800000u) return (long long)(i / 4);
    }
    return -1;
  }
  const uint16_t exp_mask = t == DType::fp16 ? 0x7c00u : 0x7f80u;  // all-ones exponent: Inf or NaN
  for (size_t i = 0; i + 2 <= n_bytes; i += 2) {
    uint16_t h;
    std::memcpy(&h, bytes + i, 2);
    if ((h & exp_mask) == exp_mask) return (long long)(i / 2);
  }
  return -1;
}

inline std::vector<uint8_t> read_input_file(const std::string& dir, const InputFile& f);

// "" when every file exists with exactly the expected size and holds only finite values, else a
// one-line reason.
inline std::string check_input_files(const std::string& dir, const Problem& p) {
  // The sizes in size_t only when they fit far below it: B*H*S*d*bytes in double first (exact to 2^53).
  const double e = (double)dtype_bytes(p.dtype), s = (double)std::max(p.seq_q, p.seq_k);
  if ((double)p.batch * std::max(p.heads, p.kv_heads()) * s * p.head_dim * e > kMaxInputFileBytes)
    return "the problem's input files would be over " + std::to_string(kMaxInputFileBytes >> 30) + " GiB each";
  for (const InputFile& f : input_files(p)) {
    const std::string path = input_path(dir, f.name);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return "input file '" + path + "' does not exist (expected " + std::to_string(f.bytes) + " bytes)";
    if ((size_t)st.st_size != f.bytes)
      return "input file '" + path + "' has " + std::to_string((long long)st.st_size) + " bytes, expected " +
             std::to_string(f.bytes) + " (" + to_string(p.dtype) + " [B,H,S,d] for " + p.str() + ")";
  }
  for (const InputFile& f : input_files(p)) {
    std::vector<uint8_t> bytes;
    try {
      bytes = read_input_file(dir, f);
    } catch (const std::exception& e) {
      return e.what();
    }
    if (const long long i = first_non_finite(bytes.data(), bytes.size(), p.dtype); i >= 0)
      return "input file '" + input_path(dir, f.name) + "' holds NaN or Inf (element " + std::to_string(i) +
             " of " + std::to_string(bytes.size() / dtype_bytes(p.dtype)) + ")";
  }
  return "";
}

// The raw bytes of DIR/<name>.bin, which must be exactly `bytes` long.
inline std::vector<uint8_t> read_input_file(const std::string& dir, const InputFile& f) {
  const std::string path = input_path(dir, f.name);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot read input file '" + path + "'");
  const auto size = (size_t)in.tellg();
  if (size != f.bytes)
    throw std::runtime_error("input file '" + path + "' has " + std::to_string(size) + " bytes, expected " +
                             std::to_string(f.bytes));
  std::vector<uint8_t> bytes(size);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), (std::streamsize)size);
  if (!in) throw std::runtime_error("cannot read input file '" + path + "'");
  return bytes;
}

// Writes raw bytes to DIR/<name>.bin.
inline void write_output_file(const std::string& dir, const std::string& name, const void* data, size_t bytes) {
  const std::string path = input_path(dir, name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), (std::streamsize)bytes);
  if (!out) throw std::runtime_error("cannot write output file '" + path + "'");
}
inline void write_output_file(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  write_output_file(dir, name, bytes.data(), bytes.size());
}

// Backward with file-backed inputs: every head is distinct, so the CPU float64 reference covers all
// B*H heads in full. Past this many B*H*Sq*Sk*d it would take too long.
constexpr double kMaxFileBwdReferenceWork = 0x1p34;

}  // namespace flashtune
