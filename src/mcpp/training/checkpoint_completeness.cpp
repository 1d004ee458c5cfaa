// A checkpoint's tensors against its stored config; see checkpoint_completeness.h.
#include "mcpp/training/checkpoint_completeness.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <set>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/model_chunk.h"

namespace mcpp {

namespace dc = dist_checkpointing;

std::vector<ExpectedTensor> expected_checkpoint_tensors(const Config& config, bool with_optimizer) {
  const TransformerConfig& c = config.model;
  std::vector<ExpectedTensor> params, buffers;  // buffers: the routers' expert biases (no optimizer state)
  std::set<std::string> seen;
  const tensor_parallel::TPContext tp{comm::make_local_world(), false};
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {  // one layer at a time: bounded memory
    const GPTModelStage stage{.pre_process = layer == 0, .post_process = layer == c.num_layers - 1,
                              .first_layer = layer, .num_layers = 1};
    ModelChunk m(c, /*seed=*/0, tp, Device::CPU, stage);
    for (ParamAndGradBuffer* b : m.buffers())
      for (const auto& p : b->params())
        if (!p->spec.shared_copy && seen.insert(p->spec.key).second)
          params.push_back({p->spec.key, p->spec.global_shape()});
    for (moe::TopKRouter* r : m.routers())
      if (r->has_expert_bias() && seen.insert(r->expert_bias_key()).second)
        buffers.push_back({r->expert_bias_key(), r->expert_bias().shape()});
  }
  std::vector<ExpectedTensor> out = params;
  out.insert(out.end(), buffers.begin(), buffers.end());
  if (with_optimizer)
    for (const ExpectedTensor& t : params) {
      out.push_back({"optimizer.exp_avg." + t.key, t.global_shape});
      out.push_back({"optimizer.exp_avg_sq." + t.key, t.global_shape});
    }
  return out;
}

int64_t check_checkpoint_complete(const dc::CheckpointReader& reader) {
  const nlohmann::json& meta = reader.meta();
  const std::string where = (std::filesystem::path(reader.dir()) / dc::kManifestFile).string();
  if (!meta.contains("config")) return 0;
  Config config;
  try {
    config = Config::from_json(meta.at("config"));
    config.finalize();
  } catch (const Error& e) {
    fail("{}: meta.config: {}", where, e.what());
  }
  const auto opt = meta.find("optimizer");
  if (opt != meta.end() && !opt->is_null() && !opt->is_object())
    fail("{}: meta.optimizer must be an object or null, got {}", where, opt->type_name());
  const bool with_optimizer = opt != meta.end() && opt->is_object();
  const std::vector<ExpectedTensor> expected = expected_checkpoint_tensors(config, with_optimizer);
  std::vector<std::string> missing, wrong_shape, unexpected;
  std::set<std::string> wanted;
  for (const ExpectedTensor& t : expected) {
    wanted.insert(t.key);
    if (!reader.has(t.key)) {
      missing.push_back(t.key);
    } else if (reader.entry(t.key).global_shape != t.global_shape) {
      wrong_shape.push_back(fmt::format("'{}' is {} (the config implies {})", t.key,
                                        shape_str(reader.entry(t.key).global_shape), shape_str(t.global_shape)));
    }
  }
  // (per-rank module state, "rank_state.<rank>.<key>" — the FP8 scaling state — depends on the layout saved, not only on
  // the config: accepted as is)
  for (const std::string& k : reader.keys())
    if (!wanted.count(k) && k.rfind("rank_state.", 0) != 0) unexpected.push_back(k);
  auto first = [](const std::vector<std::string>& v) {
    const size_t n = std::min<size_t>(v.size(), 3);
    return fmt::format("{}{}", fmt::join(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n), ", "),
                       v.size() > n ? fmt::format(" and {} more", v.size() - n) : std::string());
  };
  if (!missing.empty())
    fail("{}: incomplete checkpoint: {} of the {} tensors its stored config implies ({}) are missing: {}", where,
         missing.size(), expected.size(),
         with_optimizer ? "model, and optimizer state as meta.optimizer claims a step" : "model", first(missing));
  if (!wrong_shape.empty())
    fail("{}: {} tensors do not have the shape the stored config implies: {}", where, wrong_shape.size(),
         first(wrong_shape));
  if (!unexpected.empty())
    fail("{}: {} tensors are not implied by the stored config{}: {}", where, unexpected.size(),
         with_optimizer ? "" : " (meta.optimizer is null: no optimizer state)", first(unexpected));
  return static_cast<int64_t>(expected.size());
}

}  // namespace mcpp
