// One test of this gtest binary run in a fresh process, through the project's one way to start a child
// (process/subprocess.hpp): for what must not see this process's state (a driver or NVRTC already loaded, the
// runtime's in-process kernel map). The parent picks the child's part through one environment variable.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "process/subprocess.hpp"

namespace flashtune {

// Runs `test` ("Suite.DISABLED_Name": disabled, so that it is no test of its own) of this binary in a child
// with env_name=env_value, which the parent sets only around the spawn (the child takes the environment as it
// is then); the child's exit code: 0 when the test passed, -1 when it could not start or died on a signal.
inline int run_test_in_child(const std::string& test, const char* env_name, const char* env_value) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  setenv(env_name, env_value, 1);
  Subprocess child;
  try {
    child = Subprocess::spawn({self, "--gtest_filter=" + test, "--gtest_also_run_disabled_tests"});
  } catch (const SpawnError& e) {
    ADD_FAILURE() << e.what();
  }
  unsetenv(env_name);
  return child.pid() > 0 ? child.wait().code : -1;
}

}  // namespace flashtune
