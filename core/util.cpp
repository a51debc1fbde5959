#include "core/util.hpp"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace flashtune {

void ContentHasher::update(std::string_view data) {
  // Two independent 64-bit FNV-1a lanes (different offset bases) -> 128 bits.
  constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t a = a_, b = b_;
  for (unsigned char c : data) {
    a = (a ^ c) * kPrime;
    b = (b ^ c) * kPrime;
    b ^= b >> 29;
  }
  a_ = a, b_ = b;
}

std::string ContentHasher::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a_, (unsigned long long)b_);
  return buf;
}

std::string content_hash(std::string_view data) {
  ContentHasher h;
  h.update(data);
  return h.hex();
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace((unsigned char)s[b])) ++b;
  while (e > b && std::isspace((unsigned char)s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string slugify(std::string_view s, char sep) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c)) out += (char)std::tolower(c);
    else if (!out.empty() && out.back() != sep) out += sep;
  }
  while (!out.empty() && out.back() == sep) out.pop_back();
  return out;
}

std::string now_iso8601() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string format_duration(double seconds) {
  long s = seconds < 0 ? 0 : (long)(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

std::string brief(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = (unsigned char)s[i];
    if (c == 0xc2 && i + 1 < s.size() && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0x9f) {
      out += '?';  // a C1 control in UTF-8 (U+0080..U+009F: CSI is U+009B), which some terminals obey
      ++i;
    } else {
      out += c < 0x20 || c == 0x7f ? '?' : s[i];
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

bool is_safe_file_name(std::string_view s) {
  if (s.empty() || s.size() > 200 || s[0] == '.') return false;
  for (char c : s)
    if (!std::isalnum((unsigned char)c) && c != '_' && c != '-' && c != '.') return false;
  return true;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool is_store_file(const std::string& path, const std::string& db) {
  if (path.empty() || db.empty()) return false;
  if (same_file(path, db)) return true;
  namespace fs = std::filesystem;
  std::error_code ec;
  // The path with every link in the part that exists resolved (so "a/../b", "./b" and a linked folder
  // compare equal), a link to a file not there yet followed too (writing through it would make that file);
  // a path that does not exist yet is compared by name.
  auto resolved = [&](const std::string& p) {
    fs::path r = fs::absolute(p, ec);
    for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(r, ec)); ++hops) {
      const fs::path target = fs::read_symlink(r, ec);
      if (ec) break;
      r = target.is_absolute() ? target : r.parent_path() / target;
    }
    fs::path c = fs::weakly_canonical(r, ec);
    return ec ? r.lexically_normal() : c;
  };
  const fs::path out = resolved(path);
  std::vector<std::string> stores = {fs::absolute(db, ec).lexically_normal().string(), resolved(db).string()};
  for (const std::string& s : stores)
    for (const char* suffix : {"-wal", "-shm", "-journal"}) {
      const std::string companion = s + suffix;
      if (same_file(path, companion) || resolved(companion) == out) return true;
    }
  return false;
}

std::string make_private_tmpdir(const std::string& prefix) {
  const char* env = std::getenv("TMPDIR");
  std::string base = env && *env == '/' ? env : "/tmp";
  std::string tmpl = base + "/" + prefix + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) {  // mkdtemp: a new folder, mode 0700, never an existing path
    tmpl = "/tmp/" + prefix + "-XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a private folder under " + base + " or /tmp");
  }
  return tmpl;
}

}  // namespace flashtune
