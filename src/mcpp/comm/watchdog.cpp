// Watchdog: timeout detection, abort-marker coordination, dump comparison (contract in watchdog.h).
#include "mcpp/comm/watchdog.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "mcpp/comm/host_stack.h"
#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"

namespace mcpp::comm {

namespace fs = std::filesystem;

double distributed_timeout_seconds(double minutes) {
  if (const char* env = std::getenv("MCPP_DISTRIBUTED_TIMEOUT_SECONDS"); env && *env) {
    char* end = nullptr;
    double s = std::strtod(env, &end);
    if (end == env || *end != '\0' || !(s > 0)) {
      fail("MCPP_DISTRIBUTED_TIMEOUT_SECONDS='{}': expected a positive number of seconds", env);
    }
    return s;
  }
  if (!(minutes > 0)) fail("--distributed-timeout-minutes must be > 0 (got {})", minutes);
  return minutes * 60.0;
}

std::string describe_entry(const RecordEntry& e) {
  std::string s = fmt::format("{}", e.op);
  if (!e.reduce_op.empty()) s += fmt::format("({})", e.reduce_op);
  s += fmt::format(" (group '{}' ranks [{}], ", e.group, fmt::join(e.group_ranks, ","));
  if (e.op == "batch_p2p") {
    s += fmt::format("p2p_seq {}, peers [{}]", e.p2p_seq, fmt::join(e.peers, ","));
  } else {
    s += fmt::format("seq {}", e.seq);
  }
  if (!e.dtype.empty()) s += fmt::format(", {}, {} elements", e.dtype, e.count);
  return s + ")";
}

StuckReport analyze_dumps(const RecordEntry& stuck, const std::map<int, nlohmann::json>& dumps) {
  StuckReport r;
  r.describe_stuck = describe_entry(stuck);
  bool p2p = stuck.op == "batch_p2p";
  // For p2p only the peers matter: a peer "never entered" when it has no pending batch_p2p on the group.
  const std::vector<int>& members = p2p ? stuck.peers : stuck.group_ranks;
  for (int m : members) {
    auto it = dumps.find(m);
    if (it == dumps.end()) {
      r.missing_dumps.push_back(m);
      continue;
    }
    uint64_t last_seq = 0;
    bool pending_p2p = false;
    for (const auto& e : it->second.at("entries")) {
      if (e.at("group").get<std::string>() != stuck.group || e.at("group_ranks").get<std::vector<int>>() != stuck.group_ranks) {
        continue;
      }
      std::string state = e.at("state").get<std::string>();
      if (p2p) {
        if (e.at("op") == "batch_p2p" && (state == "queued" || state == "started")) pending_p2p = true;
        continue;
      }
      uint64_t seq = e.at("seq").get<uint64_t>();
      if (seq == 0) continue;
      last_seq = std::max(last_seq, seq);
      if (seq == stuck.seq && e.at("op").get<std::string>() != stuck.op) {
        r.other_ops.push_back(fmt::format("rank {} issued {}", m, e.at("op").get<std::string>()));
      }
    }
    if (p2p ? !pending_p2p : last_seq < stuck.seq) r.never_entered.push_back(m);
  }
  return r;
}

Watchdog::Watchdog(const CommPtr& world, WatchdogOptions opts) : opts_(std::move(opts)) {
  if (!world) fail("Watchdog: no world communicator");
  if (!opts_.on_abort) fail("Watchdog: WatchdogOptions::on_abort is required (the CLI passes comm::mpi_abort_action())");
  if (!(opts_.timeout_seconds > 0)) fail("Watchdog: timeout_seconds must be > 0 (got {})", opts_.timeout_seconds);
  if (opts_.dump_dir.empty()) fail("Watchdog: WatchdogOptions::dump_dir is empty");
  rec_ = world->recorder_ptr();
  rank_ = world->global_rank();
  world_size_ = world->size();
  dir_ = (fs::path(opts_.dump_dir) / "flight_recorder").string();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail("Watchdog: cannot create dump directory '{}' (rank {}): {}", dir_, rank_, ec.message());
  // Run id from rank 0 so markers of earlier runs in the same directory are ignored.
  Tensor id = Tensor::empty({1}, DType::I64);
  id.data<int64_t>()[0] = world->rank() == 0 ? (wall_now_us() ^ (static_cast<int64_t>(getpid()) << 40)) : 0;
  world->broadcast(id, 0).wait();
  marker_path_ = fmt::format("{}/abort_{:x}", dir_, static_cast<uint64_t>(id.data<int64_t>()[0]));
  dump_path_ = fmt::format("{}/rank_{}.json", dir_, rank_);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Watchdog::sleep_or_stop(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stop_; });
}

void Watchdog::loop() {
  const int64_t timeout_ns = static_cast<int64_t>(opts_.timeout_seconds * 1e9);
  while (!sleep_or_stop(opts_.poll_seconds)) {
    auto pending = rec_->pending();
    if (!pending.empty() && steady_now_ns() - pending.front().start_steady_ns > timeout_ns) {
      int fd = ::open(marker_path_.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (fd >= 0) {
        std::string body = fmt::format("{{\"leader\": {}, \"stuck\": \"{}\"}}\n", rank_, describe_entry(pending.front()));
        ssize_t ignored = ::write(fd, body.data(), body.size());
        (void)ignored;
        ::close(fd);
        lead(pending.front());
      } else {
        follow();
      }
      return;
    }
    if (fs::exists(marker_path_)) {
      follow();
      return;
    }
  }
}

void Watchdog::lead(const RecordEntry& stuck) {
  fired_ = true;
  const std::string desc = describe_entry(stuck);
  try {
    rec_->dump_to_file(dump_path_, fmt::format("timeout: {} pending longer than {} s", desc, opts_.timeout_seconds),
                       {{"host_stacks", host_stacks_for_dump()}});
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: watchdog rank {}: {}\n", rank_, e.what());
  }
  std::map<int, nlohmann::json> dumps;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opts_.grace_seconds);
  while (true) {
    for (int r = 0; r < world_size_; ++r) {
      if (dumps.count(r)) continue;
      std::string p = fmt::format("{}/rank_{}.json", dir_, r);
      if (!std::filesystem::exists(p)) continue;
      try {
        dumps[r] = read_json_file(p, "flight recorder dump", {.max_bytes = uint64_t{1} << 30});
      } catch (const std::exception&) {
        // partially visible file: retry on the next pass (writers rename atomically, so rare)
      }
    }
    if (static_cast<int>(dumps.size()) == world_size_ || std::chrono::steady_clock::now() > deadline) break;
    if (sleep_or_stop(opts_.poll_seconds)) break;
  }
  StuckReport rep;
  std::string analysis;
  try {
    rep = analyze_dumps(stuck, dumps);
  } catch (const std::exception& e) {
    analysis = fmt::format("; dump comparison failed: {}", e.what());
  }
  std::string msg = fmt::format("distributed timeout: {} did not complete within {} s on rank {}; ", desc,
                                opts_.timeout_seconds, rank_);
  msg += rep.never_entered.empty() ? std::string("every member entered it")
                                   : fmt::format("ranks that never entered it: [{}]", fmt::join(rep.never_entered, ","));
  if (!rep.other_ops.empty()) msg += fmt::format("; at that seq {}", fmt::join(rep.other_ops, ", "));
  if (!rep.missing_dumps.empty()) msg += fmt::format("; no dump from ranks [{}]", fmt::join(rep.missing_dumps, ","));
  msg += analysis;
  msg += fmt::format("; flight recorder dumps ({} of {} ranks) in {}", dumps.size(), world_size_, dir_);
  fmt::print(stderr, "error: {}\n", msg);
  std::fflush(stderr);
  opts_.on_abort(opts_.exit_code, msg);
}

void Watchdog::follow() {
  fired_ = true;
  try {
    rec_->dump_to_file(dump_path_, "abort requested by another rank's watchdog (marker " + marker_path_ + ")",
                       {{"host_stacks", host_stacks_for_dump()}});
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: watchdog rank {}: {}\n", rank_, e.what());
  }
  // The leader reads our dump and ends the job; abort ourselves only if it does not.
  if (sleep_or_stop(opts_.grace_seconds + opts_.follower_extra_seconds)) return;
  opts_.on_abort(opts_.exit_code, fmt::format("watchdog: rank {} aborting after another rank's timeout", rank_));
}

}  // namespace mcpp::comm
