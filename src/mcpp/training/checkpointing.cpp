#include "mcpp/training/checkpointing.h"

#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/sharded_save.h"
#include "mcpp/dist_checkpointing/sharded_tensor.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/pipeline_parallel/layout.h"
#include "mcpp/training/provenance.h"

#include <utility>
#include <vector>

namespace mcpp {

namespace dc = dist_checkpointing;

namespace {

constexpr const char* kExpAvg = "optimizer.exp_avg.";
constexpr const char* kExpAvgSq = "optimizer.exp_avg_sq.";

// meta.<name> as a non-negative integer, or an error naming the checkpoint and the field (a negative or
// non-integer count would silently move the data cursor or the Adam step).
int64_t meta_count(const nlohmann::json& meta, const std::string& name, const std::string& dir) {
  const auto it = meta.find(name);
  if (it == meta.end()) fail("checkpoint '{}': manifest meta lacks '{}'", dir, name);
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    fail("checkpoint '{}': manifest meta.{} must be a non-negative integer, got {}", dir, name, it->dump());
  return it->get<int64_t>();
}

// meta.optimizer.step of a checkpoint that holds optimizer state.
int64_t optimizer_step(const nlohmann::json& meta, const std::string& dir) {
  const nlohmann::json& o = meta.at("optimizer");
  if (!o.is_object()) fail("checkpoint '{}': manifest meta.optimizer must be an object, got {}", dir, o.type_name());
  const auto it = o.find("step");
  if (it == o.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
    fail("checkpoint '{}': manifest meta.optimizer.step must be a non-negative integer, got {}", dir,
         it == o.end() ? std::string("nothing") : it->dump());
  return it->get<int64_t>();
}

// meta.optimizer claims a step: the state of every parameter must be there (not silently left at zero).
void require_optimizer_state(const dc::CheckpointReader& reader, const std::string& param) {
  for (const std::string& k : {kExpAvg + param, kExpAvgSq + param})
    if (!reader.has(k))
      fail("checkpoint '{}' has no optimizer state '{}' although meta.optimizer claims a step (an incomplete "
           "checkpoint); --no-load-optim loads the weights only", reader.dir(), k);
}

// Refuses a checkpoint whose model math differs from `config`, naming the fields.
void check_fingerprint(const nlohmann::json& meta, const Config& config, const std::string& dir, bool override_check) {
  // Checkpoints written by `mcpp ckpt import` carry only the config: derive its math fields.
  nlohmann::json saved;
  if (meta.contains("math_fields")) {
    saved = meta["math_fields"];
  } else if (meta.contains("config")) {
    Config c = Config::from_json(meta["config"]);
    c.finalize();
    saved = c.math_fields();
  } else {
    fail("checkpoint '{}': manifest meta holds neither math_fields nor config", dir);
  }
  if (meta.value("fingerprint", "") == config.fingerprint()) return;
  std::vector<std::string> diff = diff_math_fields(saved, config.math_fields());
  if (diff.empty()) return;  // same fields, fingerprint of an older encoding: accept
  std::string what = fmt::format("{}", fmt::join(diff, "; "));
  if (!override_check)
    fail("checkpoint '{}' was saved for a different model (checkpoint vs now: {}); "
         "--override-config-check loads it anyway",
         dir, what);
  spdlog::warn("loading checkpoint '{}' of a different model because of --override-config-check: {}", dir, what);
}

// Ownership of replicated data (docs/CHECKPOINT_FORMAT.md, "Who writes what"): a tensor replicated
// over DP (x CP) is written by dp_cp rank h % dp_cp (an expert's parameter, replicated over expert-DP only, by
// expert-DP rank h % edp); one also replicated over TP by TP rank (h >> 32) % tp (an expert's, over expert-TP, by
// expert-TP rank (h >> 32) % etp); h = xxh3(key). This spreads the save work over the replicas, deterministically
// for every rank.
struct Owner : SaveOwnership {
  bool writes_replica(const std::string& key, const ParamSpec& spec) const {
    return spec.expert ? hash(key) % edp == static_cast<uint64_t>(edp_rank)
                       : hash(key) % dp == static_cast<uint64_t>(dp_rank);
  }
  bool writes_tp_replica(const std::string& key, const ParamSpec& spec) const {
    if (spec.shard.partitioned()) return true;
    return spec.expert ? (hash(key) >> 32) % etp == static_cast<uint64_t>(etp_rank)
                       : (hash(key) >> 32) % tp == static_cast<uint64_t>(tp_rank);
  }
  static uint64_t hash(const std::string& key) { return dc::xxh3_bytes(key.data(), key.size()); }
};

// Parameter specs of every chunk by key (a tied output weight's shared copy is found after the owner).
const ParamSpec& spec_of(const std::vector<ModelChunk*>& chunks, const std::string& key) {
  for (ModelChunk* c : chunks)
    for (ParamAndGradBuffer* b : c->buffers())
      if (const Parameter* p = b->find(key)) return p->spec;
  fail("no model chunk of this rank holds parameter '{}'", key);
}

// The coordinates that key a rank's RNG state in meta.rng_per_rank.
std::string rng_rank_key(const parallel_state::ParallelContext& pc) {
  return fmt::format("tp{}.pp{}.dp{}.cp{}", pc.tp_rank(), pc.pp_rank(), pc.dp_rank(), pc.cp_rank());
}

nlohmann::json parallel_meta(const Config& config, const parallel_state::ParallelContext& pc, bool distributed) {
  const int64_t vp =
      pipeline_parallel::make_pipeline_layout(pipeline_parallel::layout_options(config.model, config.parallel))
          .virtual_pipeline_model_parallel_size;
  return {{"world_size", pc.world_size()}, {"tp", pc.tp_size()}, {"pp", pc.pp_size()}, {"vp", vp},
          {"dp", pc.dp_size()}, {"cp", pc.cp_size()}, {"distributed_optimizer", distributed}};
}

// This rank's TP shard of `key` as global-offset shards (one per segment).
void add_tp_shards(std::vector<dc::ShardedTensor>& out, const std::string& key, const Tensor& local,
                   const ParamSpec& spec) {
  Tensor host = local.is_cpu() ? local : local.to(Device::CPU);
  for (const auto& lg : dc::tp_shard_rects(spec.shape, spec.shard))
    out.push_back({key, spec.global_shape(), lg.global, dc::extract_rect(host, lg.local)});
}

// Flat index range [first, last] of rect r in a row-major tensor of `shape`.
std::pair<int64_t, int64_t> flat_span(const Shape& shape, const dc::Rect& r) {
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    first = first * shape[d] + r.offset[d];
    last = last * shape[d] + r.offset[d] + r.shape[d] - 1;
  }
  return {first, last};
}

// The local rects of a distributed-optimizer piece [offset, offset + numel) of the flat TP-local tensor,
// split at TP segments, each with its range in the piece. Each is contiguous in the flat order: a
// flat-range rect is [fixed leading indices][a range in one dim][full trailing dims], and segments
// split it only along partition_dim, which is that range dim (fc1) or a fixed one.
struct PieceRect {
  dc::LocalGlobalRect lg;
  int64_t piece_begin = 0;  // of the rect's elements in the piece
};
std::vector<PieceRect> piece_rects(const std::string& key, const ParamSpec& spec, int64_t offset, int64_t numel) {
  std::vector<PieceRect> out;
  for (const dc::Rect& r : dc::flat_range_rects(spec.shape, offset, offset + numel)) {
    for (const auto& lg : dc::local_rect_to_global(r, spec.shape, spec.shard)) {
      auto [first, last] = flat_span(spec.shape, lg.local);
      MCPP_CHECK(last - first + 1 == lg.local.numel(), "'{}': piece rect {} at {} is not contiguous", key,
                 shape_str(lg.local.shape), shape_str(lg.local.offset));
      out.push_back({lg, first - offset});
    }
  }
  return out;
}

// A distributed-optimizer piece as global-offset shards of the logical tensor.
void add_piece_shards(std::vector<dc::ShardedTensor>& out, const std::string& key, const std::string& param_key,
                      const Tensor& piece, int64_t offset, const ParamSpec& spec) {
  Tensor host = piece.is_cpu() ? piece : piece.to(Device::CPU);
  for (const PieceRect& pr : piece_rects(param_key, spec, offset, piece.numel()))
    out.push_back({key, spec.global_shape(), pr.lg.global,
                   host.flat_slice(pr.piece_begin, pr.lg.local.shape).clone()});
}

// Reads this rank's TP shard of `key` (any saved layout) into dst [spec.shape], any device.
void read_shard(const dc::CheckpointReader& reader, const std::string& key, const ParamSpec& spec, const Tensor& dst) {
  if (!reader.has(key)) fail("checkpoint '{}' has no tensor '{}' (the model needs it)", reader.dir(), key);
  const dc::ManifestEntry& e = reader.entry(key);
  if (e.global_shape != spec.global_shape())
    fail("checkpoint '{}': tensor '{}' has shape {}, the model needs {}", reader.dir(), key,
         shape_str(e.global_shape), shape_str(spec.global_shape()));
  Tensor host = dst.is_cpu() ? dst : Tensor::empty(spec.shape, dst.dtype(), Device::CPU);
  for (const auto& lg : dc::tp_shard_rects(spec.shape, spec.shard)) {
    if (lg.local.shape == spec.shape) {
      reader.read_region(key, lg.global.offset, host);
      continue;
    }
    Tensor part = Tensor::empty(lg.local.shape, dst.dtype(), Device::CPU);
    reader.read_region(key, lg.global.offset, part);
    dc::copy_rect(host.raw(), spec.shape, lg.local.offset, part.raw(), part.shape(), Shape(part.shape().size(), 0),
                  part.shape(), dtype_size(part.dtype()));
  }
  if (!dst.is_cpu()) {
    Tensor target = dst;
    target.copy_from(host);
  }
}

// Reads a distributed-optimizer piece [offset, offset + dst.numel()) of this rank's flat TP-local tensor of
// `key` (dst [numel], any device), rect by rect.
void read_piece(const dc::CheckpointReader& reader, const std::string& key, const std::string& param_key,
                const ParamSpec& spec, int64_t offset, const Tensor& dst) {
  const dc::ManifestEntry& e = reader.entry(key);
  if (e.global_shape != spec.global_shape())
    fail("checkpoint '{}': tensor '{}' has shape {}, the model needs {}", reader.dir(), key,
         shape_str(e.global_shape), shape_str(spec.global_shape()));
  Tensor host = dst.is_cpu() ? dst : Tensor::empty(dst.shape(), dst.dtype(), Device::CPU);
  for (const PieceRect& pr : piece_rects(param_key, spec, offset, dst.numel()))
    reader.read_region(key, pr.lg.global.offset, host.flat_slice(pr.piece_begin, pr.lg.local.shape));
  if (!dst.is_cpu()) {
    Tensor target = dst;
    target.copy_from(host);
  }
}

}  // namespace

SaveOwnership save_ownership(const parallel_state::ParallelContext& pc) {
  return {.dp = pc.dp_cp()->size(), .dp_rank = pc.dp_cp()->rank(), .tp = pc.tp_size(), .tp_rank = pc.tp_rank(),
          .edp = pc.expert_dp()->size(), .edp_rank = pc.expert_dp()->rank(), .etp = pc.expert_tp_size(),
          .etp_rank = pc.expert_tp_rank()};
}

// Model tensors are the fp32 main params (= the params with fp32 training); with mixed precision the
// bf16 model copy is then the rounded master, as after an optimizer step. When the distributed optimizer
// holds the masters (sharded), each tensor is read once into a scratch fp32 copy, rounded into the model copy,
// and this rank's pieces of it copied into the optimizer's master shard.
void read_model_chunks(const dc::CheckpointReader& reader, const std::vector<ModelChunk*>& chunks,
                       const DistributedOptimizer* optimizer) {
  std::unordered_map<const Parameter*, std::vector<const ShardPiece*>> pieces;
  if (optimizer)
    for (const ShardPiece& pc : optimizer->pieces()) pieces[pc.owner].push_back(&pc);
  std::vector<ParamAndGradBuffer*> buffers;  // every chunk's, dense and expert
  for (ModelChunk* c : chunks)
    for (ParamAndGradBuffer* b : c->buffers()) buffers.push_back(b);
  for (ParamAndGradBuffer* bp : buffers) {
    ParamAndGradBuffer& buf = *bp;
    if (buf.has_main_params()) {
      for (const auto& p : buf.params()) read_shard(reader, p->spec.key, p->spec, p->main_param);
      if (buf.mixed_precision()) ops::cast(buf.param_buffer(), buf.main_param_buffer());
      continue;
    }
    if (!optimizer || !optimizer->main_params_sharded())
      fail("checkpoint '{}': the model's fp32 main params are sharded by a distributed optimizer that was not given",
           reader.dir());
    for (const auto& p : buf.params()) {
      Tensor master = Tensor::empty(p->spec.shape, DType::F32, p->data.device());
      read_shard(reader, p->spec.key, p->spec, master);
      ops::cast(p->data, master);
      for (const ShardPiece* pc : pieces[p.get()]) {
        Tensor dst = pc->param;  // a view of the optimizer's master shard
        dst.copy_from(master.flat_slice(pc->param_offset, {pc->numel}));
      }
    }
  }
  for (ModelChunk* c : chunks)  // the routers' expert biases (collect_checkpoint_shards)
    for (moe::TopKRouter* r : c->routers())
      if (r->has_expert_bias())
        read_shard(reader, r->expert_bias_key(),
                   ParamSpec{.key = r->expert_bias_key(), .shape = r->expert_bias().shape()}, r->expert_bias());
}

void read_adam_state(const dc::CheckpointReader& reader, const std::vector<ModelChunk*>& chunks, Adam& adam) {
  const nlohmann::json& meta = reader.meta();
  if (!meta.contains("optimizer") || meta.at("optimizer").is_null())
    fail("checkpoint '{}' holds no optimizer state; use --no-load-optim (or --finetune) to load weights only",
         reader.dir());
  adam.load_state(optimizer_step(meta, reader.dir()),
                  [&](const std::string& name, Tensor& exp_avg, Tensor& exp_avg_sq) {
                    require_optimizer_state(reader, name);
                    const ParamSpec& spec = spec_of(chunks, name);
                    read_shard(reader, kExpAvg + name, spec, exp_avg);
                    read_shard(reader, kExpAvgSq + name, spec, exp_avg_sq);
                    return true;
                  });
}

std::vector<dc::ShardedTensor> collect_checkpoint_shards(const std::vector<ModelChunk*>& chunks, OptimizerRef optimizer,
                                                         const SaveOwnership& ownership) {
  const Owner own{ownership};
  std::vector<dc::ShardedTensor> shards;
  // A tied output weight on the last pipeline stage is a shared copy of the first stage's embedding: the
  // owner writes it (and its optimizer state); the copy loads from the same key.
  bool sharded_masters = false;
  for (ModelChunk* c : chunks)
    for (ParamAndGradBuffer* buf : c->buffers()) {
      if (!buf->has_main_params()) {
        sharded_masters = true;
        continue;
      }
      for (const auto& p : buf->params())
        if (!p->spec.shared_copy && own.writes_replica(p->spec.key, p->spec) &&
            own.writes_tp_replica(p->spec.key, p->spec))
          add_tp_shards(shards, p->spec.key, p->main_param, p->spec);  // fp32 master
    }
  // The routers' expert biases (moe_router_enable_expert_bias): replicated float32 buffers, written (and read) like
  // a replicated parameter under "<layer>.mlp.router.expert_bias".
  for (ModelChunk* c : chunks)
    for (moe::TopKRouter* r : c->routers())
      if (r->has_expert_bias()) {
        const ParamSpec spec{.key = r->expert_bias_key(), .shape = r->expert_bias().shape()};
        if (own.writes_replica(spec.key, spec) && own.writes_tp_replica(spec.key, spec))
          add_tp_shards(shards, spec.key, r->expert_bias(), spec);
      }
  if (sharded_masters) {
    // The fp32 masters live in the distributed optimizer's shards: each DP rank writes its pieces of the
    // model tensors (disjoint over DP), TP replicas of a piece once.
    if (!optimizer.distributed || !optimizer.distributed->main_params_sharded())
      fail("checkpoint: the model's fp32 main params are sharded by a distributed optimizer that was not given");
    for (const DistOptStatePiece& piece : optimizer.distributed->state()) {
      const ParamSpec& spec = spec_of(chunks, piece.key);
      if (spec.shared_copy || !own.writes_tp_replica(piece.key, spec)) continue;
      add_piece_shards(shards, piece.key, piece.key, piece.main_param, piece.offset, spec);
    }
  }
  if (optimizer.adam) {
    for (const AdamState& s : optimizer.adam->state()) {
      const ParamSpec& spec = spec_of(chunks, s.name);
      if (spec.shared_copy || !own.writes_replica(s.name, spec) || !own.writes_tp_replica(s.name, spec)) continue;
      add_tp_shards(shards, kExpAvg + s.name, s.exp_avg, spec);
      add_tp_shards(shards, kExpAvgSq + s.name, s.exp_avg_sq, spec);
    }
  } else if (optimizer.distributed) {
    // Each DP rank owns disjoint pieces: no DP de-duplication; TP replicas of a piece: one writer.
    for (const DistOptStatePiece& piece : optimizer.distributed->state()) {
      const ParamSpec& spec = spec_of(chunks, piece.key);
      if (spec.shared_copy || !own.writes_tp_replica(piece.key, spec)) continue;
      add_piece_shards(shards, kExpAvg + piece.key, piece.key, piece.exp_avg, piece.offset, spec);
      add_piece_shards(shards, kExpAvgSq + piece.key, piece.key, piece.exp_avg_sq, piece.offset, spec);
    }
  }
  return shards;
}

nlohmann::json optimizer_meta(OptimizerRef optimizer) {
  if (optimizer.adam) return {{"step", optimizer.adam->step_count()}};
  if (optimizer.distributed) return {{"step", optimizer.distributed->step_count()}, {"distributed", true}};
  return nullptr;
}

namespace {
// Module state kept per rank (ParameterRegistry::add_rank_state: the FP8 scaling state) under
// "rank_state.<rank coordinates>.<key>": each rank writes (and reads back) its own, whole.
constexpr const char* kRankState = "rank_state.";
std::string rank_state_key(const std::string& rank, const std::string& key) { return kRankState + rank + "." + key; }

void add_rank_states(std::vector<dc::ShardedTensor>& out, const std::vector<ModelChunk*>& chunks,
                     const std::string& rank) {
  for (ModelChunk* c : chunks)
    for (ParamAndGradBuffer* buf : c->buffers())
      for (const auto& [key, t] : buf->rank_states()) {
        Tensor host = t->is_cpu() ? t->clone() : t->to(Device::CPU);
        out.push_back({rank_state_key(rank, key), host.shape(), dc::Rect{Shape(host.shape().size(), 0), host.shape()},
                       host});
      }
}

// Restores every rank state saved by this rank's coordinates under the same layout; otherwise (another layout, or a
// checkpoint without them) the states keep their initial values and rank 0 says so once.
void read_rank_states(const dc::CheckpointReader& reader, const std::vector<ModelChunk*>& chunks, bool same_layout,
                      const std::string& rank, bool log) {
  bool missing = false;
  for (ModelChunk* c : chunks)
    for (ParamAndGradBuffer* buf : c->buffers())
      for (const auto& [key, t] : buf->rank_states()) {
        const std::string k = rank_state_key(rank, key);
        if (!same_layout || !reader.has(k)) {
          missing = true;
          continue;
        }
        const dc::ManifestEntry& e = reader.entry(k);
        if (e.global_shape != t->shape())
          fail("checkpoint '{}': tensor '{}' has shape {}, the model needs {}", reader.dir(), k,
               shape_str(e.global_shape), shape_str(t->shape()));
        Tensor host = Tensor::empty(t->shape(), t->dtype(), Device::CPU);
        reader.read_region(k, Shape(host.shape().size(), 0), host);
        t->copy_from(host);
      }
  if (missing && log)
    spdlog::info("checkpoint '{}': module state (FP8 scaling) not restored (saved under another layout, or not "
                 "saved): it starts from its initial values", reader.dir());
}
}  // namespace

CheckpointSnapshot snapshot_training_checkpoint(const Config& config, const std::vector<ModelChunk*>& chunks,
                                                OptimizerRef optimizer, const TrainerState& state,
                                                const parallel_state::ParallelContext& pc) {
  CheckpointSnapshot snap;
  snap.iteration = state.iteration;
  snap.shards = collect_checkpoint_shards(chunks, optimizer, save_ownership(pc));
  add_rank_states(snap.shards, chunks, rng_rank_key(pc));
  // Every rank's RNG state, keyed by its coordinates (collective over the world).
  const std::vector<std::string> rngs =
      dc::all_gather_strings(pc.world()->host(), nlohmann::json{{"rank", rng_rank_key(pc)}, {"state", state.rng.state()}}.dump());
  nlohmann::json per_rank = nlohmann::json::object();
  for (const std::string& r : rngs) {
    const nlohmann::json j = nlohmann::json::parse(r);
    per_rank[j.at("rank").get<std::string>()] = j.at("state");
  }
  snap.meta = {{"config", config.to_json()},
               {"fingerprint", config.fingerprint()},
               {"math_fields", config.math_fields()},
               {"iteration", state.iteration},
               {"consumed_train_samples", state.consumed_train_samples},
               {"consumed_valid_samples", state.consumed_valid_samples},
               {"optimizer", optimizer_meta(optimizer)},
               {"opt_param_scheduler", state.scheduler},
               {"rng", state.rng.state()},
               {"rng_per_rank", per_rank},
               {"parallel", parallel_meta(config, pc, optimizer.distributed != nullptr)},
               {"provenance", provenance()}};  // what built and ran the save (training/provenance.h)
  return snap;
}

std::string save_training_checkpoint(const std::string& save_dir, const Config& config,
                                     const std::vector<ModelChunk*>& chunks, OptimizerRef optimizer,
                                     const TrainerState& state, const parallel_state::ParallelContext& pc) {
  const CheckpointSnapshot snap = snapshot_training_checkpoint(config, chunks, optimizer, state, pc);
  return dc::save_sharded_checkpoint(save_dir, snap.iteration, snap.meta, snap.shards, pc.world()->host());
}

namespace {

// RNG restore: this rank's own entry when the layout is the one saved, else rank 0's (meta.rng).
void load_rng(const nlohmann::json& meta, const Config& config, const parallel_state::ParallelContext* pc,
              tensor_parallel::RngTracker& rng, const std::string& dir) {
  if (!pc) {
    rng.load_state(meta.at("rng"));
    return;
  }
  const nlohmann::json now = parallel_meta(config, *pc, false);
  const nlohmann::json saved = meta.value("parallel", nlohmann::json::object());
  bool same = meta.contains("rng_per_rank");
  for (const char* f : {"tp", "pp", "vp", "dp", "cp"}) same = same && saved.value(f, int64_t{1}) == now.at(f).get<int64_t>();
  const std::string key = rng_rank_key(*pc);
  if (same && meta.at("rng_per_rank").contains(key)) {
    rng.load_state(meta.at("rng_per_rank").at(key));
    return;
  }
  rng.load_state(meta.at("rng"));
  if (pc->rank() == 0)
    spdlog::info("checkpoint '{}' was saved with layout {} (now {}): per-rank RNG states not restored; every "
                 "rank takes rank 0's dropout-stream offsets",
                 dir, saved.dump(), now.dump());
}

}  // namespace

bool load_training_checkpoint(const std::string& load_dir, const Config& config, const std::vector<ModelChunk*>& chunks,
                              OptimizerRef optimizer, TrainerState& state, const LoadOptions& opt,
                              const parallel_state::ParallelContext* pc) {
  if (dc::latest_iteration(load_dir) < 0 && dc::list_iterations(load_dir).empty()) return false;
  dc::CheckpointReader reader(load_dir);
  reader.set_verify_checksums(opt.verify_checksums);
  struct CountBytes {  // reports the bytes read however this function returns
    const dc::CheckpointReader& r;
    uint64_t* out;
    ~CountBytes() {
      if (out) *out = r.bytes_read();
    }
  } count{reader, opt.bytes_read};
  const nlohmann::json& meta = reader.meta();
  try {
    check_fingerprint(meta, config, reader.dir(), opt.override_config_check);
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint '{}': manifest meta.fingerprint / meta.math_fields / meta.config: {}", reader.dir(), e.what());
  }
  read_model_chunks(reader, chunks, optimizer.distributed);  // sharded masters too (weights, also with --finetune)
  if (opt.finetune) {
    state = TrainerState{.rng = state.rng};
    return true;
  }
  if (!meta.contains("iteration") || !meta.contains("consumed_train_samples"))
    fail("checkpoint '{}' is model-only (no training state: e.g. written by `mcpp ckpt import`); load its weights "
         "with --finetune", reader.dir());
  state.iteration = meta_count(meta, "iteration", reader.dir());
  if (state.iteration != reader.iteration())
    fail("checkpoint '{}': manifest meta.iteration {} differs from its iteration {}", reader.dir(), state.iteration,
         reader.iteration());
  state.consumed_train_samples = meta_count(meta, "consumed_train_samples", reader.dir());
  state.consumed_valid_samples = meta.contains("consumed_valid_samples")
                                     ? meta_count(meta, "consumed_valid_samples", reader.dir()) : 0;
  state.scheduler = meta.value("opt_param_scheduler", nlohmann::json::object());
  if (!state.scheduler.is_object())
    fail("checkpoint '{}': manifest meta.opt_param_scheduler must be an object, got {}", reader.dir(),
         state.scheduler.type_name());
  {
    bool same = pc != nullptr;
    if (pc) {
      const nlohmann::json now = parallel_meta(config, *pc, false);
      const nlohmann::json saved = meta.value("parallel", nlohmann::json::object());
      for (const char* f : {"tp", "pp", "vp", "dp", "cp"})
        same = same && saved.value(f, int64_t{1}) == now.at(f).get<int64_t>();
    }
    read_rank_states(reader, chunks, same || !pc, pc ? rng_rank_key(*pc) : "tp0.pp0.dp0.cp0", !pc || pc->rank() == 0);
  }
  if (opt.load_rng) {
    try {
      load_rng(meta, config, pc, state.rng, reader.dir());
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint '{}': manifest meta.rng / meta.rng_per_rank: {}", reader.dir(), e.what());
    }
  }
  if (!optimizer.empty() && opt.load_optimizer) {
    if (!meta.contains("optimizer") || meta.at("optimizer").is_null())
      fail("checkpoint '{}' holds no optimizer state; use --no-load-optim (or --finetune) to load weights only",
           reader.dir());
    if (optimizer.distributed) {
      const int64_t step = optimizer_step(meta, reader.dir());
      // Each piece: flat range of the TP-local tensor -> local rects -> global rects, read directly.
      optimizer.distributed->load_state(
          step, [&](const std::string& key, int64_t offset, Tensor& exp_avg, Tensor& exp_avg_sq) {
            require_optimizer_state(reader, key);
            const ParamSpec& spec = spec_of(chunks, key);
            read_piece(reader, kExpAvg + key, key, spec, offset, exp_avg);
            read_piece(reader, kExpAvgSq + key, key, spec, offset, exp_avg_sq);
            return true;
          });
      return true;
    }
    read_adam_state(reader, chunks, *optimizer.adam);
  }
  return true;
}

LoadedModel load_model_for_inference(const std::string& load_dir, Device device, DType param_dtype) {
  dc::CheckpointReader reader(load_dir);
  LoadedModel lm;
  if (!reader.meta().contains("config")) fail("checkpoint '{}': manifest meta lacks the model config", reader.dir());
  lm.config = Config::from_json(reader.meta().at("config"));
  lm.config.finalize();
  lm.config.model.hidden_dropout = 0.0f;  // inference never drops; a flash model then accepts any recipe
  lm.config.model.attention_dropout = 0.0f;
  lm.config.model.validate();
  lm.iteration = reader.iteration();
  lm.model = std::make_unique<ModelChunk>(lm.config.model, static_cast<uint64_t>(lm.config.training.seed),
                                          tensor_parallel::TPContext{comm::make_local_world(), false}, device,
                                          GPTModelStage{}, param_dtype);
  read_model_chunks(reader, {lm.model.get()});
  return lm;
}

bool adopt_checkpoint_vocab_padding(Config& cfg) {
  const std::string& dir = cfg.training.load;
  if (dir.empty() || (dc::latest_iteration(dir) < 0 && dc::list_iterations(dir).empty())) return false;
  const dc::CheckpointReader reader(dir);
  const nlohmann::json& meta = reader.meta();
  if (!meta.contains("config") || !meta["config"].is_object() || !meta["config"].contains("model")) return false;
  const nlohmann::json& m = meta["config"]["model"];
  if (!m.is_object() || !m.contains("padded_vocab_size") || !m.contains("vocab_size") ||
      !m["padded_vocab_size"].is_number_integer() || !m["vocab_size"].is_number_integer())
    return false;
  const int64_t saved = m["padded_vocab_size"].get<int64_t>(), vocab = m["vocab_size"].get<int64_t>();
  TransformerConfig& now = cfg.model;
  const int64_t tp = cfg.parallel.tensor_model_parallel_size, multiple = now.make_vocab_size_divisible_by * tp;
  // A Hugging Face import's vocab_size is the embedding's row count, which may exceed its tokenizer's ids (Qwen3:
  // 151,936 rows for 151,669 ids): a tokenizer whose ids all fall inside the rows trains on them, as a fine-tune of a
  // converted checkpoint in Megatron keeps the checkpoint's padded_vocab_size.
  if (meta.contains("imported_from") && now.vocab_size < vocab && vocab <= saved) {
    if (saved % tp != 0)
      fail("checkpoint '{}' (imported) has {} vocabulary rows, not divisible by tensor_model_parallel_size {}; "
           "convert it at this TP with `mcpp ckpt convert`",
           reader.dir(), saved, tp);
    spdlog::info("checkpoint '{}' (imported) has {} vocabulary rows ({} padded) and the tokenizer {} ids: using "
                 "vocab_size {} and padded_vocab_size {} (instead of {} and {})",
                 reader.dir(), vocab, saved, now.vocab_size, vocab, saved, now.vocab_size, now.padded_vocab_size);
    now.vocab_size = vocab;
    now.padded_vocab_size = saved;
    return true;
  }
  if (vocab != now.vocab_size || saved == now.padded_vocab_size || saved < vocab) return false;
  if (saved % multiple == 0) {
    spdlog::info("checkpoint '{}' pads the vocabulary ({}) to {}, a multiple of make_vocab_size_divisible_by {} x "
                 "tensor_model_parallel_size {} too: using padded_vocab_size {} (instead of {})",
                 reader.dir(), vocab, saved, now.make_vocab_size_divisible_by, tp, saved, now.padded_vocab_size);
    now.padded_vocab_size = saved;
    return true;
  }
  // The --make-vocab-size-divisible-by that pads vocab to `saved` at this tp: the largest power of two (Megatron's
  // values: 128, 64, ...), else the smallest value at all (a larger one could pad past it).
  const auto pads_to_saved = [&](int64_t d) {
    return saved % (d * tp) == 0 && (vocab + d * tp - 1) / (d * tp) * (d * tp) == saved;
  };
  int64_t works = 0;
  for (int64_t d = int64_t{1} << 20; d >= 1 && works == 0; d /= 2)
    if (pads_to_saved(d)) works = d;
  for (int64_t d = 1; d <= saved / tp && works == 0; ++d)
    if (pads_to_saved(d)) works = d;
  if (works > 0)
    fail("checkpoint '{}' pads the vocabulary ({}) to {}, not a multiple of make_vocab_size_divisible_by {} x "
         "tensor_model_parallel_size {} (this run pads to {}); --make-vocab-size-divisible-by {} pads to {}",
         reader.dir(), vocab, saved, now.make_vocab_size_divisible_by, tp, now.padded_vocab_size, works, saved);
  fail("checkpoint '{}' pads the vocabulary ({}) to {}, which no --make-vocab-size-divisible-by reaches at "
       "tensor_model_parallel_size {} (this run pads to {}); reshard it offline with `mcpp ckpt convert`",
       reader.dir(), vocab, saved, tp, now.padded_vocab_size);
}

}  // namespace mcpp
