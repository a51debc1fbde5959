// flashtune devices: the CUDA device the worker sees.
#include "tuner/cli/verbs.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "tuner/cli/args.hpp"
#include "tuner/sweep/sweep.hpp"
#include "user_store.hpp"

using nlohmann::json;

namespace flashtune::cli {

int cmd_devices(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::puts("usage: flashtune devices [--device N] [--slug | --store | --json]\nDescribes the CUDA device the worker sees; --slug prints only\n"
              "its report folder name (\"nvidia-h100-80gb-hbm3\"); --store only the path of the user's store for it,\n"
              "which the runtime reads with no environment variable ($XDG_CACHE_HOME/flashtune/<slug>.db, else\n"
              "~/.cache/flashtune/<slug>.db; flashtune.tune fills it); --json all of it as one JSON object\n"
              "(index, name, arch, slug, store, sm_count, memory_bytes, driver_version). Exit 1 without a GPU.");
    return 0;
  }
  Args a = parse(argc, argv, {"device"}, {"slug", "store", "json"});
  no_positional(a, "devices");
  if (a.has("slug") + a.has("store") + a.has("json") > 1) throw UsageError("give one of --slug, --store and --json");
  RunOptions o = run_options(a);
  GpuSession s(o);
  if (!s.has_gpu()) {
    std::printf("no GPU found: %s\n", s.no_gpu_reason().c_str());
    return 1;
  }
  const DeviceInfo& d = s.device();
  if (a.has("slug")) {
    std::printf("%s\n", rt::device_slug(d.name).c_str());
    return 0;
  }
  if (a.has("json")) {
    const json j = {{"index", o.device},         {"name", d.name},
                    {"arch", d.arch},            {"slug", rt::device_slug(d.name)},
                    {"store", rt::user_store_path(d.name)}, {"sm_count", d.sm_count},
                    {"memory_bytes", d.memory_bytes}, {"driver_version", d.driver_version}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (a.has("store")) {
    const std::string path = rt::user_store_path(d.name);
    if (path.empty()) throw UsageError("no user's store: neither XDG_CACHE_HOME nor HOME is an absolute path");
    std::printf("%s\n", path.c_str());
    return 0;
  }
  std::printf("%d: %s  %s  %d SMs  %.1f GiB  L2 %d MiB  smem/block %d KiB  driver %d\n", o.device, d.name.c_str(),
              d.arch.c_str(), d.sm_count, d.memory_bytes / 1073741824.0, d.l2_bytes >> 20, d.max_smem_optin >> 10,
              d.driver_version);
  return 0;
}

}  // namespace flashtune::cli
