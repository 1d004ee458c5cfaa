// Model FLOPs of a training iteration and the peak they are compared with (Megatron's throughput per GPU and MFU).
//
// num_floating_point_operations(config, batch): Megatron-LM's function of the same name (megatron/training/
// training.py, transformer_flops(); fetched 2026-08 at d98e8a6), for one global batch of `batch` samples of
// seq_length tokens: 3 passes (forward, backward dgrad, backward wgrad) x 2 FLOPs per multiply-add x, per token,
//   the MLPs:      h * ffn * (3 with SwiGLU, else 2) per dense layer; per MoE layer h * moe_ffn * topk * (3|2)
//                  (the routed experts) + h * shared_expert_intermediate_size * (3|2) (the router's GEMM is not
//                  counted, as Megatron);
//   attention:     projections h * (q + k + v) + q * h with q = kv_channels * heads, k = v = kv_channels * groups
//                  (GQA), and the core attention s * q (QK^T and AV, halved by the causal mask) per layer; MLA:
//                  Megatron's q / kv LoRA terms (+1 for each latent norm) and the core with (qk_head_dim +
//                  qk_pos_emb_head_dim) query/key and v_head_dim value channels;
//   MTP:           per depth one more layer of the decoder's last kind, eh_proj (2h x h) and its norms (3h), and one
//                  more logits pass;
//   the logits:    h * padded_vocab_size per depth + 1.
// It counts the model's math once (model FLOPs): activation recompute is not in it (MFU, not HFU).
// hardware_floating_point_operations adds the forwards that recompute re-runs (full: every recomputed layer's
// forward; selective: core_attn / mlp / moe / shared_experts' forwards) — the FLOPs the device actually ran.
// For plain GPT (MHA, GELU 4h MLP, no MoE / MTP) these are exactly
//   model    = 72 B s L h^2 (1 + s / (12 h) + V / (12 L h))
//   hardware = 96 B s L h^2 (1 + s / (12 h) + V / (16 L h))   with full recompute of every layer
// — Narayanan et al. (2021)'s formulas with the causal mask halving the attention's s^2 term (docs/OBSERVABILITY.md
// compares them with DESIGN.md's 72 B s L h^2 (1 + s / (6 h) + V / (16 L h))).
//
// Throughput: TFLOP/s/GPU = flops / (seconds per iteration * 1e12 * world size) (Megatron's log line); MFU = that
// over the peak: peak_tflops() — --peak-tflops when given (> 0), else the dense bf16 tensor-core peak of a known
// GPU for a bf16 run (H100 SXM / H200 / GH200: 989, H100 PCIe: 756, H100 NVL: 835, A100: 312 TFLOP/s), else 0
// (unknown: MFU is not reported; on CPU ranks give --peak-tflops to get one).
#pragma once
#include <cstdint>
#include <string>

#include "mcpp/training/config.h"

namespace mcpp {

double num_floating_point_operations(const Config& config, int64_t batch_size);
double hardware_floating_point_operations(const Config& config, int64_t batch_size);

// The dense bf16 peak in TFLOP/s of the GPU named `device_name` (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB
// HBM3"); 0 when it is not in the table.
double known_gpu_peak_tflops(const std::string& device_name);
// The peak MFU is measured against: the flag, else the table's for a bf16 run on a known GPU, else 0 (none).
double peak_tflops(double flag_tflops, const std::string& device_name, bool bf16);

}  // namespace mcpp
