// --rerun-on-cpu (trainer.h; docs/DEBUGGING.md, issue 33): after the same-rank re-run of a faulty step
// (trainer_diagnosis.cpp) the step runs a third time, in fp32 on CPU, to tell a numerics problem from a device fault.
//   The model: an fp32 CPU replica of this rank's chunks (build_model: the same layers in the same parallel layout, FP8
//   off), built at the first incident and kept. Its collectives run over pc_ on CPU ranks; on a GPU run over the same
//   layout's groups made from the world's host communicator (the MPI / TCP group NCCL was bootstrapped over: NCCL
//   takes device tensors only). Plain DDP (the re-run takes no optimizer step, so no distributed optimizer).
//   The weights: the latest committed checkpoint when it holds the end of the previous iteration (this run's save or
//   the loaded one), read from disk — a copy of the weights independent of the device's memory; otherwise (none, an
//   older one, or a failed read on any rank: the ranks agree) the pre-step state: the trainer's fp32 masters copied
//   to the host (with the distributed optimizer's sharded masters, each rank's shard summed over the sharding group:
//   every element has one owner, the others add zeros). The routers' expert biases likewise.
//   The step: the trainer's own forward_backward + the loss / grad reductions of train_step (the same schedule,
//   microbatches, grad scale, SP / embedding / DP reductions, per-token scaling) with the replica swapped in for the
//   model members (swap_cpu_replica), the batches recorded during the step (replay_batches_: the data the device saw,
//   an injected bad-batch included), the dropout streams at the step's start (the same Philox counters on both
//   backends) and a NanProbe; no --inject-fault NaN: an injected fault stands for the device's and does not follow
//   the step to the CPU.
//   Verdict (CpuRerun): non-finite — a module's output or gradient (the first over the world, named as the same-rank
//   re-run names it), or the loss or the grad norm — is a numerics problem reproducible in fp32 on CPU; finite is a
//   device or precision fault. A spiky-loss incident reproduces when the CPU loss spikes too.
// Collective over the world (every rank re-runs its slice). Costs host memory for the replica (checked at startup:
// require_cpu_replica_fits) and the CPU time of one step, only when a fault was detected.
#include <chrono>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/data_parallel.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/tools/memory_planner.h"
#include "mcpp/training/timeline.h"
#include "mcpp/training/trainer.h"

namespace mcpp {
namespace {
using Clock = std::chrono::steady_clock;

// The world's host communicator as a CommPtr: the world itself on the CPU backends; on NCCL its bootstrap group,
// aliasing the world (which owns it) so that it lives as long as this pointer.
comm::CommPtr host_world(const comm::CommPtr& world) {
  comm::Communicator& host = world->host();
  return &host == world.get() ? world : comm::CommPtr(world, &host);
}

// The replica's configuration: the run's, in fp32 (no bf16, no FP8 casts) without the distributed optimizer.
tools::PlanConfig replica_plan_config(const Config& c) {
  tools::PlanConfig p = c;
  p.bf16 = false;
  p.model.fp8_format.clear();
  p.parallel.use_distributed_optimizer = false;
  return p;
}

}  // namespace

void Trainer::require_cpu_replica_fits(int local_ranks) const {
  const tools::MemoryPlan plan = tools::plan_memory(replica_plan_config(config_));
  const tools::StageMemory& st = plan.stages.at(static_cast<size_t>(pc_.pp_rank()));
  const double replica = st.param_bytes + st.grad_bytes + static_cast<double>(st.peak_activation_bytes);
  const double own = device_ == Device::CPU && memory_plan_
                         ? memory_plan_->stages.at(static_cast<size_t>(pc_.pp_rank())).total_bytes() : 0.0;
  const double host = static_cast<double>(host_memory_bytes()) / local_ranks;
  if (own + replica <= host) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  fail("rerun_on_cpu: the fp32 CPU copy of pipeline rank {}'s model needs {:.2f} GiB (params + grads {:.2f}, "
       "activations {:.2f}){} but {} has {:.2f} GiB; drop --rerun-on-cpu or raise tensor / pipeline parallelism",
       pc_.pp_rank(), replica / kGiB, (st.param_bytes + st.grad_bytes) / kGiB,
       static_cast<double>(st.peak_activation_bytes) / kGiB,
       own > 0 ? fmt::format(" beside the model's own {:.2f} GiB", own / kGiB) : std::string(),
       local_ranks > 1 ? fmt::format("this rank's share of the host memory ({} ranks on this host)", local_ranks)
                       : std::string("the host memory"),
       host / kGiB);
}

void Trainer::swap_cpu_replica() {
  CpuReplica& r = *cpu_replica_;
  std::swap(pc_, r.pc);
  std::swap(chunks_, r.model.chunks);
  std::swap(ddps_, r.model.ddps);
  std::swap(expert_ddps_, r.model.expert_ddps);
  std::swap(device_, r.device);
  std::swap(param_dtype_, r.dtype);
  std::swap(timeline_, r.timeline);
  std::swap(stage_memory_, r.stage_memory);
  std::swap(moe_losses_, r.moe_losses);
  std::swap(mtp_losses_, r.mtp_losses);
}

void Trainer::copy_pre_step_state() {
  // fp32 masters: each parameter's main_param (= data with fp32 params), or with the distributed optimizer's
  // sharded masters this rank's pieces, summed over the sharding group below.
  std::unordered_map<const Parameter*, Parameter*> to_replica;
  std::vector<std::pair<ParamAndGradBuffer*, bool>> sharded;  // replica buffers to sum (expert: over expert-DP)
  for (size_t c = 0; c < chunks_.size(); ++c) {
    ModelChunk& src = *chunks_[c];
    ModelChunk& dst = *cpu_replica_->model.chunks.at(c);
    const std::vector<ParamAndGradBuffer*> sb = src.buffers(), db = dst.buffers();
    MCPP_CHECK(sb.size() == db.size(), "--rerun-on-cpu: chunk {} has {} buffers, its replica {}", c, sb.size(),
               db.size());
    for (size_t b = 0; b < sb.size(); ++b) {
      ParamAndGradBuffer& s = *sb[b];
      ParamAndGradBuffer& d = *db[b];
      MCPP_CHECK(s.params().size() == d.params().size(), "--rerun-on-cpu: buffer {} of chunk {}: {} vs {} params", b,
                 c, s.params().size(), d.params().size());
      if (!s.has_main_params()) {
        d.param_buffer().zero_();
        sharded.emplace_back(&d, src.has_expert_params() && sb[b] == &src.expert_params());
      }
      for (size_t i = 0; i < s.params().size(); ++i) {
        const Parameter& sp = *s.params()[i];
        Parameter& dp = *d.params()[i];
        MCPP_CHECK(sp.spec.key == dp.spec.key, "--rerun-on-cpu: parameter {} of the replica is {}", sp.spec.key,
                   dp.spec.key);
        if (s.has_main_params()) dp.data.copy_from(sp.main_param);  // device -> host, fp32
        else to_replica[&sp] = &dp;
      }
    }
    const std::vector<moe::TopKRouter*> sr = src.routers(), dr = dst.routers();
    for (size_t i = 0; i < sr.size() && i < dr.size(); ++i)
      if (sr[i]->has_expert_bias()) dr[i]->expert_bias().copy_from(sr[i]->expert_bias());
  }
  if (sharded.empty()) return;
  MCPP_CHECK(dist_optimizer_ && dist_optimizer_->main_params_sharded(),
             "--rerun-on-cpu: fp32 masters missing without a distributed optimizer that shards them");
  for (const ShardPiece& piece : dist_optimizer_->pieces()) {
    Parameter* dp = to_replica.at(piece.owner);
    Tensor dst = dp->data.flat_slice(piece.param_offset, {piece.numel});
    dst.copy_from(piece.param);
  }
  for (const auto& [buf, expert] : sharded)  // every element from its one owner (the others hold zeros)
    (expert ? pc_.expert_dp() : pc_.dp_cp())->host().all_reduce(buf->param_buffer(), comm::ReduceOp::Sum).wait();
}

void Trainer::load_cpu_replica(CpuRerun& r) {
  const int64_t want = step_iteration_ - 1;  // the step starts from this iteration's end state
  if (last_checkpoint_iteration_ == want) {
    std::string error;
    try {
      dist_checkpointing::CheckpointReader reader(last_checkpoint_dir_);
      reader.set_verify_checksums(!config_.training.no_verify_checksums);
      std::vector<ModelChunk*> chunks;
      for (const auto& c : cpu_replica_->model.chunks) chunks.push_back(c.get());
      read_model_chunks(reader, chunks);
    } catch (const std::exception& e) {
      error = e.what();
    }
    // A bad shard fails only the ranks that read it: every rank takes the same source.
    Tensor failed = Tensor::empty({1});
    failed.data<float>()[0] = error.empty() ? 0.0f : 1.0f;
    pc_.world()->host().all_reduce(failed, comm::ReduceOp::Max).wait();
    if (failed.data<float>()[0] == 0.0f) {
      r.state = "checkpoint";
      r.checkpoint = last_checkpoint_dir_;
      return;
    }
    r.why_state = error.empty() ? fmt::format("reading the checkpoint {} failed on another rank", last_checkpoint_dir_)
                                : fmt::format("reading the checkpoint failed: {}", error);
  } else if (last_checkpoint_iteration_ < 0) {
    r.why_state = "no checkpoint saved or loaded";
  } else {
    r.why_state = fmt::format("the latest checkpoint {} holds iteration {}, the step starts after iteration {}",
                              last_checkpoint_dir_, last_checkpoint_iteration_, want);
  }
  copy_pre_step_state();
  r.state = "pre-step state";
}

CpuRerun Trainer::rerun_on_cpu(RerunTrigger trigger, const tensor_parallel::RngTracker& rng_before) {
  const auto t0 = Clock::now();
  if (!cpu_replica_) {  // collective on NCCL runs (the host groups)
    const bool host_is_world = &pc_.world()->host() == pc_.world().get();
    parallel_state::ParallelContext pc =
        host_is_world ? pc_
                      : parallel_state::ParallelContext::create(host_world(pc_.world()),
                                                                parallel_state::parallel_options(config_.parallel));
    const tools::PlanConfig fp32 = replica_plan_config(config_);
    ModelReplica model = build_model(fp32.model, Device::CPU, DType::F32, pc, /*distributed_optimizer=*/false);
    cpu_replica_ = std::make_unique<CpuReplica>(CpuReplica{.pc = std::move(pc),
                                                           .model = std::move(model),
                                                           .device = Device::CPU,
                                                           .dtype = DType::F32,
                                                           .timeline = nullptr,
                                                           .stage_memory = {},
                                                           .moe_losses = moe::LossTracker(moe_losses_.num_layers()),
                                                           .mtp_losses = MtpLossTracker(mtp_losses_.depths())});
  }
  CpuRerun r;
  load_cpu_replica(r);
  const tensor_parallel::RngTracker rng_saved = state_.rng;
  state_.rng = rng_before;  // the step's dropout streams
  std::optional<NonFiniteFinding> mine;
  {
    swap_cpu_replica();
    struct SwapBack {  // also when the re-run throws
      Trainer* t;
      ~SwapBack() {
        t->nan_probe_ = nullptr;
        t->replay_batches_ = nullptr;
        t->swap_cpu_replica();
      }
    } back{this};
    replay_batches_ = &step_batches_;
    NanProbe probe(pc_.rank(), pc_.pp_rank());
    nan_probe_ = &probe;
    const StepLoss step = forward_backward(*train_ds_, state_.consumed_train_samples);
    nan_probe_ = nullptr;
    mine = probe.finding();
    const double loss = config_.model.calculate_per_token_loss ? scale_grads_per_token(step) : step.mean_loss;
    allreduce_sequence_parallel_grads(dense_buffers(), pc_);
    allreduce_embedding_grads(dense_buffers(), pc_, config_.model.last_stage_uses_word_embeddings());
    r.grad_norm = config_.model.num_moe_experts > 0 ? model_grad_norm(dense_buffers(), expert_buffers(), pc_)
                                                    : model_grad_norm(dense_buffers(), pc_);
    r.loss = world_max_loss(loss);
    r.findings = gather_findings(*pc_.world(), mine);
  }
  state_.rng = rng_saved;
  r.non_finite = r.findings.culprit.has_value() || !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  r.reproduces = r.non_finite || (trigger == RerunTrigger::SpikyLoss &&
                                  is_spiky_loss(r.loss, healthy_losses_, config_.training.spiky_loss_factor));
  r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (mine)  // every rank: its own finding in its per-rank metrics
    rank_metrics_.write({{"event", "cpu_rerun_finding"}, {"iteration", step_iteration_}, {"rank", pc_.rank()},
                         {"module", mine->module}, {"tensor", mine->tensor()}, {"layer", mine->layer},
                         {"microbatch", mine->microbatch}});
  return r;
}

}  // namespace mcpp
