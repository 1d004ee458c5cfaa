// mcpp launch --nproc-per-node N [--rdzv-dir DIR] [--rdzv-timeout S] -- <subcommand> [args...]
// mcpp launch --nnodes M --node-rank R --master-addr HOST --master-port P --nproc-per-node N -- <subcommand> ...
// The launcher (Megatron users' torchrun, its flag names): starts N copies of this mcpp running
// `<subcommand> [args...]`, each with MCPP_RANK (R * N + local rank) / MCPP_WORLD_SIZE (M * N) / MCPP_LOCAL_RANK
// (and LOCAL_RANK) / MCPP_NODE_RANK and MCPP_LAUNCH_RDZV, where the ranks find each other (comm/tcp: a TCP mesh;
// with --device cuda, NCCL groups bootstrap over it, GPU = local rank). No MPI needed.
// One node (no --master-addr): the rendezvous is a directory, the mesh loopback. Several nodes: node 0's launcher
// serves a TCP rendezvous on 0.0.0.0:P (comm/tcp/tcp_rendezvous.h; no shared directory), MCPP_LAUNCH_RDZV =
// tcp://HOST:P; the launchers of nodes 1..M-1 register with it and keep a control connection.
// Exit: 0 when every rank exits 0. The first rank that fails (non-zero exit or a signal) ends the job:
// the others get SIGTERM (SIGKILL 5 s later), and launch returns that rank's code (128 + signal for a
// signal), naming the rank on stderr. Across nodes: a node whose rank failed tells the master, which tells every
// node to stop its ranks ("mcpp launch: node K failed ..."); a node that loses the master (or the master a node)
// stops its ranks likewise. Bad input (a node rank out of range, an unreachable or unresolvable master, a port in
// use on node 0, nodes started with different layouts) is one error line, exit 2. SIGINT / SIGTERM to the launcher
// are forwarded to the ranks; SIGUSR1 too, without stopping them (their flight-recorder + host-stack dump); a launcher
// that dies any other way (SIGKILL) takes its ranks with it (PR_SET_PDEATHSIG = SIGKILL in each rank).
// --max-restarts N (torchrun's; one node): after a failed attempt (not one the user interrupted), the whole job starts
// again, up to N times, with MCPP_RESTART_COUNT = the attempt's number (0 first; torchrun's
// TORCHELASTIC_RESTART_COUNT) in the ranks' environment. The command resumes itself: `train --save D --load D`
// continues from D's latest committed checkpoint (docs/DEBUGGING.md). --inject-fault drills fire in attempt 0 only.
// Several nodes restart from the scheduler instead (docs/LAUNCH.md): --max-restarts with --nnodes > 1 is refused.
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "mcpp/comm/tcp/tcp_rendezvous.h"
#include "mcpp/core/error.h"

namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_forward_signal = 0;
void on_signal(int sig) { g_forward_signal = sig; }
volatile sig_atomic_t g_forward_usr1 = 0;  // SIGUSR1: passed on to every rank (their hang-forensics dump), no stop
void on_usr1(int) { g_forward_usr1 = 1; }

struct Layout {
  int nnodes = 1, node_rank = 0, nproc = 0;
  int rank(int local) const { return node_rank * nproc + local; }
  int world() const { return nnodes * nproc; }
};

pid_t spawn_rank(int local, const Layout& L, const std::string& rdzv, const std::vector<std::string>& args) {
  const int rank = L.rank(local);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) mcpp::fail("mcpp launch: fork failed for rank {}", rank);
  if (pid > 0) return pid;
  // The rank dies with its launcher, whatever ends the launcher (SIGKILL included: a killed job step leaves
  // no rank behind). The flag survives execv; a launcher that died before prctl is caught by getppid.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) std::_Exit(128 + SIGKILL);
  const std::string r = std::to_string(rank), size = std::to_string(L.world()), lr = std::to_string(local);
  ::setenv("MCPP_LAUNCH_RDZV", rdzv.c_str(), 1);
  ::setenv("MCPP_RANK", r.c_str(), 1);
  ::setenv("MCPP_WORLD_SIZE", size.c_str(), 1);
  ::setenv("MCPP_LOCAL_RANK", lr.c_str(), 1);
  ::setenv("MCPP_NODE_RANK", std::to_string(L.node_rank).c_str(), 1);
  ::setenv("LOCAL_RANK", lr.c_str(), 1);
  std::vector<char*> argv;
  static char prog[] = "mcpp";
  argv.push_back(prog);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "error: mcpp launch: exec of rank %d failed\n", rank);
  std::_Exit(127);
}

// One attempt: starts this node's ranks and waits for them (the contract above); *interrupted: a forwarded SIGINT /
// SIGTERM. server / control: the TCP rendezvous's node 0 / other nodes (null on one node).
int run_attempt(const Layout& L, const std::string& rdzv, const std::vector<std::string>& child_args,
                mcpp::comm::RendezvousServer* server, mcpp::comm::RendezvousControl* control, bool* interrupted) {
  const int n = L.nproc;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) pids.push_back(spawn_rank(r, L, rdzv, child_args));
  int rc = 0, running = n;
  bool stopping = false;  // this node's ranks were told to stop (a failure here or on another node)
  std::vector<bool> alive(static_cast<size_t>(n), true);
  auto kill_all = [&](int sig) {
    for (int r = 0; r < n; ++r)
      if (alive[static_cast<size_t>(r)]) ::kill(pids[static_cast<size_t>(r)], sig);
  };
  auto term_deadline = std::chrono::steady_clock::time_point::max();
  auto stop = [&](int code, const std::string& why) {  // end this node's ranks (once)
    if (rc == 0) rc = code;
    if (stopping) return;
    stopping = true;
    fmt::print(stderr, "mcpp launch: {}; stopping the other ranks\n", why);
    kill_all(SIGTERM);
    term_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  };
  // Node 0 stays until every other node reported its end (it serves their control connections) — after a failure
  // at most 10 s more (a node that never came up never reports).
  bool reported = false;
  auto linger_deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0 || (server && server->nodes_pending() > 0 && std::chrono::steady_clock::now() < linger_deadline)) {
    if (running == 0 && rc != 0 && linger_deadline == std::chrono::steady_clock::time_point::max())
      linger_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    if (g_forward_usr1) {
      g_forward_usr1 = 0;
      kill_all(SIGUSR1);
    }
    if (g_forward_signal) {
      kill_all(g_forward_signal);
      *interrupted = true;
      if (rc == 0) rc = 128 + g_forward_signal;
      g_forward_signal = 0;
      term_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    if (server) {  // other nodes' ends: a failure (or a lost node) stops every node
      for (const auto& [node, code] : server->take_exits()) {
        if (code == 0) continue;
        const std::string why = code < 0 ? fmt::format("lost node {} (its launcher's connection closed)", node)
                                         : fmt::format("node {} failed (exit {})", node, code);
        server->abort(node, code);
        stop(code > 0 ? code : 1, why);
      }
    }
    std::string why;
    if (control && running > 0 && control->aborted(&why)) stop(1, why);
    int status = 0;
    const pid_t pid = running > 0 ? ::waitpid(-1, &status, WNOHANG) : 0;
    if (pid <= 0) {
      if (std::chrono::steady_clock::now() > term_deadline) {
        kill_all(SIGKILL);
        term_deadline = std::chrono::steady_clock::time_point::max();
      }
      if (server) server->poll(20);
      else std::this_thread::sleep_for(std::chrono::milliseconds(20));
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
    const bool stopped = stopping && !WIFEXITED(status) && WTERMSIG(status) == SIGTERM;
    fmt::print(stderr, "mcpp launch: rank {} {} {}{}\n", L.rank(r),
               WIFEXITED(status) ? "exited with code" : "was killed by signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), stopped ? " (stopped by the launcher)" : "");
    if (!stopping) {
      if (server) server->abort(0, code);
      if (control) control->report_exit(code), reported = true;  // the master stops the other nodes
      stop(code, fmt::format("rank {} failed", L.rank(r)));
    }
  }
  if (control && !reported) control->report_exit(rc);
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
  Layout L;
  int& n = L.nproc;
  std::string rdzv, master_addr;
  int master_port = 29500;
  double timeout = 120.0;
  CLI::App app{"Start N ranks of an mcpp command on this node (no MPI): mcpp launch --nproc-per-node N -- train ...; "
               "several nodes: --nnodes M --node-rank R --master-addr HOST --master-port P on each",
               "mcpp launch"};
  app.add_option("--nproc-per-node", n, "processes (ranks) on this node")->required();
  app.add_option("--nnodes", L.nnodes, "nodes of the job (each runs one mcpp launch)");
  app.add_option("--node-rank", L.node_rank, "this node's rank in [0, nnodes)");
  app.add_option("--master-addr", master_addr, "node 0's address (the TCP rendezvous; needed with --nnodes > 1)");
  app.add_option("--master-port", master_port, "node 0's rendezvous port (default 29500)");
  app.add_option("--rdzv-dir", rdzv, "rendezvous directory on one node (default: a fresh temporary one)");
  app.add_option("--rdzv-timeout", timeout, "seconds the ranks (and nodes) wait for each other");
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
  if (L.nnodes < 1) mcpp::fail("nnodes must be >= 1, got {}", L.nnodes);
  if (L.node_rank < 0 || L.node_rank >= L.nnodes)
    mcpp::fail("node_rank {} is out of range [0, {}) for --nnodes {}", L.node_rank, L.nnodes, L.nnodes);
  if (L.nnodes > 1 && master_addr.empty())
    mcpp::fail("master_addr: --nnodes {} needs --master-addr (node 0's address) and --master-port", L.nnodes);
  if (master_port < 1 || master_port > 65535) mcpp::fail("master_port {} is not a TCP port", master_port);
  if (max_restarts > 0 && L.nnodes > 1)
    mcpp::fail("max_restarts: --max-restarts restarts one node's job; with --nnodes {} restart from the scheduler "
               "(docs/LAUNCH.md)", L.nnodes);
  if (!master_addr.empty() && !rdzv.empty())
    mcpp::fail("rdzv_dir: --rdzv-dir is the one-node rendezvous; with --master-addr the rendezvous is TCP");
  if (mcpp::cli::commands().count(cmd.front()) == 0 || cmd.front() == "launch")
    mcpp::fail("mcpp launch: '{}' is not a subcommand that can be launched", cmd.front());
  bool made_dir = false;
  std::unique_ptr<mcpp::comm::RendezvousServer> server;    // node 0 of a TCP rendezvous
  std::unique_ptr<mcpp::comm::RendezvousControl> control;  // nodes 1..M-1
  if (!master_addr.empty()) {
    rdzv = fmt::format("tcp://{}:{}", master_addr, master_port);
    if (L.node_rank == 0)
      server = std::make_unique<mcpp::comm::RendezvousServer>(master_port, L.world(), L.nnodes, n);
    else
      control = std::make_unique<mcpp::comm::RendezvousControl>(
          mcpp::comm::TcpEndpoint{master_addr, master_port}, L.node_rank, L.nnodes, n, timeout);
  } else if (rdzv.empty()) {
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
  sa.sa_handler = on_usr1;
  ::sigaction(SIGUSR1, &sa, nullptr);
  int rc = 0;
  for (int attempt = 0;; ++attempt) {
    ::setenv("MCPP_RESTART_COUNT", std::to_string(attempt).c_str(), 1);
    if (master_addr.empty()) clear_rendezvous(rdzv);  // stale files of an earlier launch or attempt
    bool interrupted = false;
    rc = run_attempt(L, rdzv, child_args, server.get(), control.get(), &interrupted);
    if (rc == 0 || interrupted || attempt >= max_restarts) break;
    fmt::print(stderr, "mcpp launch: restarting the job (restart {} of {}; the ranks resume from their checkpoint)\n",
               attempt + 1, max_restarts);
  }
  if (made_dir) fs::remove_all(rdzv);
  return rc;
}

const mcpp::cli::Register reg{"launch", "start N ranks per node without MPI: launch [--nnodes M --node-rank R "
                              "--master-addr HOST --master-port P] --nproc-per-node N -- train ...",
                              &run_launch};

}  // namespace
