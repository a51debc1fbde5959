// The user's store: the results store that `flashtune.tune` (python/flashtune/tune.py) and
// `python -m flashtune tune --db "$(python -m flashtune devices --store)" ...` fill for the GPU in front
// of the user, and that the runtime reads with no environment variable.
//
// Path: $XDG_CACHE_HOME/flashtune/<gpu-slug>.db (XDG_CACHE_HOME absolute, as the XDG spec requires),
// else $HOME/.cache/flashtune/<gpu-slug>.db; <gpu-slug> is the device name as `flashtune devices --slug`
// prints it ("nvidia-h100-80gb-hbm3", the reports/ folder names).
//
// Which store a lookup reads (store_for): $FLASHTUNE_DB when set (an explicit choice: a store it cannot read
// fails the call), else the user's store when it exists and is safe (a regular file of this user's, not a
// link, not writable by group or others, in a folder of this user's not writable by others: the rule of
// the kernel cache folder, disk_cache.hpp), else none. Then the committed tables, then the family's
// default (lookup.hpp). A user's store that is unsafe or unreadable is passed over for the tables, with a
// one-line note (explain(), and once per process on stderr): a stale cache file must not break a model.
#pragma once
#include <string>

#include "lookup.hpp"

namespace flashtune::rt {

// slugify(device, '-'), as `flashtune devices --slug` prints it; a slug past 200 bytes is cut and
// ends in a hash of the name (file names stay under 255 bytes, long names stay apart). "" when the
// name has no letters or digits.
std::string device_slug(const std::string& device);

// The folder holding the users' stores: $XDG_CACHE_HOME/flashtune (when absolute), else
// $HOME/.cache/flashtune (when absolute), else "".
std::string user_store_dir();
// user_store_dir()/<device_slug>.db, or "" when either part is empty.
std::string user_store_path(const std::string& device);

// Whether the runtime may read `path` as the user's store.
struct UserStoreCheck {
  bool exists = false;  // false: no store (missing file or folder), nothing to say
  std::string why;      // exists: "" when safe, else why it is not read ("is writable by group or others")
};
UserStoreCheck check_user_store(const std::string& path);

// The store a lookup on `device` reads, and where it came from.
struct StoreChoice {
  std::string path;  // "" when none
  bool user = false;  // the user's store (not $FLASHTUNE_DB)
  std::string note;  // why the user's store was passed over, or ""
  std::string identity;  // path plus the file's inode, size and mtime (changes when re-tuned), or the refusal
};
StoreChoice store_for(const std::string& device);

// $FLASHTUNE_TABLES: whether a lookup reads the committed tables (configs/generated/dispatch.hpp, compiled in).
// Unset, "" or "on": yes (after the store); "off": no, as on a GPU with no table: the store ($FLASHTUNE_DB or
// the user's), then the family's default. It stands for an untabled GPU on a tabled one (issue 36's first-use
// measurement: experiments/autotune_first_use.py). Any other value throws std::invalid_argument, one line.
bool committed_tables_on();

// choose() over store_for's store. A $FLASHTUNE_DB store that cannot be read throws (the call fails, as
// before); the user's store falls back to the tables with a note. A pick from the user's store has
// source "user" ($FLASHTUNE_DB's: "db").
Pick choose_with_store(const TableSet& ts, const Query& q, const StoreChoice& store);

}  // namespace flashtune::rt
