// Fault injection (`mcpp train --inject-fault KIND[:OPTS]@ITER[:RANK]`, repeatable; issue 33 / experiment E12): a
// fault rehearsed on purpose, for the diagnosis tests and for users practising an incident. RANK defaults to 0
// (the global rank); ITER is the 1-based training iteration (the step that logs as "iteration ITER").
//   nan-grad:layer=K[,persistent]    layer K's MLP gradient (the gradient its backward returns, every microbatch)
//                                    becomes NaN; K is the index of decoder.layers.K (0-based, global). One-off:
//                                    the first run of ITER only (a re-run is clean: transient); persistent: the
//                                    re-run too (reproducible).
//   nan-output:layer=K[,persistent]  layer K's MLP forward output becomes NaN.
//   kill                             the rank dies (SIGKILL) at the start of ITER.
//   hang                             the rank stops calling collectives at the start of ITER (sleeps forever).
//   slow-data[:ms=N][,every]         the rank's data loader sleeps N ms (default 1000) per microbatch of ITER.
//   slow-rank[:ms=N][,every]         the rank sleeps N ms (default 1000) of "compute" at the start of ITER.
//                                    every: each iteration from ITER on (a steady slowdown: how bench/regress
//                                    timings is shown catching a regression), the re-run of a step too.
//   wrong-collective[:extra]         at the start of ITER every rank issues a drill all_reduce on the world group, this
//                                    rank with another shape (3 floats instead of 1): --check-collectives names the
//                                    mismatch. extra: only this rank issues it (a call no peer matches: a hang).
//   bad-shard                        after the checkpoint of ITER commits, one byte of this rank's shard file flips.
//   bad-batch                        the rank's first microbatch of ITER has its first token changed (t + 1 mod the
//                                    vocabulary: a rank reading a stale or another shard); --check-data-consistency
//                                    names it, otherwise it trains silently on other data than its TP/CP/PP peers.
//   corrupt-collective               the first all_reduce / all_gather / broadcast this rank completes in ITER gets the
//                                    lowest bit of its result's first byte flipped after the transport delivered it
//                                    (a silent data corruption: NIC, NVLink, memory); --flight-recorder-checksums
//                                    records it and `mcpp debug hang` names the first result that differs.
// A drill fires in a job's first attempt only (MCPP_RESTART_COUNT unset or 0: `mcpp launch --max-restarts`); one
// that could never fire in the run is refused at startup (fault_spec.h: check_fault_fits_run).
// The NaN kinds act through module scopes (core/module_trace.h's ScopeObserver): the injector is installed only
// while a NaN fault is due (begin_step), so healthy steps pay nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mcpp/core/module_trace.h"
#include "mcpp/training/fault_spec.h"

namespace mcpp {
namespace comm { class Communicator; }

class FaultInjector : public ScopeObserver {
 public:
  FaultInjector(std::vector<FaultSpec> faults, int rank);
  ~FaultInjector() override;
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;
  // At the start of iteration `iteration`'s step (rerun: the diagnosis re-run of it): kill / hang / slow-rank /
  // wrong-collective fire here (wrong-collective on `world`); a due NaN fault installs the scope observer.
  void begin_step(int64_t iteration, bool rerun, comm::Communicator& world);
  void end_step();                          // removes the scope observer
  void before_batch(int64_t iteration);     // slow-data (the data loader, per microbatch)
  // bad-batch: microbatch `m` of iteration `iteration`'s training batch, tokens [s, b] on the host (vocab: the
  // padded vocabulary size); true when it changed them.
  bool perturb_batch(int64_t iteration, int64_t m, Tensor& tokens, int64_t vocab) const;
  // After the checkpoint of `iteration` committed in `dir` (every rank): bad-shard flips a byte of a shard file this
  // rank wrote (its name is printed).
  void after_save(int64_t iteration, const std::string& dir);
  void on_output(const std::vector<const char*>& scopes, bool backward, const Tensor& t) override;

 private:
  std::vector<FaultSpec> faults_;
  int rank_;
  std::vector<const FaultSpec*> nan_due_;  // this step's NaN faults
  bool installed_ = false;
};

}  // namespace mcpp
