// The tensors a GPTModel holds, from the model itself; contract in gpt_model_tensors.h.
#include "mcpp/models/gpt/gpt_model_tensors.h"

#include <map>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/transformer/moe/router.h"

namespace mcpp {

namespace {

// Records the registered parameters; no storage, so no grad hook ever runs.
class RecordingRegistry final : public ParameterRegistry {
 protected:
  void on_grad_ready(Parameter&) override {}
  void zero_main_grads(int64_t, int64_t) override {}
};

}  // namespace

std::vector<std::pair<std::string, Shape>> gpt_model_tensors(const TransformerConfig& config) {
  TransformerConfig c = config;
  c.finalize();
  // No parameter's shape depends on these; the RoPE tables' length does (and FP8 adds per-rank state only).
  c.seq_length = 1;
  if (c.position_embedding_type != PositionEmbedding::LearnedAbsolute) c.max_position_embeddings = 1;
  c.fp8_format.clear();
  RecordingRegistry registry;
  GPTModel model(registry, registry, c, tensor_parallel::TPContext{comm::make_local_world(), false});
  std::vector<std::pair<std::string, Shape>> out;
  std::map<const Parameter*, moe::TopKRouter*> biased;  // router weight -> its router, when it has the buffer
  for (moe::TopKRouter* r : model.routers())
    if (r->has_expert_bias()) biased[r->weight()] = r;
  for (const auto& p : registry.params()) {
    out.emplace_back(p->spec.key, p->spec.global_shape());
    if (auto it = biased.find(p.get()); it != biased.end())  // the router's buffer after its weight
      out.emplace_back(it->second->expert_bias_key(), it->second->expert_bias().shape());
  }
  return out;
}

}  // namespace mcpp
