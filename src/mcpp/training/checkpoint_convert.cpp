// Offline reshard of a checkpoint to another TP / PP / virtual-stage layout; see checkpoint_convert.h.
#include "mcpp/training/checkpoint_convert.h"

#include <filesystem>
#include <random>

#include "mcpp/comm/communicator.h"
#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/durable_file.h"
#include "mcpp/dist_checkpointing/sharded_save.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/pipeline_parallel/layout.h"
#include "mcpp/training/checkpointing.h"

namespace fs = std::filesystem;

namespace mcpp {
namespace dc = dist_checkpointing;
namespace {

// A TP group that only carries (rank, size) for building one target rank's modules offline; posting any
// communication on it is an error (conversion never computes).
class OfflineGroup : public comm::Communicator {
 public:
  OfflineGroup(int size, int rank)
      : Communicator("tp(offline)", ranks(size), rank, std::make_shared<comm::FlightRecorder>(rank, size, 16)) {}
  std::shared_ptr<Communicator> new_group(const std::string&, const std::vector<int>&) override { none(); }

 protected:
  comm::Work do_all_reduce(Tensor&, comm::ReduceOp) override { none(); }
  comm::Work do_all_gather(Tensor&, const Tensor&) override { none(); }
  comm::Work do_reduce_scatter(Tensor&, const Tensor&, comm::ReduceOp) override { none(); }
  comm::Work do_broadcast(Tensor&, int) override { none(); }
  comm::Work do_all_to_all(Tensor&, const Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    none();
  }
  comm::Work do_batch_p2p(const std::vector<comm::P2POp>&) override { none(); }
  comm::Work do_barrier() override { none(); }
  void exchange_fingerprints(const int64_t*, int64_t*, int) override { none(); }

 private:
  static std::vector<int> ranks(int size) {
    std::vector<int> r(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) r[static_cast<size_t>(i)] = i;
    return r;
  }
  [[noreturn]] static void none() { fail("ckpt convert: the offline TP group cannot communicate"); }
};

Config target_config(const nlohmann::json& meta, const ConvertOptions& opt, const std::string& dir) {
  if (!meta.contains("config")) fail("checkpoint '{}': manifest meta lacks the config (meta.config)", dir);
  if (opt.tp < 1 || opt.pp < 1 || opt.vp < 1)
    fail("ckpt convert: --tp, --pp and --vp must be >= 1 (got {}, {}, {})", opt.tp, opt.pp, opt.vp);
  Config c = Config::from_json(meta.at("config"));
  c.finalize();
  auto& par = c.parallel;
  par.tensor_model_parallel_size = opt.tp;
  par.pipeline_model_parallel_size = opt.pp;
  par.context_parallel_size = 1;
  par.pipeline_model_parallel_layout.clear();
  par.decoder_first_pipeline_num_layers = par.decoder_last_pipeline_num_layers = -1;
  par.account_for_embedding_in_pipeline_split = par.account_for_loss_in_pipeline_split = false;
  par.use_distributed_optimizer = false;
  if (opt.tp == 1) par.sequence_parallel = false;
  if (opt.vp > 1) {
    if (c.model.num_layers % (opt.pp * opt.vp) != 0)
      fail("ckpt convert: num_layers ({}) must be divisible by --pp * --vp ({})", c.model.num_layers, opt.pp * opt.vp);
    par.num_layers_per_virtual_pipeline_stage = c.model.num_layers / (opt.pp * opt.vp);
  } else {
    par.num_layers_per_virtual_pipeline_stage = 0;
  }
  par.data_parallel_size = 1;
  try {
    c.validate();
  } catch (const Error& e) {
    fail("ckpt convert to --tp {} --pp {} --vp {}: {}", opt.tp, opt.pp, opt.vp, e.what());
  }
  if (c.model.padded_vocab_size % opt.tp != 0)
    fail("ckpt convert: padded_vocab_size ({}) must be divisible by --tp ({})", c.model.padded_vocab_size, opt.tp);
  return c;
}

}  // namespace

ConvertResult convert_checkpoint(const ConvertOptions& opt) {
  if (opt.output.empty()) fail("ckpt convert: --output is required");
  dc::CheckpointReader reader(opt.input, opt.iteration);
  const nlohmann::json& src_meta = reader.meta();
  const Config c = target_config(src_meta, opt, reader.dir());
  const auto layout = pipeline_parallel::make_pipeline_layout(pipeline_parallel::layout_options(c.model, c.parallel));
  const bool has_optim = src_meta.contains("optimizer") && !src_meta.at("optimizer").is_null();
  const int64_t world = opt.tp * opt.pp;

  const int64_t iteration = reader.iteration();
  std::error_code ec;
  fs::create_directories(opt.output, ec);
  if (ec) fail("ckpt convert: cannot create output directory {}: {}", opt.output, ec.message());
  const std::string final_dir = (fs::path(opt.output) / dc::iteration_dir_name(iteration)).string();
  if (fs::exists(final_dir, ec)) fail("ckpt convert: refusing to overwrite existing checkpoint {}", final_dir);
  const std::string tmp_dir = final_dir + ".tmp-" + dc::random_token();
  if (!fs::create_directory(tmp_dir, ec) || ec) fail("ckpt convert: cannot create staging directory {}", tmp_dir);

  ConvertResult res;
  try {
    std::vector<std::string> rank_entries;
    for (int64_t p = 0; p < opt.pp; ++p) {
      for (int64_t t = 0; t < opt.tp; ++t) {
        const tensor_parallel::TPContext tpc{std::make_shared<OfflineGroup>(static_cast<int>(opt.tp), static_cast<int>(t)),
                                             c.parallel.sequence_parallel};
        std::vector<std::unique_ptr<ModelChunk>> owned;
        std::vector<ModelChunk*> chunks;
        for (int64_t v = 0; v < layout.virtual_pipeline_model_parallel_size; ++v) {
          const pipeline_parallel::StageLayers& st = layout.at(static_cast<int>(p), v);
          owned.push_back(std::make_unique<ModelChunk>(
              c.model, static_cast<uint64_t>(c.training.seed), tpc, Device::CPU,
              GPTModelStage{.pre_process = st.pre_process, .post_process = st.post_process,
                            .first_layer = st.layers.empty() ? 0 : st.layers.front(),
                            .num_layers = static_cast<int64_t>(st.layers.size())}));
          chunks.push_back(owned.back().get());
        }
        read_model_chunks(reader, chunks);
        std::unique_ptr<Adam> adam;
        if (has_optim) {
          std::vector<AdamParam> params;
          for (ModelChunk* ch : chunks)
            for (ParamAndGradBuffer* buf : ch->buffers())
              for (const auto& prm : buf->params())
                params.push_back({.name = prm->spec.key, .param = prm->main_param, .main_grad = prm->main_grad,
                                  .no_weight_decay = prm->spec.no_weight_decay});
          adam = std::make_unique<Adam>(std::move(params), adam_options_from(c.optimizer));
          read_adam_state(reader, chunks, *adam);
        }
        const std::vector<dc::ShardedTensor> shards = collect_checkpoint_shards(
            chunks, OptimizerRef{adam.get(), nullptr},
            SaveOwnership{.dp = 1, .dp_rank = 0, .tp = static_cast<int>(opt.tp), .tp_rank = static_cast<int>(t)});
        for (const auto& s : shards) res.bytes_written += s.data.nbytes();
        const int64_t rank = t + opt.tp * p;
        rank_entries.push_back(
            dc::write_rank_files(tmp_dir, iteration, static_cast<int>(rank), static_cast<int>(world), shards).dump());
      }
    }
    nlohmann::json meta = src_meta;
    meta["config"] = c.to_json();
    meta.erase("rng_per_rank");
    if (has_optim) meta["optimizer"] = {{"step", src_meta.at("optimizer").at("step")}};
    meta["converted_from"] = {{"dir", reader.dir()}, {"parallel", src_meta.value("parallel", nlohmann::json())}};
    meta["parallel"] = {{"world_size", world}, {"tp", opt.tp}, {"pp", opt.pp},
                        {"vp", layout.virtual_pipeline_model_parallel_size}, {"dp", 1}, {"cp", 1},
                        {"distributed_optimizer", false}};
    dc::commit_checkpoint(opt.output, tmp_dir, final_dir, iteration, meta, rank_entries);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  res.dir = final_dir;
  res.ranks = world;
  res.bytes_read = reader.bytes_read();
  return res;
}

}  // namespace mcpp
