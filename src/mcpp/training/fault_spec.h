// --inject-fault KIND[:OPTS]@ITER[:RANK] values parsed into FaultSpec (the kinds and their meaning:
// fault_injection.h). Parsing only — no communicator, no tensors — so TrainingConfig::validate() can refuse a
// malformed value before anything starts.
#pragma once
#include <cstdint>
#include <string>

namespace mcpp {

enum class FaultKind { NanGrad, NanOutput, Kill, Hang, SlowData, SlowRank, WrongCollective, BadShard, BadBatch, CorruptCollective };
const char* fault_kind_name(FaultKind k);

struct FaultSpec {
  FaultKind kind = FaultKind::Kill;
  int64_t iteration = 0;
  int rank = 0;
  int64_t layer = -1;       // the NaN kinds
  bool persistent = false;  // the NaN kinds: also in the re-run of the step
  int64_t ms = 1000;        // slow-data / slow-rank
  bool extra = false;       // wrong-collective: a call only this rank issues (default: a shape mismatch)
  std::string text;         // as given
};
// One --inject-fault value; a malformed one is an mcpp::Error naming it and the grammar.
FaultSpec parse_fault_spec(const std::string& text);

}  // namespace mcpp
