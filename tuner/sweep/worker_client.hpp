// The parent's side of the worker: spawns `flashtune-worker`, sends one JSON request at a
// time, and turns a dead worker into "crashed" and a silent one into "timeout" (killing it).
// The next request starts a fresh worker.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "process/subprocess.hpp"

namespace flashtune {

class WorkerClient {
 public:
  // threads > 0: the worker's CPU thread budget (`flashtune-worker DEVICE --threads N`); 0: every core.
  explicit WorkerClient(int device_ordinal, std::string worker_path = "", int threads = 0);
  ~WorkerClient();
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  // Always returns an object with "status".
  nlohmann::json request(const nlohmann::json& msg, double timeout_s);
  int restarts() const { return restarts_; }
  // Counts starts after the first: how often a crash or hang cost a worker.

 private:
  void start();
  void stop();
  std::string log_tail() const;
  int device_;
  std::string path_;
  int threads_;
  Subprocess worker_;      // its stdin and stdout are pipes
  std::string pending_;   // bytes read past the last newline
  std::string log_dir_;   // private (0700, mkdtemp under $TMPDIR), made at the first start, removed at the end
  std::string log_path_;  // the worker's stderr in log_dir_ (O_EXCL | O_NOFOLLOW): its last lines explain a death
  int starts_ = 0, restarts_ = 0;
};

// The worker binary next to the running executable.
std::string default_worker_path();

}  // namespace flashtune
