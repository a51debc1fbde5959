// Child processes, the one way the project starts them: an argv (never a shell string), the child's
// standard streams inherited, piped, sent to /dev/null or to a new private file, and its end reported as an
// exit code, a signal or a timeout. Every wait survives EINTR; the parent's ends of the pipes are
// close-on-exec and the child gets no descriptor beyond 0, 1 and 2, so one child never holds another's
// pipe open. Users: the worker client (a long-lived child on two pipes), `flashtune report` (make_report.py),
// the experiments' Python baselines (with a timeout) and the tests that run a part of themselves in a fresh
// process. Its own library (flashtune_process), using no other library of ours, so that the runtime's tests
// start their children with it without linking the tuner.
#pragma once
#include <sys/types.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashtune {

// The child could not be started (no such executable, not executable, a redirection that failed).
struct SpawnError : std::runtime_error {
  SpawnError(std::string program, int error);
  std::string program;  // argv[0] as given
  int error;            // the errno value: ENOENT, EACCES, EEXIST (a new_file that exists), ...
};

// How a child ended.
struct ExitStatus {
  int code = -1;          // its exit code when it exited, else -1
  int signal = 0;         // the signal that ended it, else 0
  bool timed_out = false; // run_process killed it (SIGKILL) at its timeout
  double timeout_s = 0;   // that timeout
  bool ok() const { return code == 0; }
  // "exit code 3", "killed by signal 9", "no end within 5 s; killed"
  std::string describe() const;
};

// Where one of the child's standard streams goes.
struct Redirect {
  enum class To { inherit, pipe, null, new_file };
  To to = To::inherit;
  std::string path;  // new_file: created by the child, O_EXCL | O_NOFOLLOW, mode 0600 (never an existing file or link)
  static Redirect pipe() { return {To::pipe, {}}; }
  static Redirect null() { return {To::null, {}}; }
  static Redirect new_file(std::string path) { return {To::new_file, std::move(path)}; }
};

struct SpawnOptions {
  bool search_path = false;  // argv[0] without a '/' is looked up in PATH (execvp's rule)
  Redirect in, out, err;
};

// A started child. Move-only; destroying one that still runs kills it (SIGKILL) and reaps it.
class Subprocess {
 public:
  // Throws SpawnError when the child cannot be started, std::system_error when a pipe cannot be made.
  static Subprocess spawn(const std::vector<std::string>& argv, const SpawnOptions& options = {});

  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  // True from spawn until the child has been reaped (try_wait, wait_for or wait saw it end).
  bool running() const { return pid_ > 0 && !status_; }
  pid_t pid() const { return pid_; }
  // The parent's ends of piped streams, -1 where not piped or closed.
  int stdin_fd() const { return in_fd_; }
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  void close_stdin();  // EOF for the child
  void close_stdout();
  void close_stderr();

  // Sends sig to a child that has not been reaped (never to a recycled pid).
  void kill(int sig);
  // Its end if it has ended (reaping it), else nothing; never blocks.
  std::optional<ExitStatus> try_wait();
  // Waits up to `seconds` for its end; nothing if it still runs then.
  std::optional<ExitStatus> wait_for(double seconds);
  // Waits for its end.
  ExitStatus wait();

 private:
  void reset() noexcept;  // closes the pipes, kills and reaps a running child
  pid_t pid_ = -1;
  int in_fd_ = -1, out_fd_ = -1, err_fd_ = -1;
  std::optional<ExitStatus> status_;
};

struct ProcessOptions {
  bool search_path = false;   // as SpawnOptions::search_path
  double timeout_s = 0;       // > 0: the child is killed (SIGKILL) after this long; 0: no limit
  bool capture_stdout = false;  // else inherited
  bool capture_stderr = false;
};

struct ProcessResult {
  ExitStatus status;
  std::string out, err;  // what the child wrote, where captured
};

// Runs argv to its end (or its timeout), stdin inherited. Throws SpawnError as Subprocess::spawn.
ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

}  // namespace flashtune
