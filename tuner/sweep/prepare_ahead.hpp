// Problems prepared once and ahead (issue 33): a thread of the tuner computes each problem's inputs and float64
// reference (worker/prepared.hpp: prepare_host, the worker's own function) in the order the sweep starts the
// problems, a few problems ahead of the GPUs, into a file per problem in a private folder (mode 0700, under
// $TMPDIR); every worker that takes a problem's candidates reads its file (validated: size, header, problem
// identity) instead of computing the reference itself, and waits only for what is not done yet. Where a problem
// cannot be prepared here (varlen, paged, or a failure), wait() gives "" and the worker prepares it as before.
// A problem that no worker has asked for yet (nor is one the GPUs start with) is computed at kBackgroundNice
// below the workers, whose validations its GPU waits for.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/problem.hpp"
#include "worker/inputs.hpp"

namespace flashtune {

// How far below the workers a problem that no worker has asked for yet is prepared (nice units).
inline constexpr int kBackgroundNice = 10;

class PrepareAhead {
 public:
  // `problems` in the order the sweep starts them; `lookahead`: how many problems past the furthest one a
  // worker asked for (at the start: the first `lookahead`) the thread may prepare; `threads`: its CPU threads
  // (0: every core). The thread starts here.
  PrepareAhead(std::vector<Problem> problems, uint64_t seed, long long max_rows, int lookahead, int threads = 0);
  ~PrepareAhead();  // stops the thread (after the problem it is on) and removes the folder
  PrepareAhead(const PrepareAhead&) = delete;
  PrepareAhead& operator=(const PrepareAhead&) = delete;

  // The file of `p` (the first of the problems equal to it that is not done), once written, waiting for it;
  // "" when there is none to wait for (not preparable here, failed, done). `waited_ms`: the time spent waiting.
  std::string wait(const Problem& p, double* waited_ms = nullptr);
  // Nothing to wait for: problem i's file is written, or will not be.
  bool ready(size_t i) const;
  // Problem i is finished: its file is removed.
  void done(size_t i);

  const std::string& dir() const { return dir_; }
  // Problems the thread prepared, and its time on them in ms.
  int prepared() const;
  double prepare_ms() const;
  // Why problem i has no file ("" when it has one, or has not been tried).
  std::string failure(size_t i) const;

 private:
  enum class State { queued, computing, ready, failed, unpreparable, removed };
  void run();
  std::string path(size_t i) const;

  const std::vector<Problem> problems_;
  const uint64_t seed_;
  const long long max_rows_;
  const int lookahead_, threads_;
  std::string dir_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;
  std::vector<std::string> why_;
  long long frontier_ = -1;  // the furthest problem a worker asked for
  bool stop_ = false;
  int prepared_ = 0;
  double prepare_ms_ = 0;

  // The thread's own: the inputs the last problem used, by (stream, n, dtype, distribution, scale): the problems
  // of one sweep read the same streams (element i is a function of the stream and i alone).
  using InputKey = std::tuple<uint64_t, size_t, int, int, double>;
  std::map<InputKey, std::shared_ptr<HostTensor>> inputs_;

  std::thread thread_;
};

}  // namespace flashtune
