#include "tuner/sweep/prepare_ahead.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/util.hpp"
#include "worker/prepared.hpp"

namespace flashtune {

PrepareAhead::PrepareAhead(std::vector<Problem> problems, uint64_t seed, long long max_rows, int lookahead, int threads)
    : problems_(std::move(problems)),
      seed_(seed),
      max_rows_(max_rows),
      lookahead_(std::max(1, lookahead)),
      threads_(threads),
      dir_(make_private_tmpdir("flashtune-prepared")),  // 0700: the files are ours and the workers' alone
      state_(problems_.size(), State::queued),
      why_(problems_.size()) {
  for (size_t i = 0; i < problems_.size(); ++i)
    if (!host_preparable(problems_[i])) {
      state_[i] = State::unpreparable;
      why_[i] = "varlen and paged problems are prepared by the worker";
    }
  thread_ = std::thread([this] { run(); });
}

PrepareAhead::~PrepareAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

namespace {
// The calling thread's nice value raised by `by` (Linux: a per-thread attribute, inherited by the threads it
// starts); best effort, a no-op where it fails.
void lower_thread_priority(int by) {
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
  if (errno == 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), std::min(19, now + by));
}
}  // namespace

std::string PrepareAhead::path(size_t i) const { return dir_ + "/problem-" + std::to_string(i) + ".prep"; }

void PrepareAhead::run() {
  for (size_t i = 0; i < problems_.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (long long)i <= frontier_ + lookahead_; });
      if (stop_) return;
      if (state_[i] != State::queued) continue;  // done before its turn, or not preparable here
      state_[i] = State::computing;
    }
    const auto t0 = std::chrono::steady_clock::now();
    // The inputs of the previous problem stay at hand for this one; what it does not read is let go after it.
    const std::map<InputKey, std::shared_ptr<HostTensor>> previous = std::move(inputs_);
    std::map<InputKey, std::shared_ptr<HostTensor>> used;
    const InputSource source = [&](size_t n, uint64_t stream, DType t, const InputDist& dist) {
      const InputKey key{stream, n, (int)t, (int)dist.kind, dist.scale};
      const auto it = previous.find(key);
      std::shared_ptr<HostTensor> h =
          it != previous.end() ? it->second : std::make_shared<HostTensor>(generated_input(n, stream, t, dist, threads_));
      used[key] = h;
      return h;
    };
    State outcome = State::ready;
    std::string why;
    bool urgent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A worker asked for it (one of them waits, or soon will), or it is one the GPUs start with.
      urgent = (long long)i <= frontier_ || (long long)i + 1 < lookahead_;
    }
    // On a thread of its own: one that no worker waits for runs below the workers' priority (its reference's
    // threads, which it starts, inherit that), so that a worker's validation, which its GPU waits for, is not
    // slowed by a reference no GPU needs yet (issue 33: two workers' backward validations took 60 ms each
    // against 32 ms for one, while this thread computed references for 15.8 s of the 28.8 s sweep).
    std::thread compute([&] {
      if (!urgent) lower_thread_priority(kBackgroundNice);
      try {
        write_prepared(path(i), prepare_host(problems_[i], seed_, max_rows_, threads_, {}, source));
      } catch (const std::exception& e) {
        outcome = State::failed;
        why = e.what();
        unlink(path(i).c_str());
        used.clear();  // perhaps what ran out of memory
      }
    });
    compute.join();
    inputs_ = std::move(used);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (state_[i] == State::removed) {
        unlink(path(i).c_str());  // finished while it was being prepared
      } else {
        state_[i] = outcome;
        why_[i] = why;
      }
      prepared_ += outcome == State::ready;
      prepare_ms_ += ms;
    }
    cv_.notify_all();
  }
}

std::string PrepareAhead::wait(const Problem& p, double* waited_ms) {
  if (waited_ms) *waited_ms = 0;
  std::unique_lock<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < problems_.size() && (state_[i] == State::removed || !(problems_[i] == p))) ++i;
  if (i == problems_.size()) return "";
  if ((long long)i > frontier_) {
    frontier_ = (long long)i;
    cv_.notify_all();
  }
  const auto t0 = std::chrono::steady_clock::now();
  cv_.wait(lock, [&] { return stop_ || (state_[i] != State::queued && state_[i] != State::computing); });
  if (waited_ms) *waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return state_[i] == State::ready ? path(i) : "";
}

bool PrepareAhead::ready(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return i >= state_.size() || (state_[i] != State::queued && state_[i] != State::computing);
}

void PrepareAhead::done(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (i >= state_.size()) return;
  if (state_[i] == State::ready) unlink(path(i).c_str());
  // One being prepared is removed by the thread when it is written.
  if (state_[i] != State::unpreparable && state_[i] != State::failed) state_[i] = State::removed;
}

int PrepareAhead::prepared() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prepared_;
}

double PrepareAhead::prepare_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prepare_ms_;
}

std::string PrepareAhead::failure(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return i < why_.size() ? why_[i] : "";
}

}  // namespace flashtune
