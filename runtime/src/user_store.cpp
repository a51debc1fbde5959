#include "user_store.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>

#include "disk_cache.hpp"
#include "core/util.hpp"

namespace flashtune::rt {

namespace {
constexpr size_t kMaxSlug = 200;

std::string absolute_env(const char* name) {
  const char* v = std::getenv(name);
  return v && v[0] == '/' ? v : "";  // a relative XDG_CACHE_HOME is invalid (XDG spec): ignored
}

// Once per process and path: the user's store passed over, on stderr.
void note_once(const std::string& path, const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> noted;
  std::lock_guard<std::mutex> lock(mu);
  if (noted.insert(path).second) std::fprintf(stderr, "flashtune: %s\n", line.c_str());
}
}  // namespace

std::string device_slug(const std::string& device) {
  std::string slug = slugify(device, '-');
  if (slug.size() > kMaxSlug) {
    slug.resize(kMaxSlug - 17);
    while (!slug.empty() && slug.back() == '-') slug.pop_back();
    slug += "-" + content_hash(device).substr(0, 16);
  }
  return slug;
}

std::string user_store_dir() {
  if (std::string d = absolute_env("XDG_CACHE_HOME"); !d.empty()) return d + "/flashtune";
  if (std::string d = absolute_env("HOME"); !d.empty()) return d + "/.cache/flashtune";
  return "";
}

std::string user_store_path(const std::string& device) {
  const std::string dir = user_store_dir(), slug = device_slug(device);
  return dir.empty() || slug.empty() ? "" : dir + "/" + slug + ".db";
}

UserStoreCheck check_user_store(const std::string& path) {
  UserStoreCheck c;
  if (path.empty()) return c;
  const std::string dir = path.substr(0, path.rfind('/'));
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 && errno == ENOENT) return c;  // no folder: no store
  // The folder first: in a folder another user can write, the file checked below could be replaced
  // between the check and the open.
  if (std::string why = DiskCache::unsafe_reason(dir); !why.empty()) {
    c.exists = lstat(path.c_str(), &st) == 0;
    if (c.exists) c.why = "is in a folder that " + why;  // "... that is writable by others"
    return c;
  }
  if (lstat(path.c_str(), &st) != 0) {
    c.exists = errno != ENOENT;
    if (c.exists) c.why = "cannot be read";
    return c;
  }
  c.exists = true;
  if (S_ISLNK(st.st_mode)) c.why = "is a symbolic link";
  else if (!S_ISREG(st.st_mode)) c.why = "is not a regular file";
  else if (st.st_uid != geteuid()) c.why = "belongs to another user";
  else if (st.st_mode & (S_IWGRP | S_IWOTH)) c.why = "is writable by group or others";
  return c;
}

StoreChoice store_for(const std::string& device) {
  StoreChoice s;
  if (const char* db = std::getenv("FLASHTUNE_DB"); db && *db) {
    s.path = s.identity = db;
    return s;
  }
  const std::string path = user_store_path(device);
  const UserStoreCheck c = check_user_store(path);
  if (!c.exists) return s;
  if (!c.why.empty()) {
    s.note = "the user's store '" + brief(path, 200) + "' " + c.why + ": not read";
    s.identity = "refused|" + path;  // a plan of its own: explain() tells why
    note_once(path, s.note + " (the committed tables are used; make it a file of yours, mode 0600, or remove it)");
    return s;
  }
  struct stat st {};
  lstat(path.c_str(), &st);
  s.path = path;
  s.user = true;
  s.identity = path + '|' + std::to_string(st.st_ino) + '|' + std::to_string(st.st_size) + '|' +
               std::to_string(st.st_mtim.tv_sec) + '.' + std::to_string(st.st_mtim.tv_nsec);
  return s;
}

bool committed_tables_on() {
  const char* v = std::getenv("FLASHTUNE_TABLES");
  const std::string value = v ? v : "";
  if (value.empty() || value == "on") return true;
  if (value == "off") return false;
  throw std::invalid_argument("FLASHTUNE_TABLES must be on or off, not '" + brief(value, 40) + "'");
}

Pick choose_with_store(const TableSet& ts, const Query& q, const StoreChoice& store) {
  if (!store.user) {
    Pick p = choose(ts, q, store.path);
    if (!store.note.empty()) p.note = p.note.empty() ? store.note : store.note + "; " + p.note;
    return p;
  }
  try {
    Pick p = choose(ts, q, store.path);
    if (p.source == "db") p.source = "user";
    return p;
  } catch (const std::exception& e) {  // damaged, foreign, a planted -wal, too large: the tables
    const std::string why = "the user's store '" + brief(store.path, 200) + "' not read (" + brief(e.what(), 200) + ")";
    note_once(store.path, why + ": the committed tables are used");
    Pick p = choose(ts, q, "");
    p.note = p.note.empty() ? why : why + "; " + p.note;
    return p;
  }
}

}  // namespace flashtune::rt
