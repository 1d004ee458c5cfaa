// Trainer setup (trainer.h): the constructor — device and precision checks, the memory plan (printed, and on a GPU
// checked against the device before anything is allocated), the datasets (trainer_data.cpp), one GPTModel chunk per
// virtual pipeline stage with its DistributedDataParallel (dense, and the MoE experts' over expert-DP: build_model,
// which also builds --rerun-on-cpu's fp32 CPU copy), the optimizer (Adam, or the DistributedOptimizer over every
// chunk's buffers), the LR scheduler, the dropout RNG streams, an optional checkpoint load (and the --save directory's
// lock and clean-up), and the metrics writer (last rank) — plus the small accessors the other trainer files share
// (buffers, DDPs, the model-state bytes, dp_mean). The rest of the Trainer: trainer_data.cpp (datasets and batches),
// trainer_step.cpp (one training step), trainer_loop.cpp (the loop and evaluation), trainer_checkpoint.cpp (saves),
// trainer_reports.cpp (the log line's MoE / MTP losses, the end-of-training reports).
#include "mcpp/training/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/async_save.h"
#include "mcpp/dist_checkpointing/retention.h"
#include "mcpp/distributed/data_parallel.h"
#include "mcpp/kernels/op_profile.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/optimizer/lr_scheduler.h"
#include "mcpp/pipeline_parallel/layout.h"
#include "mcpp/training/flops.h"
#include "mcpp/training/process_settings.h"
#include "mcpp/training/provenance.h"
#include "mcpp/training/timeline.h"

namespace mcpp {
namespace {
using Clock = std::chrono::steady_clock;

// Ranks sharing this host's memory, from the launcher's environment (Open MPI, MPICH / Hydra, Slurm, mcpp launch:
// single-node, so all of its ranks); 1 when unknown.
int local_ranks_on_this_host() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE", "MCPP_WORLD_SIZE"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 0) return std::atoi(s);
  return 1;
}
}  // namespace

Device resolve_training_device(const TrainingConfig& t) {
  if (t.device == "cpu") return Device::CPU;
  if (t.device == "cuda") {
    if (!cuda_available()) fail("device: cuda requested but no CUDA device is visible (or this build has no CUDA)");
    return Device::CUDA;
  }
  return cuda_available() ? Device::CUDA : Device::CPU;  // auto
}

Trainer::Trainer(const Config& config, int64_t eod_token, parallel_state::ParallelContext pc)
    : config_(config), pc_(std::move(pc)), moe_losses_(config_.model.num_layers + config_.model.mtp_num_layers),
      mtp_losses_(config_.model.mtp_num_layers) {
  const auto& t = config_.training;
  device_ = resolve_training_device(t);
  apply_process_settings(config_);  // --deterministic-mode: GEMM autotuning off in this process
  if (t.fp16) fail("fp16: training in float16 needs a dynamic loss scaler, which is not implemented; use --bf16");
  if (t.bf16 && device_ != Device::CUDA)
    fail("bf16: mixed-precision training needs the CUDA backend (device resolved to cpu; the CPU trainer runs fp32)");
  if (config_.parallel.expert_model_parallel_size > 1 && config_.model.num_moe_experts == 0)
    fail("expert_model_parallel_size ({}): the model has no mixture-of-experts layers to distribute (set "
         "--num-experts), so expert parallelism would only replicate work; drop --expert-model-parallel-size",
         config_.parallel.expert_model_parallel_size);
  if (t.enable_cuda_graph) {
    if (device_ != Device::CUDA)
      fail("enable_cuda_graph: CUDA graphs need the CUDA backend (device resolved to cpu)");
    if (ops::op_profile_enabled())
      fail("enable_cuda_graph: MCPP_PROFILE_OPS times every op between synchronizations, which a captured "
           "step cannot do; unset it or drop --enable-cuda-graph");
    step_graph_ = std::make_unique<CudaGraph>();
    graph_warmup_left_ = t.cuda_graph_warmup_steps;
  }
  param_dtype_ = t.bf16 ? DType::BF16 : DType::F32;
  if (!t.inject_fault.empty()) {  // --inject-fault (fault_injection.h): parsed in validate(), fitted to the run here
    const pipeline_parallel::PipelineLayout layout =
        pipeline_parallel::make_pipeline_layout(pipeline_parallel::layout_options(config_.model, config_.parallel));
    const FaultRun run{.world_size = pc_.world_size(), .num_layers = config_.model.num_layers,
                       .train_iters = t.train_iters, .skip_train = t.skip_train, .saves = !t.save.empty(),
                       .save_interval = t.save_interval, .exit_interval = t.exit_interval,
                       .layers_held = [&](int rank) {
                         std::vector<int64_t> held;
                         for (const pipeline_parallel::StageLayers& st :
                              layout.stages.at(static_cast<size_t>(pc_.layout().coordinates(rank).pp)))
                           held.insert(held.end(), st.layers.begin(), st.layers.end());
                         return held;
                       }};
    std::vector<FaultSpec> faults;
    for (const std::string& f : t.inject_fault) {
      faults.push_back(parse_fault_spec(f));
      check_fault_fits_run(faults.back(), run);
    }
    faults_ = std::make_unique<FaultInjector>(std::move(faults), pc_.rank());
  }
  open_outputs();
  const auto& par = config_.parallel;
  if (is_logging_rank())
    fmt::print("{}\n", format_memory_report(memory_report(pc_.dp_size(), par.use_distributed_optimizer, param_dtype_,
                                                          pc_.cp_size())));
  memory_plan_ = tools::plan_memory(config_);
  if (is_logging_rank()) {  // Megatron's "theoretical memory footprints", per pipeline rank
    for (const tools::StageMemory& st : memory_plan_->stages)
      fmt::print("memory plan (pp rank {}): model state {} + peak activations {} ({} microbatch contexts in "
                 "flight) = {}, before transient buffers\n",
                 st.pp_rank, tools::format_bytes(st.model_state_bytes()),
                 tools::format_bytes(static_cast<double>(st.peak_activation_bytes)), st.in_flight,
                 tools::format_bytes(st.total_bytes()));
  }
  // Before anything is allocated: a plan above the GPU's memory would run out of it minutes later; on CPU ranks a
  // plan above this rank's share of the host memory would end in std::bad_alloc or swap for minutes.
  if (device_ == Device::CUDA) {
    tools::require_fits(config_, *memory_plan_, pc_.pp_rank(), static_cast<double>(cuda_total_memory_bytes()),
                        "the GPU");
  } else {
    const int local = local_ranks_on_this_host();
    tools::require_fits(config_, *memory_plan_, pc_.pp_rank(), static_cast<double>(host_memory_bytes()) / local,
                        local > 1 ? fmt::format("this rank's share of the host memory ({} ranks on this host)", local)
                                  : std::string("the host memory"));
  }
  if (t.rerun_on_cpu) require_cpu_replica_fits(local_ranks_on_this_host());  // its fp32 CPU copy, at an incident
  build_datasets(eod_token);
  {
    ModelReplica m = build_model(config_.model, device_, param_dtype_, pc_, par.use_distributed_optimizer);
    chunks_ = std::move(m.chunks);
    ddps_ = std::move(m.ddps);
    expert_ddps_ = std::move(m.expert_ddps);
  }
  if (par.use_distributed_optimizer) {
    // One DDP per chunk, one optimizer over all chunks' buffers (Megatron's virtual-stage setup).
    std::vector<DistributedDataParallel*> ddps;
    for (auto& d : ddps_) ddps.push_back(d.get());
    for (auto& d : expert_ddps_)
      if (d) ddps.push_back(d.get());
    dist_optimizer_ = std::make_unique<DistributedOptimizer>(
        ddps, DistributedOptimizerOptions{.adam = adam_options_from(config_.optimizer),
                                          .overlap_param_gather = config_.ddp.overlap_param_gather,
                                          .moe_model = config_.model.num_moe_experts > 0});
  } else {
    std::vector<AdamParam> adam_params;
    for (const auto& chunk : chunks_)
      for (ParamAndGradBuffer* buf : chunk->buffers())
        for (const auto& p : buf->params())
          adam_params.push_back({.name = p->spec.key, .param = p->main_param, .main_grad = p->main_grad,
                                 .no_weight_decay = p->spec.no_weight_decay,
                                 .model_param = buf->mixed_precision() ? p->data : Tensor()});
    optimizer_ = std::make_unique<Adam>(std::move(adam_params), adam_options_from(config_.optimizer));
  }
  scheduler_ = std::make_unique<OptimizerParamScheduler>(OptimizerParamScheduler::from_config(
      config_.optimizer, config_.training.global_batch_size, config_.training.train_samples > 0));
  // Dropout streams: seeded by --seed (Megatron's offsets per TP/PP rank); offsets are checkpointed.
  state_.rng = tensor_parallel::RngTracker(static_cast<uint64_t>(t.seed), pc_.tp_rank(), pc_.pp_rank());

  if (!t.load.empty()) {
    LoadOptions lo{.load_optimizer = !t.no_load_optim && !t.finetune,
                   .load_rng = !t.no_load_rng && !t.finetune,
                   .finetune = t.finetune,
                   .override_config_check = t.override_config_check,
                   .verify_checksums = !t.no_verify_checksums};
    uint64_t bytes_read = 0;
    lo.bytes_read = &bytes_read;
    const auto t0 = Clock::now();
    if (load_training_checkpoint(t.load, config_, chunk_ptrs(), optimizer_ref(), state_, lo, &pc_)) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (!t.finetune && !state_.scheduler.empty()) scheduler_->load_state_dict(state_.scheduler);
      last_checkpoint_dir_ = dist_checkpointing::resolve_checkpoint_dir(t.load);  // (--rerun-on-cpu's source)
      last_checkpoint_iteration_ = state_.iteration;  // 0 with --finetune: its weights start this run
      if (is_logging_rank())
        spdlog::info("loaded checkpoint from {} at iteration {} in {:.1f} ms ({} bytes read by this rank)", t.load,
                     state_.iteration, ms, bytes_read);
    } else if (is_logging_rank()) {
      spdlog::warn("no checkpoint found in '{}': training from scratch", t.load);
    }
  }
  if (!t.save.empty() && pc_.rank() == 0) {
    // The save directory is this job's for its lifetime (a second live job is refused); then what dead jobs
    // left behind goes (no save of this job is in flight yet).
    save_lock_ = dist_checkpointing::SaveDirLock::acquire(t.save);
    if (!save_lock_.held())
      spdlog::warn("the filesystem of --save {} has no file locks: another job saving there would not be noticed",
                   t.save);
    for (const std::string& p : dist_checkpointing::remove_stale_staging(t.save))
      spdlog::warn("removed stale checkpoint path {} (left by an interrupted save or deletion)", p);
  }
  if (t.async_save) async_saver_ = std::make_unique<dist_checkpointing::AsyncCheckpointSaver>(pc_.world());
  if (memory_plan_ && is_logging_rank()) metrics_.write(tools::to_json(*memory_plan_));

}

Trainer::ModelReplica Trainer::build_model(const TransformerConfig& model, Device device, DType dtype,
                                           const parallel_state::ParallelContext& pc,
                                           bool distributed_optimizer) const {
  // Layer placement for this pipeline rank: one model chunk per virtual stage.
  const auto& par = config_.parallel;
  ModelReplica r;
  const pipeline_parallel::PipelineLayout layout =
      pipeline_parallel::make_pipeline_layout(pipeline_parallel::layout_options(model, par));
  for (int64_t v = 0; v < layout.virtual_pipeline_model_parallel_size; ++v) {
    const pipeline_parallel::StageLayers& st = layout.at(pc.pp_rank(), v);
    const int64_t first = st.layers.empty() ? 0 : st.layers.front();
    r.chunks.push_back(std::make_unique<ModelChunk>(
        model, static_cast<uint64_t>(config_.training.seed),
        tensor_parallel::TPContext{pc.tp(), par.sequence_parallel, par.tp_comm_overlap, pc.cp(),
                                   par.cp_ring(), pc.ep_size() > 1 ? pc.ep() : nullptr,
                                   pc.expert_tp_size() > 1 ? pc.expert_tp() : nullptr},
        device,
        GPTModelStage{.pre_process = st.pre_process, .post_process = st.post_process, .first_layer = first,
                      .num_layers = static_cast<int64_t>(st.layers.size())},
        dtype));
    const DdpOptions ddp_opt{.bucket_size = config_.ddp.ddp_bucket_size,
                             .overlap_grad_reduce = config_.ddp.overlap_grad_reduce,
                             .use_distributed_optimizer = distributed_optimizer};
    ModelChunk& chunk = *r.chunks.back();
    chunk.params().set_overwrite_main_grad(config_.ddp.overwrite_main_grad);
    r.ddps.push_back(std::make_unique<DistributedDataParallel>(chunk.params(), pc, ddp_opt));
    // MoE experts: their own buffer, reduced over expert-DP (the distributed optimizer shards it there).
    r.expert_ddps.emplace_back();
    if (chunk.has_expert_params()) {
      chunk.expert_params().set_overwrite_main_grad(config_.ddp.overwrite_main_grad);
      DdpOptions eo = ddp_opt;
      eo.expert_parallel = true;  // over expert-DP (= DP at EP 1 without TP / CP), Megatron's expert scaling
      r.expert_ddps.back() = std::make_unique<DistributedDataParallel>(chunk.expert_params(), pc, eo);
    }
  }
  return r;
}

void Trainer::open_outputs() {
  const auto& t = config_.training;
  std::string metrics_path = t.metrics_path;
  if (metrics_path.empty() && !t.save.empty()) metrics_path = t.save + "/metrics.jsonl";
  metrics_path_ = metrics_path;
  const nlohmann::json prov = {{"event", "provenance"}, {"rank", pc_.rank()}, {"world_size", pc_.world_size()},
                               {"provenance", provenance()}};
  if (is_logging_rank()) {
    metrics_ = MetricsWriter(metrics_path);
    metrics_.write(prov);
    tensorboard_ = tensorboard::SummaryWriter(t.tensorboard_dir);
  }
  if (t.per_rank_metrics && !metrics_path.empty()) {
    rank_metrics_ = MetricsWriter(rank_metrics_path(metrics_path, pc_.rank()));
    rank_metrics_.write(prov);
  }
  timers_ = std::make_unique<Timers>(static_cast<int>(t.timing_log_level), device_ == Device::CUDA);
  peak_tflops_ = peak_tflops(t.peak_tflops, device_ == Device::CUDA ? cuda_device_name() : "", t.bf16);
}

Trainer::~Trainer() = default;

int64_t Trainer::model_state_bytes() const {
  int64_t b = 0;
  for (ParamAndGradBuffer* buf : buffers())
    b += static_cast<int64_t>(buf->param_buffer().nbytes() + buf->grad_buffer().nbytes() +
                              (buf->mixed_precision() && buf->has_main_params() ? buf->main_param_buffer().nbytes() : 0));
  if (optimizer_)
    for (const AdamState& s : optimizer_->state()) b += static_cast<int64_t>(s.exp_avg.nbytes() + s.exp_avg_sq.nbytes());
  if (dist_optimizer_) b += dist_optimizer_->state_bytes();
  return b;
}

std::vector<ModelChunk*> Trainer::chunk_ptrs() const {
  std::vector<ModelChunk*> out;
  for (const auto& c : chunks_) out.push_back(c.get());
  return out;
}

double Trainer::dp_mean(double local) const {
  if (pc_.dp_size() == 1) return local;
  Tensor t = Tensor::empty({1});
  t.data<float>()[0] = static_cast<float>(local);
  pc_.dp()->host().all_reduce(t, comm::ReduceOp::Avg).wait();
  return t.data<float>()[0];
}

std::vector<ParamAndGradBuffer*> Trainer::buffers() const {
  std::vector<ParamAndGradBuffer*> out;
  for (const auto& c : chunks_)
    for (ParamAndGradBuffer* b : c->buffers()) out.push_back(b);
  return out;
}

std::vector<ParamAndGradBuffer*> Trainer::dense_buffers() const {
  std::vector<ParamAndGradBuffer*> out;
  for (const auto& c : chunks_) out.push_back(&c->params());
  return out;
}

std::vector<ParamAndGradBuffer*> Trainer::expert_buffers() const {
  std::vector<ParamAndGradBuffer*> out;
  for (const auto& c : chunks_)
    if (c->has_expert_params()) out.push_back(&c->expert_params());
  return out;
}

std::vector<DistributedDataParallel*> Trainer::all_ddps() const {
  std::vector<DistributedDataParallel*> out;
  for (const auto& d : ddps_) out.push_back(d.get());
  for (const auto& d : expert_ddps_)
    if (d) out.push_back(d.get());
  return out;
}

}  // namespace mcpp
