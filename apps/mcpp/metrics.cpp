// mcpp metrics plot RUN [--output report.png|.svg]: a figure of a training run (loss, lr, grad norm, throughput,
//   per-rank step times, MoE expert load) drawn by scripts/plot_metrics.py with Debian's python3 + matplotlib
//   ($MCPP_PYTHON, else /usr/bin/python3; the script: $MCPP_PLOT_SCRIPT, else this checkout's scripts/).
// mcpp metrics summarize RUN [RUN...]: one column per run — iterations, final loss, median step time, tokens/s,
//   TFLOP/s/GPU and MFU (medians over the logged windows after the first, which holds the warm-up), peak memory
//   (the largest over the rank files, else the last rank's) and the slowest rank.
// RUN: a metrics file (--metrics-path) or a directory holding metrics.jsonl (the default under --save); the rank
// files beside it are <stem>.rank_<r>.jsonl (training/metrics.h). A missing or malformed file is one error line.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/core/regular_file.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string metrics_file(const std::string& run) {
  const fs::path p = fs::is_directory(run) ? fs::path(run) / "metrics.jsonl" : fs::path(run);
  if (!fs::is_regular_file(p)) mcpp::fail("metrics: no metrics file at '{}' (a --metrics-path file or a directory "
                                          "with metrics.jsonl)", p.string());
  return p.string();
}

std::vector<json> read_jsonl(const std::string& path) {
  std::istringstream f(mcpp::read_regular_file(path, "metrics file", uint64_t{4} << 30));
  std::vector<json> out;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty()) continue;
    out.push_back(mcpp::parse_json_limited(line, fmt::format("metrics: {} line {}", path, n)));
  }
  return out;
}

std::vector<std::string> rank_files(const std::string& metrics) {
  const fs::path p(metrics);
  const std::string prefix = p.stem().string() + ".rank_";
  std::vector<std::pair<int, std::string>> found;
  for (const auto& e : fs::directory_iterator(p.has_parent_path() ? p.parent_path() : fs::path("."))) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && e.path().extension() == ".jsonl")
      found.emplace_back(std::atoi(name.substr(prefix.size()).c_str()), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [r, f] : found) out.push_back(f);
  return out;
}

std::optional<double> median(std::vector<double> v) {
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Summary {
  std::string name;
  std::map<std::string, std::string> cells;
};

Summary summarize(const std::string& run) {
  const std::string path = metrics_file(run);
  const std::vector<json> recs = read_jsonl(path);
  std::vector<json> train;
  for (const json& r : recs)
    if (r.value("event", "") == "train") train.push_back(r);
  if (train.empty()) mcpp::fail("metrics: {} holds no training records", path);
  // Medians over the windows after the first (it holds the first steps' warm-up), all when only one.
  auto med = [&](const char* key) {
    std::vector<double> v;
    for (size_t i = train.size() > 1 ? 1 : 0; i < train.size(); ++i)
      if (train[i].contains(key)) v.push_back(train[i][key].get<double>());
    return median(v);
  };
  Summary s{.name = run, .cells = {}};
  auto put = [&](const char* row, std::optional<double> v, const char* fmt_str, double scale = 1.0) {
    s.cells[row] = v ? fmt::format(fmt::runtime(fmt_str), *v * scale) : "-";
  };
  s.cells["iterations"] = std::to_string(train.back()["iteration"].get<int64_t>());
  put("final lm loss", train.back()["lm_loss"].get<double>(), "{:.4f}");
  put("median step (ms)", med("elapsed_ms_per_iter"), "{:.1f}");
  put("tokens/s", med("tokens_per_sec"), "{:.0f}");
  put("TFLOP/s/GPU", med("tflops_per_gpu"), "{:.3g}");
  put("MFU", med("mfu"), "{:.1f}%", 100.0);
  // peak memory: every rank's own records, else the last rank's
  double peak = 0;
  std::string kind;
  std::map<int, std::vector<double>> rank_steps;
  for (const std::string& f : rank_files(path))
    for (const json& r : read_jsonl(f)) {
      if (r.value("event", "") != "train") continue;
      if (r.contains("memory")) {
        peak = std::max(peak, r["memory"]["peak_bytes"].get<double>());
        kind = r["memory"]["kind"].get<std::string>();
      }
      rank_steps[r["rank"].get<int>()].push_back(r["step_ms_mean"].get<double>());
    }
  for (const json& r : train)
    if (r.contains("memory") && r["memory"]["peak_bytes"].get<double>() > peak) {
      peak = r["memory"]["peak_bytes"].get<double>();
      kind = r["memory"]["kind"].get<std::string>();
    }
  for (const json& r : recs)
    if (r.value("event", "") == "memory" && r.contains("peak_device_gib"))
      peak = std::max(peak, r["peak_device_gib"].get<double>() * 1024.0 * 1024.0 * 1024.0), kind = "device";
  s.cells["peak memory (GiB)"] = peak > 0 ? fmt::format("{:.2f} {}", peak / (1024.0 * 1024.0 * 1024.0), kind) : "-";
  if (!rank_steps.empty()) {
    int slow = -1;
    double worst = -1, best = 0;
    for (auto& [rank, v] : rank_steps) {
      const double m = *median(v);
      if (m > worst) worst = m, slow = rank;
      best = best == 0 ? m : std::min(best, m);
    }
    s.cells["slowest rank"] = fmt::format("{} ({:.2f}x the fastest)", slow, best > 0 ? worst / best : 0.0);
  } else {
    s.cells["slowest rank"] = "-";
  }
  return s;
}

int run_summarize(const std::vector<std::string>& runs) {
  if (runs.empty()) mcpp::fail("metrics summarize: give one or more runs (metrics files or directories)");
  std::vector<Summary> all;
  for (const std::string& r : runs) all.push_back(summarize(r));
  const std::vector<std::string> rows = {"iterations", "final lm loss",   "median step (ms)", "tokens/s",
                                         "TFLOP/s/GPU", "MFU", "peak memory (GiB)", "slowest rank"};
  size_t w0 = 18;
  std::vector<size_t> w;
  for (const Summary& s : all) {
    size_t c = s.name.size();
    for (const auto& [k, v] : s.cells) c = std::max(c, v.size());
    w.push_back(c + 2);
  }
  std::string head = fmt::format("{:<{}}", "run", w0);
  for (size_t i = 0; i < all.size(); ++i) head += fmt::format("{:>{}}", all[i].name, w[i]);
  fmt::print("{}\n", head);
  for (const std::string& row : rows) {
    std::string line = fmt::format("{:<{}}", row, w0);
    for (size_t i = 0; i < all.size(); ++i) line += fmt::format("{:>{}}", all[i].cells.at(row), w[i]);
    fmt::print("{}\n", line);
  }
  return 0;
}

int spawn(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int run_plot(const std::string& run, const std::string& output) {
  const std::string metrics = metrics_file(run);
  const char* py_env = std::getenv("MCPP_PYTHON");
  const std::string python = py_env ? py_env : fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const char* script_env = std::getenv("MCPP_PLOT_SCRIPT");
  const std::string script = script_env ? script_env : std::string(MCPP_SOURCE_DIR) + "/scripts/plot_metrics.py";
  if (!fs::exists(script))
    mcpp::fail("metrics plot: the plotting script '{}' is missing (set MCPP_PLOT_SCRIPT)", script);
  if (spawn({python, "-c", "import matplotlib"}, true) != 0)
    mcpp::fail("metrics plot: {} cannot import matplotlib (scripts/install_deps.sh installs python3-matplotlib; or "
               "set MCPP_PYTHON)", python);
  const int rc = spawn({python, script, metrics, output}, false);
  if (rc != 0) mcpp::fail("metrics plot: {} {} exited with status {}", python, script, rc);
  return 0;
}

int run_metrics(const std::vector<std::string>& args) {
  CLI::App app{"mcpp metrics: plot or summarize training metrics", "mcpp metrics"};
  app.require_subcommand(1);
  std::string run, output = "report.png";
  std::vector<std::string> runs;
  CLI::App* plot = app.add_subcommand("plot", "draw RUN's metrics (loss, lr, grad norm, throughput, ranks, MoE load)");
  plot->add_option("run", run, "a metrics file or a directory with metrics.jsonl")->required();
  plot->add_option("--output,-o", output, "the figure: .png or .svg");
  CLI::App* sum = app.add_subcommand("summarize", "a table of one or several runs side by side");
  sum->add_option("runs", runs, "metrics files or directories")->required();
  mcpp::cli::parse_args(app, args);  // `metrics plot --help`: the subcommand's help
  if (plot->parsed()) return run_plot(run, output);
  return run_summarize(runs);
}

const mcpp::cli::Register reg{"metrics", "plot or summarize a run's metrics (metrics plot RUN -o report.png)",
                              &run_metrics};

}  // namespace
