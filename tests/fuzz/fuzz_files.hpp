// A private folder for targets that need their input as a file (T4 import, a store).
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace flashtune::fuzz {

inline const std::string& scratch_dir() {  // removed at exit
  static const std::string dir = [] {
    const char* base = getenv("TMPDIR");
    std::string t = std::string(base && *base ? base : "/tmp") + "/flashtune-fuzz.XXXXXX";
    if (!mkdtemp(t.data())) abort();
    return t;
  }();
  static const bool removed_at_exit = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return true;
  }();
  (void)removed_at_exit;
  return dir;
}

inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write((const char*)data, (std::streamsize)size);
  return path;
}

inline void remove_store(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) unlink((path + suffix).c_str());
}

}  // namespace flashtune::fuzz
