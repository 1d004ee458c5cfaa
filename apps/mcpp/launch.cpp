// mcpp launch --nproc-per-node N [--rdzv-dir DIR] [--rdzv-timeout S] -- <subcommand> [args...]
// The single-node launcher (Megatron users' torchrun): starts N copies of this mcpp running
// `<subcommand> [args...]`, each with MCPP_RANK / MCPP_WORLD_SIZE / MCPP_LOCAL_RANK (and LOCAL_RANK) and
// MCPP_LAUNCH_RDZV = the rendezvous directory, where the ranks find each other (comm/tcp: a loopback TCP
// mesh; with --device cuda, NCCL groups bootstrap over it, GPU = local rank). No MPI needed.
// Exit: 0 when every rank exits 0. The first rank that fails (non-zero exit or a signal) ends the job:
// the others get SIGTERM (SIGKILL 5 s later), and launch returns that rank's code (128 + signal for a
// signal), naming the rank on stderr. SIGINT / SIGTERM to the launcher are forwarded to the ranks; a launcher
// that dies any other way (SIGKILL) takes its ranks with it (PR_SET_PDEATHSIG = SIGKILL in each rank).
// --max-restarts N (torchrun's): after a failed attempt (not one the user interrupted), the whole job starts again, up
// to N times, with MCPP_RESTART_COUNT = the attempt's number (0 first; torchrun's TORCHELASTIC_RESTART_COUNT) in the
// ranks' environment. The command resumes itself: `train --save D --load D` continues from D's latest committed
// checkpoint (docs/DEBUGGING.md). --inject-fault drills fire in attempt 0 only.
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "mcpp/core/error.h"

namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_forward_signal = 0;
void on_signal(int sig) { g_forward_signal = sig; }

pid_t spawn_rank(int rank, int n, const std::string& rdzv, const std::vector<std::string>& args) {
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) mcpp::fail("mcpp launch: fork failed for rank {}", rank);
  if (pid > 0) return pid;
  // The rank dies with its launcher, whatever ends the launcher (SIGKILL included: a killed job step leaves
  // no rank behind). The flag survives execv; a launcher that died before prctl is caught by getppid.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) std::_Exit(128 + SIGKILL);
  const std::string r = std::to_string(rank), size = std::to_string(n);
  ::setenv("MCPP_LAUNCH_RDZV", rdzv.c_str(), 1);
  ::setenv("MCPP_RANK", r.c_str(), 1);
  ::setenv("MCPP_WORLD_SIZE", size.c_str(), 1);
  ::setenv("MCPP_LOCAL_RANK", r.c_str(), 1);
  ::setenv("LOCAL_RANK", r.c_str(), 1);
  std::vector<char*> argv;
  static char prog[] = "mcpp";
  argv.push_back(prog);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "error: mcpp launch: exec of rank %d failed\n", rank);
  std::_Exit(127);
}

// One attempt: starts the n ranks and waits for them (the contract above); *interrupted: a forwarded SIGINT / SIGTERM.
int run_attempt(int n, const std::string& rdzv, const std::vector<std::string>& child_args, bool* interrupted) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) pids.push_back(spawn_rank(r, n, rdzv, child_args));
  int rc = 0, failed_rank = -1, running = n;
  std::vector<bool> alive(static_cast<size_t>(n), true);
  auto kill_all = [&](int sig) {
    for (int r = 0; r < n; ++r)
      if (alive[static_cast<size_t>(r)]) ::kill(pids[static_cast<size_t>(r)], sig);
  };
  auto term_deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    if (g_forward_signal) {
      kill_all(g_forward_signal);
      *interrupted = true;
      if (rc == 0) rc = 128 + g_forward_signal;
      g_forward_signal = 0;
      term_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (std::chrono::steady_clock::now() > term_deadline) {
        kill_all(SIGKILL);
        term_deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    const int r = static_cast<int>(it - pids.begin());
    alive[static_cast<size_t>(r)] = false;
    --running;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0) continue;
    // Every abnormal end is named (a rank that crashed and the peer that noticed it may end together).
    const bool stopped = failed_rank >= 0 && !WIFEXITED(status) && WTERMSIG(status) == SIGTERM;
    fmt::print(stderr, "mcpp launch: rank {} {} {}{}\n", r, WIFEXITED(status) ? "exited with code" : "was killed by signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), stopped ? " (stopped by the launcher)" : "");
    if (failed_rank < 0) {
      failed_rank = r;
      if (rc == 0) rc = code;
      fmt::print(stderr, "mcpp launch: stopping the other ranks\n");
      kill_all(SIGTERM);
      term_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
  }
  return rc;
}

// Removes the rank files an earlier launch or attempt left in the rendezvous directory.
void clear_rendezvous(const std::string& rdzv) {
  for (const auto& e : fs::directory_iterator(rdzv))
    if (e.path().filename().string().rfind("rank_", 0) == 0 || e.path().filename().string().rfind(".rank_", 0) == 0)
      fs::remove(e.path());
}

int run_launch(const std::vector<std::string>& all_args) {
  // Everything after "--" is the command the ranks run.
  auto sep = std::find(all_args.begin(), all_args.end(), "--");
  const std::vector<std::string> own(all_args.begin(), sep);
  int n = 0;
  std::string rdzv;
  double timeout = 120.0;
  CLI::App app{"Start N ranks of an mcpp command on this node (no MPI): mcpp launch --nproc-per-node N -- train ...",
               "mcpp launch"};
  app.add_option("--nproc-per-node", n, "processes (ranks) on this node")->required();
  app.add_option("--rdzv-dir", rdzv, "rendezvous directory (default: a fresh temporary one)");
  app.add_option("--rdzv-timeout", timeout, "seconds the ranks wait for each other");
  int max_restarts = 0;
  app.add_option("--max-restarts", max_restarts, "restart the whole job up to N times after a failure (torchrun's)")
      ->check(CLI::NonNegativeNumber);
  if (std::find(own.begin(), own.end(), "--help") != own.end() || std::find(own.begin(), own.end(), "-h") != own.end())
    mcpp::cli::parse_args(app, {"--help"});  // prints the help, exits 0
  if (sep == all_args.end() || sep + 1 == all_args.end())
    mcpp::fail("mcpp launch: give the command after '--', e.g. mcpp launch --nproc-per-node 2 -- train ...");
  const std::vector<std::string> cmd(sep + 1, all_args.end());
  mcpp::cli::parse_args(app, own);
  if (n < 1) mcpp::fail("nproc_per_node must be >= 1, got {}", n);
  if (mcpp::cli::commands().count(cmd.front()) == 0 || cmd.front() == "launch")
    mcpp::fail("mcpp launch: '{}' is not a subcommand that can be launched", cmd.front());
  bool made_dir = false;
  if (rdzv.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "mcpp_launch_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) mcpp::fail("mcpp launch: cannot create a rendezvous directory in {}", fs::temp_directory_path().string());
    rdzv = tmpl;
    made_dir = true;
  } else {
    fs::create_directories(rdzv);
  }
  const std::vector<std::string>& child_args = cmd;
  ::setenv("MCPP_LAUNCH_RDZV_TIMEOUT", fmt::format("{}", timeout).c_str(), 1);  // read by the ranks' rendezvous
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  int rc = 0;
  for (int attempt = 0;; ++attempt) {
    ::setenv("MCPP_RESTART_COUNT", std::to_string(attempt).c_str(), 1);
    clear_rendezvous(rdzv);
    bool interrupted = false;
    rc = run_attempt(n, rdzv, child_args, &interrupted);
    if (rc == 0 || interrupted || attempt >= max_restarts) break;
    fmt::print(stderr, "mcpp launch: restarting the job (restart {} of {}; the ranks resume from their checkpoint)\n",
               attempt + 1, max_restarts);
  }
  if (made_dir) fs::remove_all(rdzv);
  return rc;
}

const mcpp::cli::Register reg{"launch", "start N ranks on this node without MPI: launch --nproc-per-node N -- train ...",
                              &run_launch};

}  // namespace
