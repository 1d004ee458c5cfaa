#include "mcpp/models/gpt/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/mappings.h"
#include "mcpp/transformer/context_parallel.h"
#include "mcpp/transformer/inference_context.h"

namespace mcpp {

namespace tp = tensor_parallel;

namespace {
// The spec with every FP8 linear in the chunk's update group (tensor_parallel/fp8_state.h; delayed ones join it).
GPTModelSpec with_fp8_updates(GPTModelSpec spec, const std::shared_ptr<tp::Fp8UpdateGroup>& group) {
  for (TransformerLayerSpec& l : spec.decoder.layer_specs)
    if (l.linear_fp8.enabled) l.linear_fp8.updates = group;
  if (spec.mtp_layer.transformer_layer.linear_fp8.enabled) spec.mtp_layer.transformer_layer.linear_fp8.updates = group;
  return spec;
}
}  // namespace

GPTModel::GPTModel(ParameterRegistry& params, ParameterRegistry& expert_params, const TransformerConfig& c,
                   const GPTModelSpec& model_spec, const tp::TPContext& tpc, Device device, const GPTModelStage& stage)
    : config_(c), tp_(tpc), stage_(stage), device_(device) {
  if (c.fp8()) fp8_updates_ = std::make_shared<tp::Fp8UpdateGroup>(tp_.group);
  const GPTModelSpec spec = fp8_updates_ ? with_fp8_updates(model_spec, fp8_updates_) : model_spec;
  MCPP_CHECK(c.padded_vocab_size > 0, "GPTModel: padded_vocab_size is not set (tokenizer not applied to config)");
  if (stage_.num_layers < 0) stage_.num_layers = c.num_layers - stage_.first_layer;
  MCPP_CHECK(stage_.first_layer >= 0 && stage_.first_layer + stage_.num_layers <= c.num_layers,
             "pipeline stage layers [{}, {}) outside the model's {} layers", stage_.first_layer,
             stage_.first_layer + stage_.num_layers, c.num_layers);
  const bool tied = !c.untie_embeddings_and_output_weights;
  const bool mtp = stage_.post_process && c.mtp_num_layers > 0;
  // The word embeddings live on the first stage, and (tied, or for the MTP depths' embeddings) a shared copy on
  // the last stage.
  if (stage_.pre_process || (stage_.post_process && c.last_stage_uses_word_embeddings())) {
    word_embedding_ = std::make_unique<tp::VocabParallelEmbedding>(
        params, "embedding.word_embeddings.weight", c.padded_vocab_size, c.hidden_size, c.init_method_std, tp_.group);
    word_embeddings_ = word_embedding_->weight();
    word_embeddings_->spec.shared_copy = !stage_.pre_process;
    word_embeddings_->spec.shared_embedding =
        c.last_stage_uses_word_embeddings() && !(stage_.pre_process && stage_.post_process);
  }
  vocab_local_ = c.padded_vocab_size / tp_.size();
  vocab_start_ = static_cast<int64_t>(tp_.rank()) * vocab_local_;
  if (stage_.pre_process && c.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    position_embeddings_ = params.add({.key = "embedding.position_embeddings.weight",
                                        .shape = {c.max_position_embeddings, c.hidden_size},
                                        .std = c.init_method_std});
  // MoE experts register in their own buffer (Megatron's expert-parallel buffers): reduced over expert-DP.
  decoder_ = std::make_unique<TransformerBlock>(params, expert_params, c, spec.decoder, tp_, stage_.first_layer,
                                                stage_.num_layers, stage_.post_process);
  if (stage_.post_process) {
    const tp::ParallelLinearOptions out_opt{.input_size = c.hidden_size,
                                            .output_size = c.padded_vocab_size,
                                            .bias = false,
                                            .init_std = c.init_method_std,
                                            .sequence_parallel = tp_.sequence_parallel,
                                            .tp_comm_overlap = tp_.comm_overlap};
    output_layer_ = tied ? std::make_unique<tp::ColumnParallelLinear>(word_embeddings_, out_opt, tp_.group)
                         : std::make_unique<tp::ColumnParallelLinear>(params, "output_layer", out_opt, tp_.group);
    // The tied weight's other (last) use is the embedding backward on this stage — or nowhere when the
    // embedding sits on another stage: then the output layer's backward is the last use.
    if (tied) output_layer_->set_reports_weight_grad(!stage_.pre_process);
  }
  if (mtp) {  // after the output layer: the depths' gradients are ready first (the buffer's backward order)
    for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
      mtp_.push_back(std::make_unique<MultiTokenPredictionLayer>(params, expert_params, k, c, spec.mtp_layer, tp_));
      if (moe::MoELayer* m = mtp_.back()->moe_layer()) m->router().set_layer_number(c.num_layers + k);
    }
    mtp_output_layer_ = std::make_unique<tp::ColumnParallelLinear>(
        output_layer_->weight(),
        tp::ParallelLinearOptions{.input_size = c.hidden_size,
                                  .output_size = c.padded_vocab_size,
                                  .bias = false,
                                  .init_std = c.init_method_std,
                                  .sequence_parallel = tp_.sequence_parallel,
                                  .tp_comm_overlap = tp_.comm_overlap},
        tp_.group);
    mtp_output_layer_->set_reports_weight_grad(false);  // the main head's backward is the last use
    Tensor one = Tensor::empty({1});
    one.data<float>()[0] = 1.0f;
    one_ = one.to(device);
  }
  if (c.multi_latent_attention) {  // MLA's own tables over its qk_pos_emb_head_dim channels (rope or YaRN)
    const int64_t len = std::max(c.seq_length, c.max_position_embeddings);
    rope_ = c.mla_yarn() ? make_yarn_rope_tables(len, c.qk_pos_emb_head_dim, c.rotary_base,
                                                 {.scaling_factor = c.rotary_scaling_factor,
                                                  .beta_fast = c.beta_fast,
                                                  .beta_slow = c.beta_slow,
                                                  .mscale = c.mscale,
                                                  .mscale_all_dim = c.mscale_all_dim,
                                                  .original_max_position_embeddings = c.original_max_position_embeddings},
                                                 device)
                         : make_rope_tables(len, c.qk_pos_emb_head_dim, c.rotary_base, device);
    has_rope_ = true;
  } else if (c.position_embedding_type == PositionEmbedding::Rope) {
    const auto rot = static_cast<int64_t>(std::lround(static_cast<double>(c.kv_channels) * c.rotary_percent));
    rope_ = make_rope_tables(std::max(c.seq_length, c.max_position_embeddings), rot, c.rotary_base, device,
                             c.use_rope_scaling ? c.rope_scaling_factor : 0.0, c.rotary_seq_len_interpolation_factor);
    has_rope_ = true;
  }
}

RopeTables GPTModel::rope_for(int64_t s) const {
  if (!has_rope_) return {};
  MCPP_CHECK(s <= rope_.cos.size(0), "sequence length {} exceeds the rotary table ({})", s, rope_.cos.size(0));
  return {rope_.cos.narrow0(0, s), rope_.sin.narrow0(0, s)};  // rows 0..s-1 (views)
}

RopeTables GPTModel::rope_at(const Tensor& positions) const {
  const int64_t n = positions.numel(), half = rope_.cos.size(1);
  RopeTables t{Tensor::empty({n, half}, DType::F32, device_), Tensor::empty({n, half}, DType::F32, device_)};
  ops::embedding_fwd(t.cos, positions, rope_.cos, 0);  // row i: the table's row positions[i]
  ops::embedding_fwd(t.sin, positions, rope_.sin, 0);
  return t;
}

void GPTModel::check_inference_step(const InferenceContext& ic, int64_t s, int64_t b) const {
  MCPP_CHECK(stage_.pre_process && stage_.post_process && tp_.size() == 1 && tp_.cp_size() == 1,
             "generation with a KV cache runs the whole model on one rank (no tensor, context or pipeline "
             "parallelism)");
  ic.check_step(s, b);
  int64_t last = s - 1;  // the step's largest position: prefill rows 0..s-1, decode lengths[bb]
  if (!ic.prefill()) last = *std::max_element(ic.lengths().begin(), ic.lengths().end());
  if (position_embeddings_)
    MCPP_CHECK(last < config_.max_position_embeddings, "generation: position {} exceeds max_position_embeddings {}",
               last, config_.max_position_embeddings);
  if (has_rope_)
    MCPP_CHECK(last < rope_.cos.size(0), "generation: position {} exceeds the rotary table ({})", last,
               rope_.cos.size(0));
}

std::vector<moe::TopKRouter*> GPTModel::routers() const {
  std::vector<moe::TopKRouter*> out = decoder_->routers();
  for (const auto& l : mtp_)
    if (moe::MoELayer* m = l->moe_layer()) out.push_back(&m->router());
  return out;
}

Tensor GPTModel::finish_embedding(const Tensor& x, const ForwardOptions& opt, bool& dropout, PhiloxKey& key) {
  Tensor out = x;
  if (tp_.sequence_parallel) out = tp::split_sp(*tp_.group, out).clone();  // scatter_to_sp: [s/tp, b, h]
  dropout = dropout_active(opt, config_.hidden_dropout);
  if (dropout) {
    MCPP_CHECK(opt.rng, "embedding dropout needs an RNG stream");
    key = opt.rng->draw(static_cast<uint64_t>(out.numel()), tp_.sequence_parallel);
    ops::dropout_fwd(out, out, config_.hidden_dropout, key);
  }
  return out;
}

Tensor GPTModel::word_embedding_backward(const Tensor& dx_in, const Tensor& tokens, bool dropout,
                                         const PhiloxKey& key) {
  Tensor dx = dx_in;
  if (dropout) {
    dx = dx_in.clone();
    ops::dropout_bwd(dx, dx, config_.hidden_dropout, key);
  }
  if (tp_.sequence_parallel) dx = tp::all_gather_sp(*tp_.group, dx);  // scatter_to_sp backward: [s, b, h]
  const int64_t n = tokens.numel();
  Tensor d2 = dx.view({n, config_.hidden_size});
  // reduce_from_tp backward is the identity: every TP rank holds the full gradient.
  word_embedding_->backward(tokens.view({n}), d2);
  return d2;
}

Tensor GPTModel::embed(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt) {
  const ModuleScope m("embedding", tokens);
  const int64_t s = tokens.size(0), b = tokens.size(1), h = config_.hidden_size;
  ctx.tokens = tokens;  // on the model's device (forward_step)
  Tensor x = word_embedding_->forward(tokens.view({s * b}));  // [s*b, h], all-reduced over TP
  if (position_embeddings_ && opt.inference && !opt.inference->prefill()) {  // a KV-cache decode step: s = 1
    ctx.position_ids = opt.inference->lengths_tensor();  // [b]: token bb at position lengths[bb]
    Tensor pe = Tensor::empty({s * b, h}, x.dtype(), device_);
    ops::embedding_fwd(pe, ctx.position_ids, position_embeddings_->data, 0);
    ops::add_inplace(x, pe);
  } else if (position_embeddings_) {
    // With context parallelism the tokens are this CP rank's rows of the sequence (context_parallel.h).
    MCPP_CHECK(s * tp_.cp_size() <= config_.max_position_embeddings,
               "sequence length {} exceeds max_position_embeddings {}", s * tp_.cp_size(),
               config_.max_position_embeddings);
    if (ctx.packed.position_ids.defined()) {  // packed sequences: positions restart per document
      ctx.position_ids = ctx.packed.position_ids.view({s * b});
    } else if (position_ids_.numel() != s * b || position_ids_b_ != b) {  // built once per shape, kept on the device
      std::vector<int64_t> rows;  // the sequence position of each local row
      for (const CpRows& r : cp_rows(s * tp_.cp_size(), tp_.cp_size(), tp_.cp_rank(), tp_.cp_p2p))
        for (int64_t i = 0; i < r.count; ++i) rows.push_back(r.first + i);
      Tensor pos = Tensor::empty({s * b}, DType::I32);
      for (int64_t i = 0; i < s * b; ++i) pos.data<int32_t>()[i] = static_cast<int32_t>(rows[i / b]);
      position_ids_ = pos.to(device_);
      position_ids_b_ = b;
    }
    if (!ctx.packed.position_ids.defined()) ctx.position_ids = position_ids_;
    Tensor pe = Tensor::empty({s * b, h}, x.dtype(), device_);
    ops::embedding_fwd(pe, ctx.position_ids, position_embeddings_->data, 0);
    ops::add_inplace(x, pe);
  }
  return m.ret(finish_embedding(x.view({s, b, h}), opt, ctx.embedding_dropout, ctx.embedding_dropout_key));
}

void GPTModel::embed_backward(GPTModelCtx& ctx, const Tensor& dx_in) {
  const ModuleScope m("embedding", dx_in, ModuleScope::kBackward);
  const Tensor d2 = word_embedding_backward(dx_in, ctx.tokens, ctx.embedding_dropout, ctx.embedding_dropout_key);
  word_embeddings_->grad_ready();  // its last use (the tied output layer's backward ran first)
  if (position_embeddings_) {
    materialize_grads({position_embeddings_});  // a scatter-add
    ops::embedding_bwd(position_embeddings_->main_grad, ctx.position_ids, d2, 0);
    position_embeddings_->grad_ready();
  }
}

Tensor GPTModel::forward_logits(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt) {
  MCPP_CHECK(stage_.pre_process && stage_.post_process, "forward_logits needs the whole model (one pipeline stage)");
  forward_step(ctx, tokens, Tensor(), Tensor(), Tensor(), opt, nullptr);
  return ctx.logits;
}

void GPTModel::set_packed(GPTModelCtx& ctx, ForwardOptions& opt, int64_t s, int64_t b) const {
  ctx.packed = {};
  const PackedSeqParams* p = opt.packed_seq_params;
  opt.packed_seq_params = nullptr;
  if (!p || !p->defined()) return;
  MCPP_CHECK(!opt.inference, "packed sequences are not implemented with a KV cache (generation)");
  MCPP_CHECK(!has_rope_ || s <= rope_.cos.size(0), "sequence length {} exceeds the rotary table ({})", s,
             rope_.cos.size(0));
  MCPP_CHECK(tp_.cp_size() == 1, "packed sequences (reset_position_ids / reset_attention_mask / sft) are not "
             "implemented with context parallelism (context_parallel_size {})", tp_.cp_size());
  MCPP_CHECK(!(stage_.post_process && !mtp_.empty() && opt.training),
             "packed sequences (reset_position_ids / reset_attention_mask / sft) are not implemented with "
             "multi-token prediction (mtp_num_layers {}): its rolled tokens would cross documents", config_.mtp_num_layers);
  MCPP_CHECK(!p->position_ids.defined() || p->position_ids.shape() == Shape({s, b}),
             "packed sequences: position_ids must be [s={}, b={}]; got {}", s, b, p->position_ids.str());
  if (p->position_ids.defined() && p->position_ids.is_cpu())  // ids index the position tables (no device check)
    for (int64_t i = 0; i < s * b; ++i) {
      const int32_t id = p->position_ids.data<int32_t>()[i];
      MCPP_CHECK(id >= 0 && id < s, "packed sequences: position id {} at token {} is outside [0, s={})", id, i, s);
    }
  ctx.packed = p->to_device(device_);
  opt.packed_seq_params = &ctx.packed;
}

Tensor GPTModel::forward_step(GPTModelCtx& ctx, const Tensor& tokens_in, const Tensor& input, const Tensor& labels,
                              const Tensor& loss_mask, const ForwardOptions& opt_in, LossResult* loss) {
  MCPP_CHECK(tokens_in.ndim() == 2 && tokens_in.dtype() == DType::I32, "tokens must be int32 [s, b], got {}",
             tokens_in.str());
  const ModuleScope m("GPTModel", tokens_in);
  const Tensor tokens = tokens_in.device() == device_ ? tokens_in : tokens_in.to(device_);
  const int64_t s = tokens.size(0);
  if (fp8_updates_) fp8_updates_->begin(tp::Fp8UpdateGroup::Pass::Forward);
  ForwardOptions opt = opt_in;
  InferenceContext* ic = opt.inference;
  if (ic) check_inference_step(*ic, s, tokens.size(1));
  set_packed(ctx, opt, s, tokens.size(1));
  Tensor x;
  if (stage_.pre_process) {
    x = embed(ctx, tokens, opt);
  } else {
    MCPP_CHECK(input.defined(), "pipeline stage without the embedding needs the previous stage's hidden state");
    ctx.tokens = tokens;
    ctx.input = input;
    x = input;  // [s(/tp), b, h]
  }
  // The attention applies RoPE to the whole sequence (CP a2a: after cp2hp) — except the ring attention and
  // multi-latent attention, which rotate this CP rank's rows where they are: their rows of the tables.
  const bool rows_rope = tp_.cp_p2p || config_.multi_latent_attention;
  if (has_rope_ && ic && !ic->prefill()) {  // a KV-cache decode step: one table row per sequence, at its position
    ctx.rope = rope_at(ic->lengths_tensor());
  } else if (has_rope_ && ctx.packed.position_ids.defined()) {  // packed: each token's row, [s*b, rot/2]
    ctx.rope = rope_at(ctx.packed.position_ids.view({s * tokens.size(1)}));
  } else if (!has_rope_ || tp_.cp_size() == 1 || !rows_rope) {
    ctx.rope = rope_for(s * tp_.cp_size());
  } else {
    if (rope_cp_s_ != s) {
      rope_cp_ = cp_rope_rows(rope_for(s * tp_.cp_size()), cp_rows(s * tp_.cp_size(), tp_.cp_size(), tp_.cp_rank(),
                                                                    tp_.cp_p2p));
      rope_cp_s_ = s;
    }
    ctx.rope = rope_cp_;
  }
  Tensor h = decoder_->forward(ctx.decoder, x, has_rope_ ? &ctx.rope : nullptr, opt);  // [s(/tp), b, h]
  if (!stage_.post_process) {
    flush_fp8(tp::Fp8UpdateGroup::Pass::Forward);
    return m.ret(h);
  }
  Tensor logits = output_layer_->forward(ctx.output, h);  // [s, b, Vp/tp]
  m.out(logits);
  ctx.logits = logits.view({-1, vocab_local_});           // [s*b, Vp/tp]
  if (labels.defined()) {
    {
      const ModuleScope loss_scope("loss", logits);
      compute_loss(ctx, labels, loss_mask, opt.loss_grad_scale);
      loss_scope.out(ctx.loss_stats);
    }
    ctx.mtp.clear();
    if (!mtp_.empty() && opt.training) mtp_forward(ctx, h, opt);
  } else {
    MCPP_CHECK(!loss, "forward_step: the loss needs labels and a loss mask");
  }
  flush_fp8(tp::Fp8UpdateGroup::Pass::Forward);
  if (loss) *loss = LossResult::from_stats(ctx.loss_stats);
  return Tensor();
}

void GPTModel::flush_fp8(tp::Fp8UpdateGroup::Pass p) {
  if (fp8_updates_) fp8_updates_->flush(p);
}

Tensor GPTModel::backward_step(GPTModelCtx& ctx, float grad_scale, const Tensor& output_grad) {
  const ModuleScope m("GPTModel", output_grad, ModuleScope::kBackward);
  if (fp8_updates_) fp8_updates_->begin(tp::Fp8UpdateGroup::Pass::Backward);
  Tensor d = output_grad;
  if (stage_.post_process) {  // the MTP depths first: the output weight's last use is the main head's
    const Tensor d_mtp = ctx.mtp.empty() ? Tensor() : mtp_backward(ctx, grad_scale);
    d = head_backward(ctx, grad_scale);  // [s(/tp), b, h]
    if (d_mtp.defined()) ops::add_inplace(d, d_mtp);
  }
  MCPP_CHECK(d.defined(), "backward_step on a middle pipeline stage needs the next stage's gradient");
  // The MoE router losses back-propagate with the LM loss's coefficient (x cp, as the loss: see loss_grad_scale).
  Tensor dx = decoder_->backward(ctx.decoder, d, has_rope_ ? &ctx.rope : nullptr, loss_grad_scale(grad_scale));
  flush_fp8(tp::Fp8UpdateGroup::Pass::Backward);
  if (stage_.pre_process) {
    embed_backward(ctx, dx);
    return Tensor();
  }
  return m.ret(dx);
}

Tensor GPTModel::gather_logits(const Tensor& local) const {
  if (tp_.size() == 1) return local;
  // all-gather gives [tp, n, Vp/tp]; interleave into [n, Vp].
  const int64_t n = local.size(0), t = tp_.size();
  Tensor all = Tensor::empty({t * n, vocab_local_}, local.dtype(), local.device());
  tp_.group->all_gather(all, local).wait();
  Tensor host = all.to(Device::CPU), out = Tensor::empty({n, t * vocab_local_});
  if (host.dtype() != DType::F32) host = host.to(DType::F32);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(host.data<float>() + (r * n + i) * vocab_local_, vocab_local_,
                  out.data<float>() + i * t * vocab_local_ + r * vocab_local_);
  return out.to(local.device());
}

LossResult GPTModel::forward_loss(GPTModelCtx& ctx, const Tensor& tokens, const Tensor& labels,
                                  const Tensor& loss_mask, const ForwardOptions& opt) {
  MCPP_CHECK(stage_.pre_process && stage_.post_process, "forward_loss needs the whole model (one pipeline stage)");
  MCPP_CHECK(labels.defined() && loss_mask.defined(), "forward_loss needs labels and a loss mask");
  LossResult r;
  forward_step(ctx, tokens, Tensor(), labels, loss_mask, opt, &r);
  return r;
}

LossResult LossResult::from_stats(const Tensor& stats) {
  const Tensor h = stats.device() == Device::CPU ? stats : stats.to(Device::CPU);
  LossResult r;
  r.loss_sum = h.data<float>()[0];
  r.num_tokens = h.data<float>()[1];
  r.loss = r.num_tokens > 0 ? r.loss_sum / r.num_tokens : 0.0;
  return r;
}

void GPTModel::compute_loss(LossHeadCtx& lh, const Tensor& labels, const Tensor& loss_mask, float grad_scale,
                            float grad_coef, const Tensor* count_base) {
  const int64_t n = labels.numel();
  MCPP_CHECK(loss_mask.defined() && loss_mask.numel() == n, "the loss mask must have one value per label ({}); got {}",
             n, loss_mask.defined() ? loss_mask.str() : "undefined");
  lh.labels = (labels.device() == device_ ? labels : labels.to(device_)).view({n});
  lh.loss_mask = (loss_mask.device() == device_ ? loss_mask : loss_mask.to(device_)).view({n});
  Tensor loss = Tensor::empty({n}, DType::F32, device_);
  lh.lse = Tensor::empty({n}, DType::F32, device_);
  lh.loss_stats = Tensor::empty({2}, DType::F32, device_);
  lh.logits_hold_grad_for = 0.0f;
  lh.grad_coef = grad_coef;
  // The backward's divisor: this head's token count (stats[1], summed over CP), or none per token — except an MTP
  // depth per token: (its tokens / the main loss's tokens), so that its coefficient is times main / its tokens.
  auto set_grad_stats = [&] {
    lh.grad_per_token = config_.calculate_per_token_loss;
    lh.grad_stats = lh.loss_stats;
    if (count_base && lh.grad_per_token) {
      lh.grad_stats = Tensor::zeros({2}, DType::F32, device_);
      Tensor ratio = lh.grad_stats.flat_slice(1, {1});  // = stats[1] * (1 / base[1]): masked_loss_grad's product
      ops::masked_loss_grad(ratio, lh.loss_stats.flat_slice(1, {1}), *count_base, 1.0f, false);
      lh.grad_per_token = false;
    }
  };
  if (grad_scale > 0.0f && tp_.size() == 1) {
    // The loss gradient depends on the mask only: d(grad_scale * masked mean)/d loss_i = mask_i * coef.
    // Its token count first (stats[1] = sum(mask), over the CP ranks' chunks; stats[0] is overwritten below),
    // then cross entropy forward + backward in one pass, the gradient written over the logits.
    ops::masked_loss_stats(lh.loss_stats, lh.loss_mask, lh.loss_mask);
    sum_over_cp(lh.loss_stats);
    set_grad_stats();
    Tensor dloss = Tensor::empty({n}, DType::F32, device_);
    ops::masked_loss_grad(dloss, lh.loss_mask, lh.grad_stats, loss_grad_scale(grad_scale) * grad_coef,
                          lh.grad_per_token);
    ops::cross_entropy_fwd_bwd(loss, lh.lse, lh.logits, lh.logits, lh.labels, dloss);
    lh.logits_hold_grad_for = grad_scale;
  } else {
    tp::vocab_parallel_cross_entropy_fwd(loss, lh.lse, lh.logits, lh.labels, vocab_start_, *tp_.group);
  }
  ops::masked_loss_stats(lh.loss_stats, loss, lh.loss_mask);  // stays on the device (no sync)
  sum_over_cp(lh.loss_stats);  // the whole sequence's statistics on every CP rank
  if (lh.logits_hold_grad_for == 0.0f) set_grad_stats();
}

void GPTModel::sum_over_cp(Tensor& stats) const {
  if (tp_.cp_size() > 1) tp_.cp->all_reduce(stats, comm::ReduceOp::Sum).wait();
}

float GPTModel::loss_grad_scale(float grad_scale) const {
  // Context parallelism: each CP rank's tokens get d(mean over the whole sequence)/d loss_i (the token count
  // summed over CP), and the DP reduction averages over dp * cp ranks — times cp restores the sum over the CP
  // ranks (as Megatron's loss * cp_size; Megatron divides by the rank's own token count, which equals this
  // when every chunk has as many unmasked tokens — ours equals the single-rank loss whatever the mask). The
  // per-token loss's gradients are scaled after the reduction (Trainer::scale_grads_per_token).
  return config_.calculate_per_token_loss ? grad_scale : grad_scale * static_cast<float>(tp_.cp_size());
}

void GPTModel::backward(GPTModelCtx& ctx, float grad_scale) {
  MCPP_CHECK(stage_.pre_process && stage_.post_process, "GPTModel::backward needs the whole model; use backward_step");
  backward_step(ctx, grad_scale, Tensor());
}

Tensor GPTModel::head_backward(GPTModelCtx& ctx, float grad_scale) {
  MCPP_CHECK(ctx.lse.defined(), "the last pipeline stage's backward needs the context of a forward with loss");
  return loss_backward(ctx, *output_layer_, grad_scale, ctx.tokens.size(0), ctx.tokens.size(1));
}

Tensor GPTModel::loss_backward(LossHeadCtx& lh, const tp::ColumnParallelLinear& layer, float grad_scale, int64_t s,
                               int64_t b) {
  const int64_t n = lh.labels.numel();
  std::optional<ModuleScope> loss_scope(std::in_place, "loss", lh.logits, ModuleScope::kBackward);
  // d(grad_scale * sum(loss*mask)/sum(mask)) / d loss_i, or with calculate_per_token_loss
  // d(grad_scale * sum(loss*mask)) / d loss_i (the caller divides the gradients by the global token count)
  Tensor dlogits = lh.logits;  // in place: the logits are not needed afterwards
  if (lh.logits_hold_grad_for > 0.0f) {  // the fused loss forward computed it already
    MCPP_CHECK(lh.logits_hold_grad_for == grad_scale,
               "backward_step: grad_scale {} differs from the forward's ForwardOptions::loss_grad_scale {}", grad_scale,
               lh.logits_hold_grad_for);
  } else {
    Tensor dloss = Tensor::empty({n}, DType::F32, device_);
    ops::masked_loss_grad(dloss, lh.loss_mask, lh.grad_stats, loss_grad_scale(grad_scale) * lh.grad_coef,
                          lh.grad_per_token);
    tp::vocab_parallel_cross_entropy_bwd(dlogits, dloss, lh.logits, lh.labels, lh.lse, vocab_start_, *tp_.group);
  }
  loss_scope->out(dlogits);
  loss_scope.reset();
  Tensor dh = layer.backward(lh.output, dlogits.view({s, b, vocab_local_}));  // [s(/tp), b, h]
  lh.logits = Tensor();  // consumed
  return dh;
}

Tensor GPTModel::roll_left(const Tensor& t) const {
  const int64_t s_local = t.size(0), b = t.size(1);
  const int cp = tp_.cp_size();
  const int64_t s = s_local * cp;
  // This rank's chunks of the sequence (one, or the load-balanced two); each rolls within itself, and its last row
  // takes the first row of the chunk that follows it in the sequence (another CP rank's: all-gathered), or zero.
  const std::vector<CpRows> mine = cp_rows(s, cp, tp_.cp_rank(), tp_.cp_p2p);
  const auto chunks = static_cast<int64_t>(mine.size());
  Tensor firsts;  // [cp * chunks, b]: every rank's chunks' first rows
  if (cp > 1) {
    Tensor heads = Tensor::empty({chunks, b}, t.dtype(), t.device());
    int64_t o = 0;
    for (int64_t j = 0; j < chunks; ++j) {
      heads.narrow0(j, 1).copy_from(t.narrow0(o, 1));
      o += mine[static_cast<size_t>(j)].count;
    }
    firsts = Tensor::empty({cp * chunks, b}, t.dtype(), t.device());
    tp_.cp->all_gather(firsts, heads).wait();
  }
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  int64_t o = 0;
  for (const CpRows& r : mine) {
    if (r.count > 1) out.narrow0(o, r.count - 1).copy_from(t.narrow0(o + 1, r.count - 1));
    Tensor last = out.narrow0(o + r.count - 1, 1);
    const int64_t next = r.first + r.count;  // the sequence row that moves into this chunk's last row
    bool found = false;
    for (int q = 0; q < cp && next < s && !found; ++q) {
      const std::vector<CpRows> theirs = cp_rows(s, cp, q, tp_.cp_p2p);
      for (int64_t j = 0; j < chunks && !found; ++j)
        if (theirs[static_cast<size_t>(j)].first == next) {
          last.copy_from(firsts.narrow0(q * chunks + j, 1));  // (cp > 1: with one rank next == s)
          found = true;
        }
    }
    if (!found) last.zero_();  // the sequence's last row (Megatron's roll_tensor fills 0)
    o += r.count;
  }
  return out;
}

void GPTModel::mtp_forward(GPTModelCtx& ctx, const Tensor& h0, const ForwardOptions& opt) {
  const int64_t s = ctx.tokens.size(0), b = ctx.tokens.size(1), depths = config_.mtp_num_layers;
  const float coef = config_.mtp_loss_scaling_factor / static_cast<float>(depths);
  ctx.mtp.assign(static_cast<size_t>(depths), {});
  Tensor tokens = ctx.tokens, labels = ctx.labels.view({s, b}), mask = ctx.loss_mask.view({s, b});
  Tensor hidden = h0;
  for (int64_t k = 0; k < depths; ++k) {
    MtpDepthCtx& d = ctx.mtp[static_cast<size_t>(k)];
    tokens = roll_left(tokens), labels = roll_left(labels), mask = roll_left(mask);
    d.tokens = tokens;
    const Tensor e = finish_embedding(word_embedding_->forward(tokens.view({s * b})).view({s, b, config_.hidden_size}),
                                      opt, d.embedding_dropout, d.embedding_dropout_key);
    hidden = mtp_[static_cast<size_t>(k)]->forward(d.layer, hidden, e, has_rope_ ? &ctx.rope : nullptr, opt);
    d.logits = mtp_output_layer_->forward(d.output, hidden).view({-1, vocab_local_});
    compute_loss(d, labels, mask, opt.loss_grad_scale, coef, &ctx.loss_stats);
    if (opt.mtp_losses) {  // {mean, 1}: Megatron's sum(loss * mask) / max(sum(mask), 1), 0 without tokens
      Tensor v = Tensor::empty({2}, DType::F32, device_);
      Tensor mean = v.flat_slice(0, {1});
      ops::masked_loss_grad(mean, d.loss_stats.flat_slice(0, {1}), d.loss_stats, 1.0f, false);
      v.flat_slice(1, {1}).copy_from(one_);
      opt.mtp_losses->add(v, k);
    }
  }
}

Tensor GPTModel::mtp_backward(GPTModelCtx& ctx, float grad_scale) {
  const int64_t s = ctx.tokens.size(0), b = ctx.tokens.size(1);
  Tensor dnext;  // d h_k from depth k + 1's hnorm
  for (auto k = static_cast<int64_t>(ctx.mtp.size()); k-- > 0;) {
    MtpDepthCtx& d = ctx.mtp[static_cast<size_t>(k)];
    Tensor dh = loss_backward(d, *mtp_output_layer_, grad_scale, s, b);
    if (dnext.defined()) ops::add_inplace(dh, dnext);
    auto [dhidden, demb] = mtp_[static_cast<size_t>(k)]->backward(d.layer, dh, has_rope_ ? &ctx.rope : nullptr,
                                                                   loss_grad_scale(grad_scale));
    word_embedding_backward(demb, d.tokens, d.embedding_dropout, d.embedding_dropout_key);
    dnext = dhidden;
    d = {};
  }
  ctx.mtp.clear();
  // The word embeddings' last use on this stage when neither the embedding nor a tied output layer is here.
  if (!stage_.pre_process && config_.untie_embeddings_and_output_weights) word_embeddings_->grad_ready();
  return dnext;
}

}  // namespace mcpp
