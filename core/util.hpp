// Small helpers shared by the tuner stages: errors, hashing, strings, time.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flashtune {

// Bad input from the user (a space file, a flag): reported as one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// 128-bit FNV-1a style content hash as 32 hex digits: a cache key, not a security boundary.
std::string content_hash(std::string_view data);
// The same hash fed in pieces (a file read in chunks): update(a); update(b) gives content_hash(a + b).
class ContentHasher {
 public:
  void update(std::string_view data);
  std::string hex() const;

 private:
  uint64_t a_ = 14695981039346656037ull, b_ = 0x9e3779b97f4a7c15ull;
};

std::vector<std::string> split(std::string_view s, char sep);
std::string trim(std::string_view s);
// "NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3"
std::string slugify(std::string_view s, char sep = '_');
std::string now_iso8601();
std::string format_duration(double seconds);  // "1m05s"

// An untrusted string quoted for a one-line message: at most `max` bytes, control characters (C0, DEL and C1
// in UTF-8) as '?'.
std::string brief(std::string_view s, size_t max = 80);

// A stored or imported string that becomes one file name: 1..200 bytes of letters, digits, '_', '-'
// and '.', not starting with '.' (so never "", ".", "..", a hidden file, or a path with '/').
bool is_safe_file_name(std::string_view s);

// True when both paths exist and name the same file (device and inode: links and spellings alike).
bool same_file(const std::string& a, const std::string& b);

// True when `path` is the SQLite store `db` or one of the files SQLite keeps beside it (db-wal, db-shm,
// db-journal, beside the path as given or beside the file a link leads to), however either is spelled and
// whether or not the companion exists yet: a verb that writes `path` would write over its store. A verb
// checks each output against each store it reads or writes, and each input against the store it writes.
bool is_store_file(const std::string& path, const std::string& db);

// A private folder (mode 0700, mkdtemp) under $TMPDIR, or /tmp: "<base>/<prefix>-XXXXXX".
std::string make_private_tmpdir(const std::string& prefix);

}  // namespace flashtune
