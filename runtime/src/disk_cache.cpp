#include "disk_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "core/util.hpp"

namespace flashtune::rt {

namespace {
constexpr char kMagic[8] = {'F', 'T', 'K', 'C', 'A', 'C', 'H', '1'};
constexpr size_t kHashChars = 32;
constexpr size_t kHeader = sizeof(kMagic) + 8 + kHashChars;
constexpr size_t kMaxEntry = size_t{1} << 30;  // a cubin is a few hundred KiB; refuse absurd sizes

bool valid_key(const std::string& k) {
  if (k.empty() || k.size() > 128) return false;
  for (char c : k)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// mkdir -p with mode 0700 for the folders it creates.
bool make_dirs(const std::string& dir) {
  if (dir.empty()) return false;
  for (size_t pos = 1;; ++pos) {
    pos = dir.find('/', pos);
    const std::string part = dir.substr(0, pos);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return false;
    if (pos == std::string::npos) break;
  }
  struct stat st;
  return stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// An entry: opened without following a link and without blocking on a FIFO, read only when it is a
// regular file of this user whose size fits an entry. False (nothing read) otherwise.
bool read_entry(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
            (uint64_t)st.st_size <= kMaxEntry + kHeader;
  if (ok) {
    out.resize((size_t)st.st_size);
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += (size_t)r;
    }
    out.resize(done);  // shorter: a truncated entry, which decode() refuses
  }
  ::close(fd);
  return ok;
}
}  // namespace

std::string DiskCache::unsafe_reason(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return errno == ENOENT ? "" : "cannot be read";  // missing: created mode 0700
  if (!S_ISDIR(st.st_mode)) return "is not a folder";
  if (st.st_uid != geteuid()) return "belongs to another user";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return "is writable by others";
  return "";
}

std::string DiskCache::default_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  // The first folder set that is this user's alone; one that is not (a shared 1777 folder, another
  // user's) is passed over with a one-line note (once per process): its entries would run as our code.
  static std::set<std::string> noted;
  static std::mutex mu;
  std::vector<std::string> candidates;
  if (std::string d = env("FLASHTUNE_CACHE_DIR"); !d.empty()) candidates.push_back(d);
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) candidates.push_back(d + "/flashtune");
  if (std::string d = env("HOME"); !d.empty()) candidates.push_back(d + "/.cache/flashtune");
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string why = unsafe_reason(candidates[i]);
    if (why.empty()) return candidates[i];
    std::lock_guard<std::mutex> lock(mu);
    if (noted.insert(candidates[i]).second)
      std::fprintf(stderr, "flashtune: kernel cache folder '%s' %s: not used (%s)\n", brief(candidates[i], 200).c_str(),
                   why.c_str(), i + 1 < candidates.size() ? ("trying '" + brief(candidates[i + 1], 200) + "'").c_str() : "no disk cache");
  }
  return "";
}

std::string DiskCache::path(const std::string& key) const { return dir_ + "/" + key + ".ftk"; }

std::string DiskCache::encode(const std::string& payload) {
  std::string out(kMagic, sizeof kMagic);
  uint64_t n = payload.size();
  for (int i = 0; i < 8; ++i) out.push_back((char)((n >> (8 * i)) & 0xff));
  out += content_hash(payload);
  out += payload;
  return out;
}

std::optional<std::string> DiskCache::decode(const std::string& bytes) {
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return std::nullopt;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= (uint64_t)(unsigned char)bytes[sizeof kMagic + i] << (8 * i);
  if (n != bytes.size() - kHeader) return std::nullopt;
  std::string payload = bytes.substr(kHeader);
  if (content_hash(payload) != bytes.substr(sizeof kMagic + 8, kHashChars)) return std::nullopt;
  return payload;
}

std::optional<std::string> DiskCache::load(const std::string& key) const {
  if (dir_.empty() || !valid_key(key) || !unsafe_reason(dir_).empty()) return std::nullopt;
  std::string bytes;
  if (!read_entry(path(key), bytes)) return std::nullopt;  // missing, or not a regular file of ours: a miss
  std::optional<std::string> payload = decode(bytes);
  // Truncated or corrupted: remove it so that the rebuilt entry replaces it. A concurrent writer's
  // rename() may land between our read and this unlink; then its entry is lost and rebuilt once more.
  if (!payload) ::unlink(path(key).c_str());
  return payload;
}

bool DiskCache::store(const std::string& key, const std::string& payload) const {
  if (dir_.empty() || !valid_key(key) || !make_dirs(dir_) || !unsafe_reason(dir_).empty()) return false;
  std::string tmp = dir_ + "/.tmp-" + key + "-XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) return false;
  const std::string bytes = encode(payload);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  const bool ok = done == bytes.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path(key).c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace flashtune::rt
