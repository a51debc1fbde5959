// The one way to start a process (process/subprocess.hpp): an exit code, a signal, a timeout
// and a missing executable each reported as such; captured streams complete however much the child writes;
// waits that a signal interrupts go on; the child holds no descriptor of ours beyond 0, 1 and 2. Then the
// worker client on it, with a script for a worker: answers, a death (exit code, signal, last stderr line),
// a timeout, a malformed reply and a missing worker, each as the sweep has always seen them.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/util.hpp"
#include "process/subprocess.hpp"
#include "tuner/sweep/worker_client.hpp"

using namespace flashtune;

namespace {

double elapsed_s(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(Subprocess, ExitCodeIsReported) {
  const ProcessResult r = run_process({"/bin/sh", "-c", "exit 3"});
  EXPECT_EQ(r.status.code, 3);
  EXPECT_EQ(r.status.signal, 0);
  EXPECT_FALSE(r.status.timed_out);
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.describe(), "exit code 3");
  EXPECT_TRUE(run_process({"/bin/sh", "-c", "exit 0"}).status.ok());
}

TEST(Subprocess, SignalIsReported) {
  const ProcessResult r = run_process({"/bin/sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(r.status.signal, SIGTERM);
  EXPECT_EQ(r.status.code, -1);
  EXPECT_FALSE(r.status.timed_out);
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.describe(), "killed by signal " + std::to_string(SIGTERM));
}

TEST(Subprocess, TimeoutKillsTheChild) {
  const auto t0 = std::chrono::steady_clock::now();
  ProcessOptions o;
  o.timeout_s = 0.3;
  const ProcessResult r = run_process({"/bin/sleep", "30"}, o);
  EXPECT_TRUE(r.status.timed_out);
  EXPECT_EQ(r.status.signal, SIGKILL);
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.describe(), "no end within 0.3 s; killed");
  EXPECT_GE(elapsed_s(t0), 0.3);
  EXPECT_LT(elapsed_s(t0), 10.0);
}

TEST(Subprocess, TimeoutWhileCapturing) {  // the deadline holds while the streams stay open and quiet
  const auto t0 = std::chrono::steady_clock::now();
  ProcessOptions o;
  o.timeout_s = 0.3;
  o.capture_stdout = o.capture_stderr = true;
  const ProcessResult r = run_process({"/bin/sh", "-c", "echo started; exec sleep 30"}, o);
  EXPECT_TRUE(r.status.timed_out);
  EXPECT_EQ(r.out, "started\n");
  EXPECT_LT(elapsed_s(t0), 10.0);
}

TEST(Subprocess, MissingExecutableThrowsSpawnError) {
  for (bool search_path : {false, true}) {
    ProcessOptions o;
    o.search_path = search_path;
    try {
      run_process({search_path ? "flashtune-no-such-program" : "/nonexistent/flashtune-no-such-program"}, o);
      ADD_FAILURE() << "a missing executable started";
    } catch (const SpawnError& e) {
      EXPECT_EQ(e.error, ENOENT);
      EXPECT_NE(std::string(e.what()).find("flashtune-no-such-program"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Subprocess::spawn({}), std::invalid_argument);
}

TEST(Subprocess, SearchPathFindsAProgramByName) {
  ProcessOptions o;
  o.search_path = true;
  o.capture_stdout = true;
  const ProcessResult r = run_process({"sh", "-c", "echo found"}, o);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.out, "found\n");
}

TEST(Subprocess, ArgumentsAreNotParsedByAShell) {
  ProcessOptions o;
  o.capture_stdout = true;
  const std::string hostile = "a b; echo injected $(id) `id` > x";
  const ProcessResult r = run_process({"/bin/sh", "-c", "printf '%s|' \"$@\"", "sh", hostile, "*"}, o);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.out, hostile + "|*|");
}

TEST(Subprocess, CapturesBothStreamsInFull) {
  ProcessOptions o;
  o.capture_stdout = o.capture_stderr = true;
  // 1 MiB on each stream, stderr first: far past a pipe's 64 KiB, so reading one stream only would deadlock.
  const ProcessResult r = run_process(
      {"/bin/sh", "-c", "head -c 1048576 /dev/zero >&2; head -c 1048576 /dev/zero; echo done >&2; exit 5"}, o);
  EXPECT_EQ(r.status.code, 5);
  EXPECT_EQ(r.out.size(), 1048576u);
  EXPECT_EQ(r.err.size(), 1048576u + 5);
  EXPECT_EQ(r.err.substr(r.err.size() - 5), "done\n");
}

TEST(Subprocess, AGrandchildHoldingThePipeIsNotWaitedFor) {
  const auto t0 = std::chrono::steady_clock::now();
  ProcessOptions o;
  o.capture_stdout = true;
  const ProcessResult r = run_process({"/bin/sh", "-c", "echo parent; sleep 5 & exit 0"}, o);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.out, "parent\n");
  EXPECT_LT(elapsed_s(t0), 4.0);  // not the grandchild's 5 s
}

TEST(Subprocess, PipesBothWays) {
  SpawnOptions io;
  io.in = Redirect::pipe();
  io.out = Redirect::pipe();
  Subprocess cat = Subprocess::spawn({"/bin/cat"}, io);
  ASSERT_TRUE(cat.running());
  const std::string line = "hello worker\n";
  ASSERT_EQ(write(cat.stdin_fd(), line.data(), line.size()), (ssize_t)line.size());
  cat.close_stdin();  // EOF: cat ends
  std::string got;
  char buf[256];
  for (ssize_t n; (n = read(cat.stdout_fd(), buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ASSERT_GT(n, 0);
    got.append(buf, (size_t)n);
  }
  EXPECT_EQ(got, line);
  const ExitStatus s = cat.wait();
  EXPECT_TRUE(s.ok());
  EXPECT_FALSE(cat.running());
  EXPECT_EQ(cat.wait().code, 0);  // reaped once, reported again
}

TEST(Subprocess, WaitForReportsARunningChildThenKillEndsIt) {
  Subprocess p = Subprocess::spawn({"/bin/sleep", "30"});
  EXPECT_FALSE(p.wait_for(0.05).has_value());
  EXPECT_FALSE(p.try_wait().has_value());
  EXPECT_TRUE(p.running());
  p.kill(SIGKILL);
  const ExitStatus s = p.wait();
  EXPECT_EQ(s.signal, SIGKILL);
  p.kill(SIGKILL);  // reaped: a no-op, never a signal to a recycled pid
}

TEST(Subprocess, DestroyingARunningChildKillsAndReapsIt) {
  pid_t pid;
  {
    Subprocess p = Subprocess::spawn({"/bin/sleep", "30"});
    pid = p.pid();
    Subprocess moved = std::move(p);  // the moved-from one owns nothing
    EXPECT_FALSE(p.running());
    EXPECT_TRUE(moved.running());
  }
  errno = 0;
  EXPECT_EQ(::kill(pid, 0), -1);  // neither running nor a zombie of ours
  EXPECT_EQ(errno, ESRCH);
}

TEST(Subprocess, NewFileStreamIsPrivateAndNeverExisting) {
  const std::string dir = make_private_tmpdir("flashtune-subprocess-test");
  const std::string path = dir + "/err.log";
  SpawnOptions o;
  o.err = Redirect::new_file(path);
  EXPECT_EQ(Subprocess::spawn({"/bin/sh", "-c", "echo to-the-log >&2"}, o).wait().code, 0);
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(text, "to-the-log\n");
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  try {  // O_EXCL: an existing file (or a planted link) is refused, not written through
    Subprocess::spawn({"/bin/true"}, o);
    ADD_FAILURE() << "an existing log file was reused";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.error, EEXIST);
  }
  std::filesystem::remove_all(dir);
}

TEST(Subprocess, ChildGetsNoDescriptorBeyondItsStreams) {
  int leaky[2];
  ASSERT_EQ(pipe(leaky), 0);  // no O_CLOEXEC: what a careless library might hold
  const std::string fd = std::to_string(leaky[1]);
  const ProcessResult r = run_process({"/bin/sh", "-c", "test -e /proc/self/fd/" + fd});
  close(leaky[0]);
  close(leaky[1]);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  EXPECT_EQ(r.status.code, 1) << "fd " << fd << " reached the child";
#else
  GTEST_SKIP() << "posix_spawn_file_actions_addclosefrom_np needs glibc 2.34";
#endif
}

namespace {
void on_alarm(int) {}
}  // namespace

TEST(Subprocess, WaitsSurviveSignals) {
  struct sigaction sa = {}, old_sa;
  sa.sa_handler = on_alarm;  // no SA_RESTART: every blocking call sees EINTR
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old_sa), 0);
  itimerval every_ms = {{0, 1000}, {0, 1000}}, off = {}, old_timer;
  ASSERT_EQ(setitimer(ITIMER_REAL, &every_ms, &old_timer), 0);
  ProcessOptions o;
  o.capture_stdout = true;
  const ProcessResult captured = run_process({"/bin/sh", "-c", "sleep 0.2; echo late"}, o);
  const ProcessResult plain = run_process({"/bin/sh", "-c", "sleep 0.2; exit 4"});
  o.timeout_s = 20;
  const ProcessResult timed = run_process({"/bin/sh", "-c", "sleep 0.2; exit 6"}, o);
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old_sa, nullptr);
  EXPECT_TRUE(captured.status.ok());
  EXPECT_EQ(captured.out, "late\n");
  EXPECT_EQ(plain.status.code, 4);
  EXPECT_EQ(timed.status.code, 6);
  EXPECT_FALSE(timed.status.timed_out);
}

// The worker client on the helper, without a GPU: a shell script stands in for flashtune-worker.
namespace {

struct FakeWorker {
  std::string dir = make_private_tmpdir("flashtune-fake-worker");
  std::string path = dir + "/worker.sh";
  explicit FakeWorker(const std::string& body) {
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  ~FakeWorker() { std::filesystem::remove_all(dir); }
};

const nlohmann::json kHello = {{"op", "hello"}};

}  // namespace

TEST(WorkerClient, AnswersComeBackLineByLine) {
  FakeWorker w(R"(test "$1" = 7 || exit 9
while read -r line; do echo '{"status":"ok","n":1}'; done)");
  WorkerClient c(7, w.path);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.request(kHello, 10).value("status", ""), "ok");
  EXPECT_EQ(c.restarts(), 0);
}

TEST(WorkerClient, ADeadWorkerIsCrashedWithItsExitAndLastWords) {
  FakeWorker w("read -r line; echo 'first line' >&2; echo 'last words' >&2; exit 3");
  WorkerClient c(0, w.path);
  const auto r = c.request(kHello, 10);
  EXPECT_EQ(r.value("status", ""), "crashed");
  EXPECT_EQ(r.value("error", ""), "worker died: exit code 3: last words");
  EXPECT_EQ(c.request(kHello, 10).value("status", ""), "crashed");  // a fresh worker for the next request
  EXPECT_EQ(c.restarts(), 1);
}

TEST(WorkerClient, AWorkerKilledBySignalIsCrashed) {
  FakeWorker w("read -r line; kill -SEGV $$");
  WorkerClient c(0, w.path);
  EXPECT_EQ(c.request(kHello, 10).value("error", ""), "worker died: killed by signal " + std::to_string(SIGSEGV));
}

TEST(WorkerClient, ASilentWorkerTimesOutAndIsReplaced) {
  FakeWorker w("read -r line; exec sleep 30");
  WorkerClient c(0, w.path);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = c.request(kHello, 0.3);
  EXPECT_EQ(r.value("status", ""), "timeout");
  EXPECT_LT(elapsed_s(t0), 5.0);
  EXPECT_EQ(c.request(kHello, 0.3).value("status", ""), "timeout");
  EXPECT_EQ(c.restarts(), 1);
}

TEST(WorkerClient, AMalformedReplyIsCrashed) {
  FakeWorker w("read -r line; echo 'not json'; exec sleep 30");
  WorkerClient c(0, w.path);
  EXPECT_EQ(c.request(kHello, 10).value("error", ""), "worker wrote a malformed reply: not json");
}

TEST(WorkerClient, AMissingWorkerCannotStart) {
  // Its private log folder (under $TMPDIR) goes with it, the log the failed start made included.
  const std::string tmp = make_private_tmpdir("flashtune-worker-tmpdir");
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  setenv("TMPDIR", tmp.c_str(), 1);
  {
    WorkerClient c(0, "/nonexistent/flashtune-worker");
    for (int i = 0; i < 2; ++i) {  // twice: each start a log of its own
      try {
        c.request(kHello, 1);
        ADD_FAILURE() << "a missing worker started";
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(std::string(e.what()), "cannot start worker '/nonexistent/flashtune-worker': No such file or directory");
      }
    }
    EXPECT_FALSE(std::filesystem::is_empty(tmp));  // the folder is there while the client lives
  }
  if (old) setenv("TMPDIR", saved.c_str(), 1);
  else unsetenv("TMPDIR");
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp)) left.push_back(e.path().string());
  EXPECT_TRUE(left.empty()) << left.size() << " left behind, first " << (left.empty() ? "" : left[0]);
  std::filesystem::remove_all(tmp);
}
