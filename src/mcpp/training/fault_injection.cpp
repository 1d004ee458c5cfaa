// --inject-fault: the injector (fault_injection.h; the values are parsed by fault_spec.cpp).
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

// Whether `f` acts in `iteration`: its ITER, or (slow kinds' `every`) any iteration from it on.
bool due(const FaultSpec& f, int64_t iteration) {
  return f.every ? iteration >= f.iteration : iteration == f.iteration;
}

// The layer index of a qualified module name "decoder.layers.K.mlp..." (-1: none).
int64_t layer_of(const std::string& module) {
  constexpr std::string_view kPrefix = "decoder.layers.";
  if (module.rfind(kPrefix, 0) != 0) return -1;
  return std::strtoll(module.c_str() + kPrefix.size(), nullptr, 10);
}

}  // namespace

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
    if (!due(f, iteration) || f.rank != rank_) continue;
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
        if (!rerun || f.every) std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
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
      case FaultKind::CorruptCollective:
        if (rerun) break;
        fmt::print(stderr, "[inject-fault] rank {}: {}: the next all_reduce / all_gather / broadcast result is "
                   "corrupted\n", rank_, f.text);
        std::fflush(nullptr);
        comm::arm_result_corruption();
        break;
      case FaultKind::SlowData:
      case FaultKind::BadShard:
      case FaultKind::BadBatch: break;
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
    if (f.kind == FaultKind::SlowData && due(f, iteration) && f.rank == rank_)
      std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
}

bool FaultInjector::perturb_batch(int64_t iteration, int64_t m, Tensor& tokens, int64_t vocab) const {
  for (const FaultSpec& f : faults_) {
    if (f.kind != FaultKind::BadBatch || f.iteration != iteration || f.rank != rank_ || m != 0) continue;
    int32_t& t = tokens.data<int32_t>()[0];  // [s, b]: sample 0's first token
    const int32_t was = t;
    t = static_cast<int32_t>((t + 1) % vocab);
    fmt::print(stderr, "[inject-fault] rank {}: {}: microbatch 0's first token {} -> {}\n", rank_, f.text, was, t);
    std::fflush(nullptr);
    return true;
  }
  return false;
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
