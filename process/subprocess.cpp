#include "process/subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <system_error>
#include <thread>
#include <utility>

extern char** environ;

namespace flashtune {

namespace {

using Clock = std::chrono::steady_clock;

// Waiting for a child without a descriptor to poll: waitpid(WNOHANG) at growing intervals, at most this far
// apart (the worker client's shutdown checked every 20 ms before this helper).
constexpr double kMaxPollStep_s = 0.02;
// Reads of at most 64 KiB each that run_process makes after the child ended: a full pipe's worth many times over.
constexpr int kDrainRounds = 64;

double seconds_until(Clock::time_point t) { return std::chrono::duration<double>(t - Clock::now()).count(); }

Clock::time_point deadline_after(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);  // never retried on EINTR: on Linux the descriptor is gone either way
  fd = -1;
}

ExitStatus decode(int wstatus) {
  ExitStatus s;
  if (WIFEXITED(wstatus)) s.code = WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) s.signal = WTERMSIG(wstatus);
  return s;
}

// Closes what it holds unless released: the pipes of a spawn that failed half-way.
struct PipeEnds {
  int fd[2] = {-1, -1};
  ~PipeEnds() {
    close_fd(fd[0]);
    close_fd(fd[1]);
  }
  int release(int i) { return std::exchange(fd[i], -1); }
};

struct FileActions {
  posix_spawn_file_actions_t fa;
  FileActions() { posix_spawn_file_actions_init(&fa); }
  ~FileActions() { posix_spawn_file_actions_destroy(&fa); }
};

// Sets up one of the child's streams (target 0, 1 or 2); a pipe's ends go to `ends`.
void redirect(FileActions& actions, const Redirect& s, int target, PipeEnds& ends) {
  const bool child_reads = target == 0;
  switch (s.to) {
    case Redirect::To::inherit:
      return;
    case Redirect::To::null:
      posix_spawn_file_actions_addopen(&actions.fa, target, "/dev/null", child_reads ? O_RDONLY : O_WRONLY, 0);
      return;
    case Redirect::To::new_file:
      posix_spawn_file_actions_addopen(&actions.fa, target, s.path.c_str(),
                                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
      return;
    case Redirect::To::pipe:
      // O_CLOEXEC from the start: a child another thread spawns meanwhile must not inherit either end.
      if (pipe2(ends.fd, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
      posix_spawn_file_actions_adddup2(&actions.fa, ends.fd[child_reads ? 0 : 1], target);
      return;
  }
}

}  // namespace

SpawnError::SpawnError(std::string prog, int err)
    : std::runtime_error("cannot start '" + prog + "': " + std::strerror(err)), program(std::move(prog)), error(err) {}

std::string ExitStatus::describe() const {
  if (timed_out) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "no end within %g s; killed", timeout_s);
    return buf;
  }
  if (signal != 0) return "killed by signal " + std::to_string(signal);
  if (code >= 0) return "exit code " + std::to_string(code);
  return "ended with an unknown status";  // reaped by someone else
}

Subprocess Subprocess::spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) throw std::invalid_argument("Subprocess::spawn: an empty argv");
  FileActions actions;
  PipeEnds in, out, err;
  redirect(actions, options.in, 0, in);
  redirect(actions, options.out, 1, out);
  redirect(actions, options.err, 2, err);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Nothing but 0, 1 and 2: a descriptor some library opened without O_CLOEXEC stays ours.
  posix_spawn_file_actions_addclosefrom_np(&actions.fa, 3);
#endif
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  // glibc reports a failed exec or redirection here (the child shares our memory until it execs).
  const int rc = options.search_path ? posix_spawnp(&pid, args[0], &actions.fa, nullptr, args.data(), environ)
                                     : posix_spawn(&pid, args[0], &actions.fa, nullptr, args.data(), environ);
  if (rc != 0) throw SpawnError(argv[0], rc);
  Subprocess p;
  p.pid_ = pid;
  p.in_fd_ = in.release(1);  // the parent writes the child's stdin, reads its stdout and stderr
  p.out_fd_ = out.release(0);
  p.err_fd_ = err.release(0);
  return p;  // the child's ends close with `in`, `out`, `err`
}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      in_fd_(std::exchange(o.in_fd_, -1)),
      out_fd_(std::exchange(o.out_fd_, -1)),
      err_fd_(std::exchange(o.err_fd_, -1)),
      status_(std::exchange(o.status_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    reset();
    pid_ = std::exchange(o.pid_, -1);
    in_fd_ = std::exchange(o.in_fd_, -1);
    out_fd_ = std::exchange(o.out_fd_, -1);
    err_fd_ = std::exchange(o.err_fd_, -1);
    status_ = std::exchange(o.status_, std::nullopt);
  }
  return *this;
}

Subprocess::~Subprocess() { reset(); }

void Subprocess::reset() noexcept {
  close_fd(in_fd_);
  close_fd(out_fd_);
  close_fd(err_fd_);
  if (running()) {
    ::kill(pid_, SIGKILL);
    int st;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
  status_.reset();
}

void Subprocess::close_stdin() { close_fd(in_fd_); }
void Subprocess::close_stdout() { close_fd(out_fd_); }
void Subprocess::close_stderr() { close_fd(err_fd_); }

void Subprocess::kill(int sig) {
  if (running()) ::kill(pid_, sig);
}

std::optional<ExitStatus> Subprocess::try_wait() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  pid_t r;
  while ((r = waitpid(pid_, &st, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r == 0) return std::nullopt;
  status_ = r == pid_ ? decode(st) : ExitStatus{};  // ECHILD: reaped elsewhere (SIGCHLD ignored)
  return status_;
}

std::optional<ExitStatus> Subprocess::wait_for(double seconds) {
  const auto deadline = deadline_after(seconds > 0 ? seconds : 1e-9);
  double step = 0.001;
  while (true) {
    if (auto s = try_wait()) return s;
    const double left = seconds_until(deadline);
    if (left <= 0) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(step, left)));  // resumes after EINTR
    step = std::min(step * 2, kMaxPollStep_s);
  }
}

ExitStatus Subprocess::wait() {
  if (status_ || pid_ <= 0) return status_.value_or(ExitStatus{});
  int st = 0;
  pid_t r;
  while ((r = waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {
  }
  status_ = r == pid_ ? decode(st) : ExitStatus{};
  return *status_;
}

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  SpawnOptions so;
  so.search_path = options.search_path;
  if (options.capture_stdout) so.out = Redirect::pipe();
  if (options.capture_stderr) so.err = Redirect::pipe();
  Subprocess child = Subprocess::spawn(argv, so);
  const auto deadline = deadline_after(options.timeout_s);
  ProcessResult result;

  // Read the captured streams until both are at EOF, or the child has ended and they are quiet (a grandchild
  // that holds them open is not waited for), or the deadline. Both at once: a child blocked writing a full
  // stderr pipe must not wait on us reading its stdout.
  auto read_ready = [&](int wait_ms) {  // one poll and a read from each ready stream; false: nothing was ready
    pollfd fds[2];
    std::string* sinks[2];
    int n = 0;
    for (auto [fd, sink] : {std::pair{child.stdout_fd(), &result.out}, std::pair{child.stderr_fd(), &result.err}}) {
      if (fd < 0) continue;
      fds[n] = {fd, POLLIN, 0};
      sinks[n++] = sink;
    }
    const int rc = poll(fds, n, wait_ms);
    if (rc < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (rc <= 0) return rc < 0;  // EINTR: try again
    for (int i = 0; i < n; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, (size_t)got);
      } else if (got == 0 || errno != EINTR) {  // EOF, or an error: this stream is done
        if (fds[i].fd == child.stdout_fd()) child.close_stdout();
        else child.close_stderr();
      }
    }
    return true;
  };
  auto capturing = [&] { return child.stdout_fd() >= 0 || child.stderr_fd() >= 0; };
  while (capturing()) {
    const double left = seconds_until(deadline);
    if (left <= 0) break;
    // Wake at least every kMaxPollStep_s to notice a child that ended while a grandchild holds the pipes.
    const int wait_ms = (int)std::ceil(std::min(left, kMaxPollStep_s) * 1000);
    if (read_ready(wait_ms)) continue;
    if (child.try_wait()) {
      // What it wrote before it ended (bounded: a grandchild may go on writing).
      for (int round = 0; round < kDrainRounds && capturing() && read_ready(0); ++round) {
      }
      break;
    }
  }
  child.close_stdout();
  child.close_stderr();

  std::optional<ExitStatus> status;
  if (deadline == Clock::time_point::max()) status = child.wait();
  else status = child.wait_for(std::max(seconds_until(deadline), 0.0));
  if (!status) {
    child.kill(SIGKILL);
    status = child.wait();
    status->timed_out = true;
    status->timeout_s = options.timeout_s;
  }
  result.status = *status;
  return result;
}

}  // namespace flashtune
