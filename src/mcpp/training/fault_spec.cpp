// --inject-fault's grammar; contract in fault_spec.h.
#include "mcpp/training/fault_spec.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <string>
#include <string_view>

#include "mcpp/core/error.h"

namespace mcpp {
namespace {

constexpr const char* kGrammar =
    "KIND[:OPTS]@ITER[:RANK] with KIND nan-grad:layer=K[,persistent] | nan-output:layer=K[,persistent] | kill | hang "
    "| slow-data[:ms=N][,every] | slow-rank[:ms=N][,every] | wrong-collective[:extra] | bad-shard | bad-batch "
    "| corrupt-collective";

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
    else if (slow && key == "every" && eq == std::string_view::npos) f.every = true;
    else if (f.kind == FaultKind::WrongCollective && key == "extra" && eq == std::string_view::npos) f.extra = true;
    else fail("--inject-fault '{}': unknown option '{}' for {} ({})", f.text, o, fault_kind_name(f.kind), kGrammar);
  }
  if (nan && f.layer < 0) fail("--inject-fault '{}': {} needs layer=K ({})", f.text, fault_kind_name(f.kind), kGrammar);
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
    case FaultKind::BadBatch: return "bad-batch";
    case FaultKind::CorruptCollective: return "corrupt-collective";
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
                      FaultKind::SlowRank, FaultKind::WrongCollective, FaultKind::BadShard, FaultKind::BadBatch,
                      FaultKind::CorruptCollective})
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

void check_fault_fits_run(const FaultSpec& f, const FaultRun& run) {
  const char* kind = fault_kind_name(f.kind);
  if (f.rank >= run.world_size)
    fail("--inject-fault '{}': rank {} is outside the world of {} ranks", f.text, f.rank, run.world_size);
  if (run.skip_train) fail("--inject-fault '{}': --skip-train runs no training iteration to inject it in", f.text);
  if (f.iteration > run.train_iters)
    fail("--inject-fault '{}': iteration {} is beyond the run's last iteration, {} (--train-iters / --train-samples)",
         f.text, f.iteration, run.train_iters);
  if (f.kind == FaultKind::NanGrad || f.kind == FaultKind::NanOutput) {
    if (f.layer >= run.num_layers)
      fail("--inject-fault '{}': layer {} is outside the model's {} decoder layers (decoder.layers.0..{})", f.text,
           f.layer, run.num_layers, run.num_layers - 1);
    const auto holds = [&](int r) {
      const std::vector<int64_t> held = run.layers_held(r);
      return std::find(held.begin(), held.end(), f.layer) != held.end();
    };
    if (run.layers_held && !holds(f.rank)) {
      int owner = 0;
      while (owner < run.world_size && !holds(owner)) ++owner;
      fail("--inject-fault '{}': rank {}'s pipeline stage does not hold decoder layer {} (rank {}'s does: aim it "
           "with @{}:{})", f.text, f.rank, f.layer, owner, f.iteration, owner);
    }
  }
  if (f.kind == FaultKind::BadShard) {
    if (!run.saves) fail("--inject-fault '{}': {} corrupts a saved checkpoint; give --save", f.text, kind);
    const auto multiple = [&](int64_t interval) { return interval > 0 && f.iteration % interval == 0; };
    if (!multiple(run.save_interval) && !multiple(run.exit_interval) && f.iteration != run.train_iters)
      fail("--inject-fault '{}': no checkpoint is saved at iteration {} (--save-interval {}, --train-iters {})",
           f.text, f.iteration, run.save_interval, run.train_iters);
  }
  const bool needs_peer =
      f.kind == FaultKind::Hang || f.kind == FaultKind::WrongCollective || f.kind == FaultKind::CorruptCollective;
  if (needs_peer && run.world_size < 2)
    fail("--inject-fault '{}': {} needs at least 2 ranks (a peer to wait for, mismatch or compare with); the world "
         "has 1", f.text, kind);
}

}  // namespace mcpp
