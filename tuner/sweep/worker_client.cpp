#include "tuner/sweep/worker_client.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "core/util.hpp"

namespace flashtune {

std::string default_worker_path() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "flashtune-worker";
  std::string self(buf, n);
  return self.substr(0, self.rfind('/') + 1) + "flashtune-worker";
}

WorkerClient::WorkerClient(int device, std::string path, int threads)
    : device_(device), path_(path.empty() ? default_worker_path() : std::move(path)), threads_(threads) {
  signal(SIGPIPE, SIG_IGN);  // a dead worker must surface as an error, not kill us
}

WorkerClient::~WorkerClient() {
  stop();
  // The last log too: a worker that could not start (its child made the log, then exec failed) left it.
  if (!log_path_.empty()) unlink(log_path_.c_str());
  if (!log_dir_.empty()) rmdir(log_dir_.c_str());
}

void WorkerClient::start() {
  // Never a predictable shared path: a private folder, and a new file that is not a link.
  if (log_dir_.empty()) log_dir_ = make_private_tmpdir("flashtune-worker");
  log_path_ = log_dir_ + "/worker-" + std::to_string(starts_) + ".log";
  unlink(log_path_.c_str());
  SpawnOptions io;
  io.in = Redirect::pipe();
  io.out = Redirect::pipe();
  io.err = Redirect::new_file(log_path_);
  try {
    std::vector<std::string> argv = {path_, std::to_string(device_)};
    if (threads_ > 0) argv.insert(argv.end(), {"--threads", std::to_string(threads_)});
    worker_ = Subprocess::spawn(argv, io);
  } catch (const SpawnError& e) {
    throw std::runtime_error("cannot start worker '" + path_ + "': " + strerror(e.error));
  }
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
  if (!worker_.running()) return;
  struct RemoveLog {
    std::string path;
    ~RemoveLog() { unlink(path.c_str()); }
  } remove_log{log_path_};
  worker_.close_stdin();  // EOF: a healthy worker exits by itself
  worker_.close_stdout();
  // Give it a moment, then make sure: a worker stuck in a kernel ignores EOF.
  if (!worker_.wait_for(1.0)) {
    worker_.kill(SIGKILL);
    worker_.wait();
  }
  worker_ = Subprocess();
}

nlohmann::json WorkerClient::request(const nlohmann::json& msg, double timeout_s) {
  if (!worker_.running()) start();
  std::string line = msg.dump() + "\n";
  for (size_t off = 0; off < line.size();) {
    ssize_t n = write(worker_.stdin_fd(), line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
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
      worker_.kill(SIGKILL);
      stop();
      return {{"status", "timeout"}, {"error", "no answer within " + std::to_string((int)timeout_s) + " s; worker killed"}};
    }
    pollfd pfd{worker_.stdout_fd(), POLLIN, 0};
    int rc = poll(&pfd, 1, (int)std::min(left * 1000.0 + 1, 1000.0));
    if (rc < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + strerror(errno));
    if (rc <= 0) continue;
    char buf[65536];
    ssize_t n = read(worker_.stdout_fd(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      worker_.close_stdin();
      worker_.close_stdout();
      std::string why = worker_.wait().describe();  // "exit code N" or "killed by signal N"
      worker_ = Subprocess();
      std::string last = log_tail();
      unlink(log_path_.c_str());
      if (!last.empty()) why += ": " + last;
      return {{"status", "crashed"}, {"error", "worker died: " + why}};
    }
    pending_.append(buf, (size_t)n);
  }
}

}  // namespace flashtune
