// The JIT disk cache: one file per compiled kernel, named by Compiler::variant_hash (arch, template
// sources, options, NVRTC version, name expressions), in $FLASHTUNE_CACHE_DIR, else
// $XDG_CACHE_HOME/flashtune, else ~/.cache/flashtune.
//
// Entry: magic "FTKCACH1", payload size (8 bytes, little-endian), content hash of the payload (32 hex
// characters, core/util's content_hash), payload. Written to a private temp file in the folder
// (mkstemp) and rename()d into place, so readers see a whole entry or none, and several processes
// filling one entry at once leave one valid entry (the last rename wins; all are the same kernel).
// A truncated or corrupted entry fails the size or hash check: load() removes it and answers "missing",
// so the caller compiles and stores it again. The folder must be this user's and not writable by
// others, and an entry a regular file of this user's of at most 1 GiB, opened without following links
// (a FIFO, a link or an oversized file is a miss, never read and never removed).
#pragma once
#include <optional>
#include <string>

namespace flashtune::rt {

class DiskCache {
 public:
  // dir empty: disabled (every load misses, stores do nothing).
  explicit DiskCache(std::string dir) : dir_(std::move(dir)) {}
  // $FLASHTUNE_CACHE_DIR, else $XDG_CACHE_HOME/flashtune, else $HOME/.cache/flashtune, else "": the
  // first that is safe (unsafe_reason), the others passed over with a one-line note on stderr.
  static std::string default_dir();
  // Why `dir` cannot hold this user's kernels: not a folder, another user's, writable by group or
  // others (a 1777 /tmp folder: anyone could plant code we would load). "" when safe or missing.
  static std::string unsafe_reason(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // The payload, or nullopt when missing or invalid (an invalid entry is removed). Keys are hex
  // strings (variant hashes); anything else is refused (never a path).
  std::optional<std::string> load(const std::string& key) const;
  // True when the entry exists and is valid (reads it: used by explain()).
  bool contains(const std::string& key) const { return load(key).has_value(); }
  // Writes the entry atomically; false (no exception) when the folder cannot be made or written.
  bool store(const std::string& key, const std::string& payload) const;
  std::string path(const std::string& key) const;  // dir/key.ftk

  static std::string encode(const std::string& payload);  // header + payload
  // The payload if `bytes` is a whole valid entry, else nullopt.
  static std::optional<std::string> decode(const std::string& bytes);

 private:
  std::string dir_;
};

}  // namespace flashtune::rt
