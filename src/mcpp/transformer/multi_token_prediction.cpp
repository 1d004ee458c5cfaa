#include "mcpp/transformer/multi_token_prediction.h"

#include <fmt/format.h>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/mappings.h"

namespace mcpp {

namespace tp = tensor_parallel;

namespace {
std::string depth_prefix(int64_t depth) { return fmt::format("mtp.layers.{}", depth); }
}  // namespace

MultiTokenPredictionLayer::MultiTokenPredictionLayer(ParameterRegistry& params, ParameterRegistry& expert_params,
                                                     int64_t depth, const TransformerConfig& c,
                                                     const MtpLayerSpec& spec, const tp::TPContext& tpc)
    : tp_(tpc),
      hidden_size_(c.hidden_size),
      recompute_(c.recomputes_mtp_depths()),
      enorm_(spec.make_enorm(params, depth_prefix(depth) + ".enorm", c.hidden_size, tpc.sequence_parallel)),
      hnorm_(spec.make_hnorm(params, depth_prefix(depth) + ".hnorm", c.hidden_size, tpc.sequence_parallel)),
      eh_proj_(params, depth_prefix(depth) + ".eh_proj",
               {.input_size = 2 * c.hidden_size,
                .output_size = c.hidden_size,
                .bias = false,
                .init_std = c.init_method_std,
                .sequence_parallel = tpc.sequence_parallel,
                .tp_comm_overlap = tpc.comm_overlap},
               tpc.group),
      layer_(params, expert_params, depth_prefix(depth) + ".transformer_layer", c, spec.transformer_layer, tpc),
      final_layernorm_(
          spec.make_final_layernorm(params, depth_prefix(depth) + ".final_layernorm", c.hidden_size,
                                    tpc.sequence_parallel)) {}

Tensor MultiTokenPredictionLayer::run(MultiTokenPredictionLayerCtx& ctx, const Tensor& hidden,
                                      const Tensor& embedding, const RopeTables* rope,
                                      const ForwardOptions& opt) const {
  MCPP_CHECK(hidden.shape() == embedding.shape(), "MTP layer: hidden {} and embedding {} differ", hidden.str(),
             embedding.str());
  const int64_t h = hidden_size_, n = hidden.numel() / h;
  // concat(enorm(e), hnorm(h)) on the last dim: both norms' rows in one [2, n, h] buffer, then a block transpose
  // to [n, 2, h] = [n, 2h].
  Tensor both = Tensor::empty({2 * n, h}, hidden.dtype(), hidden.device());
  both.narrow0(0, n).copy_from(enorm_.forward(ctx.enorm, embedding).view({n, h}));
  both.narrow0(n, n).copy_from(hnorm_.forward(ctx.hnorm, hidden).view({n, h}));
  Shape cat_shape = hidden.shape();
  cat_shape.back() = 2 * h;
  Tensor cat = Tensor::empty(cat_shape, hidden.dtype(), hidden.device());
  ops::chunk_transpose(cat, both, 2, n);
  Tensor x = tp::all_gather_last_dim(*tp_.group, eh_proj_.forward(ctx.eh_proj, cat));  // [s, b, h]
  if (tp_.sequence_parallel) x = tp::split_sp(*tp_.group, x).clone();                  // scatter_to_sp
  Residual r = layer_.forward(ctx.layer, Residual{x, Tensor()}, rope, opt);
  // The layer's last residual add inside the final norm, as TransformerBlock's (a dropped branch summed apart).
  if (r.drop.active()) r.sum();
  if (!r.b.defined()) return final_layernorm_.forward(ctx.final_layernorm, r.a);
  Tensor sum;
  return final_layernorm_.forward_add(ctx.final_layernorm, sum, r.a, r.b);
}

Tensor MultiTokenPredictionLayer::forward(MultiTokenPredictionLayerCtx& ctx, const Tensor& hidden,
                                          const Tensor& embedding, const RopeTables* rope,
                                          const ForwardOptions& opt) const {
  ctx = {};
  ctx.recomputed = recompute_ && opt.training;
  if (ctx.recomputed) ctx.replay = ForwardReplay::of(opt);  // the streams as the depth's forward finds them
  tensor_parallel::Fp8ScaleStash fp8;  // the FP8 scales the re-run casts with (fp8_recompute.h)
  const tensor_parallel::Fp8Recompute record = tensor_parallel::Fp8Recompute::recording(opt.fp8_recompute, fp8);
  ForwardOptions run_opt = opt;
  if (ctx.recomputed) run_opt.fp8_recompute = &record;
  Tensor out = run(ctx, hidden, embedding, rope, run_opt);
  if (ctx.recomputed) {  // keep the inputs only: backward re-runs the depth
    ForwardReplay replay = std::move(ctx.replay);
    ctx = {};
    ctx.recomputed = true;
    ctx.hidden_in = hidden;
    ctx.embedding_in = embedding;
    ctx.replay = std::move(replay);
    ctx.fp8 = std::move(fp8);
  }
  return out;
}

std::pair<Tensor, Tensor> MultiTokenPredictionLayer::backward(MultiTokenPredictionLayerCtx& ctx, const Tensor& dy,
                                                              const RopeTables* rope, float loss_grad_scale) const {
  if (ctx.recomputed) {  // the same draws as the original forward (output unused)
    const Tensor hidden = ctx.hidden_in, embedding = ctx.embedding_in;
    ForwardReplay replay = std::move(ctx.replay);
    tensor_parallel::Fp8ScaleStash fp8 = std::move(ctx.fp8);
    ctx = {};
    ForwardOptions rerun = replay.options();
    const auto fp8_replay = tensor_parallel::Fp8Recompute::replaying(fp8);  // the first forward's FP8 scales
    rerun.fp8_recompute = &fp8_replay;
    run(ctx, hidden, embedding, rope, rerun);
  }
  MCPP_CHECK(ctx.enorm.x.defined(), "MultiTokenPredictionLayer::backward needs the context of a forward");
  const int64_t h = hidden_size_;
  const Tensor dsum = final_layernorm_.backward(ctx.final_layernorm, dy);
  const ResidualGrad dx = layer_.backward(ctx.layer, ResidualGrad{dsum, Tensor()}, rope, loss_grad_scale);
  MCPP_CHECK(!dx.branch.defined(), "MTP layer: the transformer layer's input has no residual branch");
  Tensor d = dx.sum;
  if (tp_.sequence_parallel) d = tp::all_gather_sp(*tp_.group, d);  // scatter_to_sp backward: [s, b, h]
  const Tensor dcat = eh_proj_.backward(ctx.eh_proj, tp::split_last_dim(*tp_.group, d));  // [s(/tp), b, 2h]
  const int64_t n = dcat.numel() / (2 * h);
  Tensor both = Tensor::empty({2 * n, h}, dcat.dtype(), dcat.device());
  ops::chunk_transpose(both, dcat, n, 2);  // [n, 2, h] -> [2, n, h]
  Shape shape = dcat.shape();
  shape.back() = h;
  Tensor demb = enorm_.backward(ctx.enorm, both.narrow0(0, n).view(shape));
  Tensor dhidden = hnorm_.backward(ctx.hnorm, both.narrow0(n, n).view(shape));
  ctx = {};  // consumed
  return {dhidden, demb};
}

void MtpLossTracker::add(const Tensor& v, int64_t depth) {
  MCPP_CHECK(v.dtype() == DType::F32 && v.numel() == 2, "MtpLossTracker: expected float32 [2], got {}", v.str());
  MCPP_CHECK(depth >= 0 && depth < depths_, "MtpLossTracker: depth {} outside [0, {})", depth, depths_);
  if (!sums_.defined()) sums_ = Tensor::zeros({depths_, 2}, DType::F32, v.device());
  Tensor row = sums_.flat_slice(depth * 2, {2});
  ops::add_inplace(row, v);
}

std::vector<std::pair<double, double>> MtpLossTracker::take() {
  std::vector<std::pair<double, double>> out(static_cast<size_t>(depths_), {0.0, 0.0});
  if (!sums_.defined()) return out;
  const Tensor h = sums_.to(Device::CPU);
  for (int64_t k = 0; k < depths_; ++k)
    out[static_cast<size_t>(k)] = {h.data<float>()[2 * k], h.data<float>()[2 * k + 1]};
  sums_.zero_();
  return out;
}

int64_t MultiTokenPredictionLayer::saved_bytes(const TransformerConfig& m, const ActivationDims& d) {
  const int64_t hidden_local = d.n_local * d.h * d.e;
  const bool sp = d.sequence_parallel();
  int64_t bytes = 4 * d.n * 4 + 8                                     // rolled tokens, labels, mask; lse; statistics
                  + (m.calculate_per_token_loss ? 8 : 0)              //
                  + d.n * (m.padded_vocab_size / d.tp) * d.e          // logits
                  + d.n * d.h * d.e;                                  // the output layer's input
  if (m.recomputes_mtp_depths())  // the depth's two inputs only
    return bytes + hidden_local + (sp ? hidden_local : 0);
  return bytes + hidden_local + norm_stats_bytes(m, d)        // enorm: the embedding (after its dropout)
         + (sp ? hidden_local : 0) + norm_stats_bytes(m, d)   // hnorm: h_{k-1}
         + d.n * 2 * d.h * d.e                                // eh_proj's input (gathered under SP)
         + hidden_local                                       // the transformer layer's input
         + TransformerLayer::saved_bytes(m, d, m.num_moe_experts > 0 && m.is_moe_layer(m.num_layers - 1))
         + hidden_local + norm_stats_bytes(m, d);             // final_layernorm's input (the layer's sum)
}

}  // namespace mcpp
