// File-backed inputs (`flashtune run --inputs DIR`): raw little-endian arrays in the problem's dtype
// (fp32, or fp16 / bf16 bit patterns), layout [B, H, S, d] contiguous. Forward: q.bin, k.bin, v.bin;
// backward also do.bin. Shared by the CLI (checked before any GPU work) and the worker (which reads them).
#pragma once
#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tuner/problem.hpp"

namespace flashtune {

struct InputFile {
  std::string name;  // "q", "k", "v", "do"
  size_t bytes;      // exact size the file must have
};

inline std::vector<InputFile> input_files(const Problem& p) {
  const size_t e = dtype_bytes(p.dtype), bh = (size_t)p.batch * p.heads;
  const size_t q = bh * p.seq_q * p.head_dim * e, k = bh * p.seq_k * p.head_dim * e;
  std::vector<InputFile> f = {{"q", q}, {"k", k}, {"v", k}};
  if (p.direction == "bwd") f.push_back({"do", q});
  return f;
}

inline std::string input_path(const std::string& dir, const std::string& name) { return dir + "/" + name + ".bin"; }

// "" when every file exists with exactly the expected size, else a one-line reason.
inline std::string check_input_files(const std::string& dir, const Problem& p) {
  for (const InputFile& f : input_files(p)) {
    const std::string path = input_path(dir, f.name);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return "input file '" + path + "' does not exist (expected " + std::to_string(f.bytes) + " bytes)";
    if ((size_t)st.st_size != f.bytes)
      return "input file '" + path + "' has " + std::to_string((long long)st.st_size) + " bytes, expected " +
             std::to_string(f.bytes) + " (" + to_string(p.dtype) + " [B,H,S,d] for " + p.str() + ")";
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
inline void write_output_file(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = input_path(dir, name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
  if (!out) throw std::runtime_error("cannot write output file '" + path + "'");
}

// Backward with file-backed inputs: every head is distinct, so the CPU float64 reference covers all
// B*H heads in full. Past this many B*H*Sq*Sk*d it would take too long.
constexpr double kMaxFileBwdReferenceWork = 0x1p34;

}  // namespace flashtune
