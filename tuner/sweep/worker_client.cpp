#include "tuner/sweep/worker_client.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "core/util.hpp"

extern char** environ;

namespace flashtune {

std::string default_worker_path() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "flashtune-worker";
  std::string self(buf, n);
  return self.substr(0, self.rfind('/') + 1) + "flashtune-worker";
}

WorkerClient::WorkerClient(int device, std::string path)
    : device_(device), path_(path.empty() ? default_worker_path() : std::move(path)) {
  signal(SIGPIPE, SIG_IGN);  // a dead worker must surface as an error, not kill us
}

WorkerClient::~WorkerClient() {
  stop();
  if (!log_dir_.empty()) rmdir(log_dir_.c_str());
}

void WorkerClient::start() {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) throw std::runtime_error(std::string("pipe: ") + strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  // Never a predictable shared path: a private folder, and a new file that is not a link.
  if (log_dir_.empty()) log_dir_ = make_private_tmpdir("flashtune-worker");
  log_path_ = log_dir_ + "/worker-" + std::to_string(starts_) + ".log";
  unlink(log_path_.c_str());
  posix_spawn_file_actions_addopen(&fa, 2, log_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  for (int fd : {to[0], to[1], from[0], from[1]}) posix_spawn_file_actions_addclose(&fa, fd);
  std::string dev = std::to_string(device_);
  char* argv[] = {(char*)path_.c_str(), (char*)dev.c_str(), nullptr};
  int rc = posix_spawn(&pid_, path_.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  if (rc != 0) {
    close(to[1]);
    close(from[0]);
    pid_ = -1;
    throw std::runtime_error("cannot start worker '" + path_ + "': " + strerror(rc));
  }
  to_fd_ = to[1];
  from_fd_ = from[0];
  fcntl(to_fd_, F_SETFD, FD_CLOEXEC);
  fcntl(from_fd_, F_SETFD, FD_CLOEXEC);
  pending_.clear();
  if (starts_++ > 0) ++restarts_;
}

std::string WorkerClient::log_tail() const {
  const int fd = open(log_path_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  FILE* f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return "";
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  fclose(f);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  auto nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);  // the last line
}

void WorkerClient::stop() {
  if (pid_ <= 0) return;
  struct RemoveLog {
    std::string path;
    ~RemoveLog() { unlink(path.c_str()); }
  } remove_log{log_path_};
  close(to_fd_);  // EOF: a healthy worker exits by itself
  close(from_fd_);
  to_fd_ = from_fd_ = -1;
  // Give it a moment, then make sure: a worker stuck in a kernel ignores EOF.
  for (int i = 0; i < 50; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    usleep(20000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

nlohmann::json WorkerClient::request(const nlohmann::json& msg, double timeout_s) {
  if (pid_ <= 0) start();
  std::string line = msg.dump() + "\n";
  for (size_t off = 0; off < line.size();) {
    ssize_t n = write(to_fd_, line.data() + off, line.size() - off);
    if (n <= 0) {
      stop();
      return {{"status", "crashed"}, {"error", "worker exited before the request was sent"}};
    }
    off += (size_t)n;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    auto nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string reply = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      try {
        auto j = nlohmann::json::parse(reply);
        if (j.value("status", "") == "crashed") stop();  // it exits; reap it
        return j;
      } catch (const std::exception&) {
        stop();
        return {{"status", "crashed"}, {"error", "worker wrote a malformed reply: " + reply.substr(0, 200)}};
      }
    }
    double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      kill(pid_, SIGKILL);
      stop();
      return {{"status", "timeout"}, {"error", "no answer within " + std::to_string((int)timeout_s) + " s; worker killed"}};
    }
    pollfd pfd{from_fd_, POLLIN, 0};
    int rc = poll(&pfd, 1, (int)std::min(left * 1000.0 + 1, 1000.0));
    if (rc < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + strerror(errno));
    if (rc <= 0) continue;
    char buf[65536];
    ssize_t n = read(from_fd_, buf, sizeof buf);
    if (n <= 0) {
      int status = 0;
      pid_t pid = pid_;
      close(to_fd_);
      close(from_fd_);
      to_fd_ = from_fd_ = -1;
      waitpid(pid, &status, 0);
      pid_ = -1;
      std::string why = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                            : "exit code " + std::to_string(WEXITSTATUS(status));
      std::string last = log_tail();
      unlink(log_path_.c_str());
      if (!last.empty()) why += ": " + last;
      return {{"status", "crashed"}, {"error", "worker died: " + why}};
    }
    pending_.append(buf, (size_t)n);
  }
}

}  // namespace flashtune
