// --inject-fault: parsing and the injector (fault_injection.h).
#include "mcpp/training/fault_injection.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "mcpp/comm/communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

constexpr const char* kGrammar =
    "KIND[:OPTS]@ITER[:RANK] with KIND nan-grad:layer=K[,persistent] | nan-output:layer=K[,persistent] | kill | hang "
    "| slow-data[:ms=N] | slow-rank[:ms=N] | wrong-collective[:extra] | bad-shard";

int64_t parse_int(std::string_view s, const std::string& text, const char* what) {
  int64_t v = 0;
  size_t used = 0;
  try {
    v = std::stoll(std::string(s), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || v < 0)
    fail("--inject-fault '{}': {} must be a non-negative integer, got '{}' ({})", text, what, s, kGrammar);
  return v;
}

// "layer=3,persistent" / "ms=200" into `f`.
void parse_options(std::string_view opts, FaultSpec& f) {
  const bool nan = f.kind == FaultKind::NanGrad || f.kind == FaultKind::NanOutput;
  const bool slow = f.kind == FaultKind::SlowData || f.kind == FaultKind::SlowRank;
  while (!opts.empty()) {
    const size_t comma = opts.find(',');
    const std::string_view o = opts.substr(0, comma);
    opts = comma == std::string_view::npos ? std::string_view() : opts.substr(comma + 1);
    const size_t eq = o.find('=');
    const std::string_view key = o.substr(0, eq), value = eq == std::string_view::npos ? "" : o.substr(eq + 1);
    if (nan && key == "layer") f.layer = parse_int(value, f.text, "layer");
    else if (nan && key == "persistent" && eq == std::string_view::npos) f.persistent = true;
    else if (slow && key == "ms") f.ms = parse_int(value, f.text, "ms");
    else if (f.kind == FaultKind::WrongCollective && key == "extra" && eq == std::string_view::npos) f.extra = true;
    else fail("--inject-fault '{}': unknown option '{}' for {} ({})", f.text, o, fault_kind_name(f.kind), kGrammar);
  }
  if (nan && f.layer < 0) fail("--inject-fault '{}': {} needs layer=K ({})", f.text, fault_kind_name(f.kind), kGrammar);
}

// The layer index of a qualified module name "decoder.layers.K.mlp..." (-1: none).
int64_t layer_of(const std::string& module) {
  constexpr std::string_view kPrefix = "decoder.layers.";
  if (module.rfind(kPrefix, 0) != 0) return -1;
  return std::strtoll(module.c_str() + kPrefix.size(), nullptr, 10);
}

}  // namespace

const char* fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::NanGrad: return "nan-grad";
    case FaultKind::NanOutput: return "nan-output";
    case FaultKind::Kill: return "kill";
    case FaultKind::Hang: return "hang";
    case FaultKind::SlowData: return "slow-data";
    case FaultKind::SlowRank: return "slow-rank";
    case FaultKind::WrongCollective: return "wrong-collective";
    case FaultKind::BadShard: return "bad-shard";
  }
  return "?";
}

FaultSpec parse_fault_spec(const std::string& text) {
  FaultSpec f;
  f.text = text;
  const size_t at = text.rfind('@');
  if (at == std::string::npos) fail("--inject-fault '{}': no @ITER ({})", text, kGrammar);
  const std::string_view head = std::string_view(text).substr(0, at), tail = std::string_view(text).substr(at + 1);
  const size_t colon = head.find(':');
  const std::string_view kind = head.substr(0, colon);
  bool found = false;
  for (FaultKind k : {FaultKind::NanGrad, FaultKind::NanOutput, FaultKind::Kill, FaultKind::Hang, FaultKind::SlowData,
                      FaultKind::SlowRank, FaultKind::WrongCollective, FaultKind::BadShard})
    if (kind == fault_kind_name(k)) f.kind = k, found = true;
  if (!found) fail("--inject-fault '{}': unknown kind '{}' ({})", text, kind, kGrammar);
  parse_options(colon == std::string_view::npos ? std::string_view() : head.substr(colon + 1), f);
  const size_t rc = tail.find(':');
  f.iteration = parse_int(tail.substr(0, rc), text, "ITER");
  if (f.iteration < 1) fail("--inject-fault '{}': ITER counts from 1 ({})", text, kGrammar);
  if (rc != std::string_view::npos) {
    const int64_t r = parse_int(tail.substr(rc + 1), text, "RANK");
    if (r > std::numeric_limits<int>::max()) fail("--inject-fault '{}': RANK {} is out of range", text, r);
    f.rank = static_cast<int>(r);
  }
  return f;
}

FaultInjector::FaultInjector(std::vector<FaultSpec> faults, int rank) : faults_(std::move(faults)), rank_(rank) {
  // A drill fires in a job's first attempt only: `mcpp launch --max-restarts` restarts with MCPP_RESTART_COUNT >= 1.
  const char* restart = std::getenv("MCPP_RESTART_COUNT");
  if (restart && std::strtol(restart, nullptr, 10) > 0) faults_.clear();
}

FaultInjector::~FaultInjector() { end_step(); }

void FaultInjector::begin_step(int64_t iteration, bool rerun, comm::Communicator& world) {
  end_step();
  nan_due_.clear();
  for (const FaultSpec& f : faults_) {
    if (f.kind == FaultKind::WrongCollective && !f.extra && f.iteration == iteration && !rerun && f.rank != rank_) {
      Tensor t = Tensor::zeros({1});  // the drill call of every other rank (the faulty one issues 3 floats)
      world.host().all_reduce(t, comm::ReduceOp::Sum).wait();
    }
    if (f.iteration != iteration || f.rank != rank_) continue;
    switch (f.kind) {
      case FaultKind::NanGrad:
      case FaultKind::NanOutput:
        if (!rerun || f.persistent) nan_due_.push_back(&f);
        break;
      case FaultKind::Kill:
        if (rerun) break;
        fmt::print(stderr, "[inject-fault] rank {}: {} at iteration {}\n", rank_, f.text, iteration);
        std::fflush(nullptr);
        std::raise(SIGKILL);
        break;
      case FaultKind::Hang:
        if (rerun) break;
        fmt::print(stderr, "[inject-fault] rank {}: {}: this rank stops calling collectives\n", rank_, f.text);
        std::fflush(nullptr);
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      case FaultKind::SlowRank:
        if (!rerun) std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
        break;
      case FaultKind::WrongCollective: {
        if (rerun) break;
        fmt::print(stderr, "[inject-fault] rank {}: {}: an all_reduce of 3 floats on the world group{}\n", rank_,
                   f.text, f.extra ? " (no peer issues it)" : " (the peers: 1 float)");
        std::fflush(nullptr);
        Tensor t = Tensor::zeros({3});
        world.host().all_reduce(t, comm::ReduceOp::Sum).wait();
        break;
      }
      case FaultKind::SlowData:
      case FaultKind::BadShard: break;
    }
  }
  if (!nan_due_.empty()) {
    add_scope_observer(this);
    installed_ = true;
  }
}

void FaultInjector::end_step() {
  if (installed_) remove_scope_observer(this);
  installed_ = false;
}

void FaultInjector::before_batch(int64_t iteration) {
  for (const FaultSpec& f : faults_)
    if (f.kind == FaultKind::SlowData && f.iteration == iteration && f.rank == rank_)
      std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
}

void FaultInjector::after_save(int64_t iteration, const std::string& dir) {
  namespace fs = std::filesystem;
  for (const FaultSpec& f : faults_) {
    if (f.kind != FaultKind::BadShard || f.iteration != iteration || f.rank != rank_) continue;
    std::vector<fs::path> mine, any;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || !name.ends_with(".safetensors")) continue;
      any.push_back(e.path());
      if (name.find(fmt::format("rank_{:05d}", rank_)) != std::string::npos) mine.push_back(e.path());
    }
    std::vector<fs::path>& pick = !mine.empty() ? mine : any;
    MCPP_CHECK(!pick.empty(), "--inject-fault {}: no shard file in {}", f.text, dir);
    std::sort(pick.begin(), pick.end());
    const fs::path p = pick.front();
    const auto size = static_cast<std::streamoff>(fs::file_size(p));
    std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(size - 1);  // the last byte: tensor data (the header is at the front)
    char c = 0;
    io.get(c);
    io.seekp(size - 1);
    io.put(static_cast<char>(c ^ 0x5a));
    io.close();
    fmt::print(stderr, "[inject-fault] rank {}: {}: flipped a byte of {}\n", rank_, f.text, p.string());
  }
}

void FaultInjector::on_output(const std::vector<const char*>& scopes, bool backward, const Tensor& t) {
  if (scopes.empty() || std::string_view(scopes.back()) != "mlp" || !t.defined()) return;
  const int64_t layer = layer_of(qualified_module_name(scopes));
  for (const FaultSpec* f : nan_due_)
    if (f->layer == layer && backward == (f->kind == FaultKind::NanGrad)) {
      Tensor w = t;  // shares the storage: the module's output / gradient itself
      ops::scale_inplace(w, std::numeric_limits<float>::quiet_NaN());
    }
}

}  // namespace mcpp
