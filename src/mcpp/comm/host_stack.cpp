// Host stacks and the SIGUSR1 dump (contract in host_stack.h).
#include "mcpp/comm/host_stack.h"

#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

constexpr int kMaxFrames = 64;
pthread_t g_main_thread;
std::atomic<bool> g_installed{false};
void* g_frames[kMaxFrames];
std::atomic<int> g_num_frames{-1};  // -1 while a capture is outstanding
std::mutex g_capture_mu;            // one capture at a time
int g_usr1_pipe[2] = {-1, -1};      // SIGUSR1 -> the SignalDumper's watcher
std::atomic<int> g_in_usr1{0};      // a thread is inside on_sigusr1 (the capture waits: no nested handler frames)

int capture_signal() { return SIGRTMIN + 5; }

// On the main thread, in signal context: backtrace() (primed at install) into the static array; nothing else.
void on_capture_signal(int) {
  const int saved = errno;
  g_num_frames.store(backtrace(g_frames, kMaxFrames));
  errno = saved;
}

void on_sigusr1(int) {
  g_in_usr1.fetch_add(1);
  const int saved = errno;
  const char b = 1;
  if (g_usr1_pipe[1] >= 0) {
    const ssize_t ignored = ::write(g_usr1_pipe[1], &b, 1);  // non-blocking; a full pipe already wakes the watcher
    (void)ignored;
  }
  errno = saved;
  g_in_usr1.fetch_sub(1);
}

}  // namespace

void install_host_stack_capture() {
  if (g_installed.exchange(true)) return;
  g_main_thread = pthread_self();
  void* prime[2];
  backtrace(prime, 2);  // loads the unwinder now (it allocates on first use), not in the handler
  struct sigaction sa {};
  sa.sa_handler = on_capture_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(capture_signal(), &sa, nullptr) != 0) fail("host stacks: sigaction failed: {}", std::strerror(errno));
}

bool host_stack_capture_installed() { return g_installed.load(); }

nlohmann::json capture_main_thread_stack(double timeout_seconds) {
  nlohmann::json out{{"thread", "main"}, {"captured", false}, {"frames", nlohmann::json::array()}};
  if (!g_installed.load()) return out;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  int n = -1;
  const bool direct = pthread_equal(pthread_self(), g_main_thread);
  if (direct) {
    n = backtrace(g_frames, kMaxFrames);
  } else {
    // SIGUSR1 is often delivered to the main thread: let its handler return first, so the stack is the interrupted
    // code's and not the handler's (which woke this thread).
    const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (g_in_usr1.load() > 0 && std::chrono::steady_clock::now() < settle)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g_num_frames.store(-1);
    if (pthread_kill(g_main_thread, capture_signal()) != 0) return out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
    while ((n = g_num_frames.load()) < 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (n <= 0) return out;
  char** names = backtrace_symbols(g_frames, n);
  if (!names) return out;
  for (int i = 0; i < n; ++i) out["frames"].push_back(names[i]);
  std::free(names);
  out["captured"] = true;
  // The innermost frames that are the capture itself: this function, or the signal handler and the kernel's signal
  // trampoline (__restore_rt); readers skip them (the frames are kept whole).
  out["capture_frames"] = direct ? 1 : 2;
  return out;
}

nlohmann::json host_stacks_for_dump() {
  nlohmann::json stacks = nlohmann::json::array();
  if (g_installed.load()) stacks.push_back(capture_main_thread_stack(2.0));
  return stacks;
}

SignalDumper::SignalDumper(std::shared_ptr<FlightRecorder> recorder, std::string dump_path)
    : rec_(std::move(recorder)), path_(std::move(dump_path)) {
  if (!rec_) fail("SignalDumper: no flight recorder");
  if (g_usr1_pipe[0] < 0) {
    if (::pipe(g_usr1_pipe) != 0) fail("SignalDumper: pipe failed: {}", std::strerror(errno));
    for (int fd : g_usr1_pipe) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  if (::pipe(stop_fd_) != 0) fail("SignalDumper: pipe failed: {}", std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGUSR1, &sa, nullptr) != 0) fail("SignalDumper: sigaction(SIGUSR1) failed: {}", std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

SignalDumper::~SignalDumper() {
  signal(SIGUSR1, SIG_IGN);  // a late SIGUSR1 must not kill a finishing process
  const char b = 0;
  const ssize_t ignored = ::write(stop_fd_[1], &b, 1);
  (void)ignored;
  if (thread_.joinable()) thread_.join();
  ::close(stop_fd_[0]);
  ::close(stop_fd_[1]);
}

void SignalDumper::loop() {
  for (;;) {
    pollfd fds[2] = {{g_usr1_pipe[0], POLLIN, 0}, {stop_fd_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    char buf[64];
    while (::read(g_usr1_pipe[0], buf, sizeof buf) > 0) {  // coalesce repeated signals into one dump
    }
    try {
      rec_->dump_to_file(path_, "SIGUSR1", {{"host_stacks", host_stacks_for_dump()}});
      fmt::print(stderr, "[rank {}] SIGUSR1: flight recorder and host stack dumped to {}\n", rec_->rank(), path_);
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: [rank {}] SIGUSR1 dump: {}\n", rec_->rank(), e.what());
    }
    std::fflush(stderr);
  }
}

}  // namespace mcpp::comm
