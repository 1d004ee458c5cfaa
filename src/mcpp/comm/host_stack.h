// Host stack traces for hang forensics (issue 33): on SIGUSR1, and on a watchdog timeout, every rank dumps its flight
// recorder together with the stack of its main thread (the training thread), so `mcpp debug hang` can show where the
// host code of each rank is (in a collective's wait, in an injected sleep, in a data loader, ...).
//
// Contract:
//   - install_host_stack_capture() is called once, from the main thread, before the hang could happen (the CLI does it
//     in multi-rank runs). It remembers the main thread, calls backtrace() once (glibc loads libgcc's unwinder on the
//     first call, which allocates: done here, never in a handler), and installs a handler for the capture signal
//     (SIGRTMIN + 5, SA_RESTART: an interrupted system call resumes).
//   - capture_main_thread_stack(timeout) runs on any other thread (the watchdog, the SIGUSR1 watcher): it signals the
//     main thread with pthread_kill; the main thread's handler only calls backtrace() into a static array and stores
//     the frame count (an atomic) — no allocation, no locks, no I/O. The caller waits up to `timeout` for it, then
//     symbolizes the addresses with backtrace_symbols (on its own thread, where allocating is fine). Names come from
//     the dynamic symbol table: the mcpp executable is linked with -rdynamic (ENABLE_EXPORTS); static functions and
//     inlined frames show as module+offset only. Demangling is left to the reader (tools/hang_analysis.cpp).
//   - Limits (documented in docs/DEBUGGING.md): only the main thread's stack (the watchdog's and MPI's progress
//     threads are not walked); a main thread that has the signal blocked, or is stuck inside the kernel
//     uninterruptibly, does not answer within the timeout (the dump then says "captured": false); backtrace() from a
//     signal handler is not formally async-signal-safe (it is in practice once primed, which install does).
//   - SignalDumper: while alive, SIGUSR1 makes this process write its flight recorder + main-thread stack to
//     `dump_path` (the watchdog's rank_<r>.json: schema comm/flight_recorder.h plus "host_stacks"), reason "SIGUSR1".
//     The handler writes one byte to a self-pipe; a watcher thread does the dump. The process keeps running.
//     mpirun forwards SIGUSR1 to every rank (`kill -USR1 <mpirun pid>`); `mcpp launch` forwards it to its workers.
#pragma once
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

namespace mcpp::comm {

class FlightRecorder;

void install_host_stack_capture();
bool host_stack_capture_installed();
// {"thread": "main", "captured": bool, "frames": [backtrace_symbols lines, innermost first], "capture_frames": K (the
// innermost K frames are the capture's own: the handler and the signal trampoline)}; "captured": false with no frames
// when not installed or the main thread did not answer within timeout_seconds.
nlohmann::json capture_main_thread_stack(double timeout_seconds);
// [capture_main_thread_stack(...)] when installed, else [] (the dumps' "host_stacks").
nlohmann::json host_stacks_for_dump();

class SignalDumper {
 public:
  SignalDumper(std::shared_ptr<FlightRecorder> recorder, std::string dump_path);
  ~SignalDumper();
  SignalDumper(const SignalDumper&) = delete;
  SignalDumper& operator=(const SignalDumper&) = delete;

 private:
  void loop();
  std::shared_ptr<FlightRecorder> rec_;
  std::string path_;
  int stop_fd_[2] = {-1, -1};  // the destructor wakes the watcher
  std::thread thread_;
};

}  // namespace mcpp::comm
