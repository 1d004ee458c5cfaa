# The import direction of the HF conversion, with HF's own writer (see tests/device/prepare_hf_check.sh's end):
#   python3 tests/device/hf_import_check.py make OUTDIR [NAME...]   (on the device; NAME: mixtral qwen2-moe qwen2
#                                                                    qwen3 qwen3-moe llama3, default all; llama3's
#                                                                    logits on OUTDIR/tokens_long.txt)
#     (the MoE models also as OUTDIR/hf-NAME-fused: model.state_dict() as it is in memory, written with
#     safetensors' save_file — transformers 5's fused expert tensors, the layout of checkpoints saved natively in 5)
#   python3 tests/device/hf_import_check.py compare OUTDIR NAME OURS.npy   (numpy only)
# (max relative logit error < 1e-4, as hf_logits_check.py).
import json
import os
import sys

import numpy as np


def llama3_config(transformers, scaling=None):
    scaling = scaling or {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}
    common = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
                  intermediate_size=96)
    try:  # transformers 5: rope_parameters; 4: rope_theta + rope_scaling
        return transformers.LlamaConfig(rope_parameters={**scaling, "rope_theta": 500000.0}, **common)
    except TypeError:
        return transformers.LlamaConfig(rope_theta=500000.0, rope_scaling=scaling, **common)


def make(out, names):
    import torch
    import transformers
    common = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2)
    moe = dict(num_experts_per_tok=2, **common)
    models = {
        "mixtral": (lambda: transformers.MixtralConfig(intermediate_size=96, num_local_experts=4, sliding_window=None,
                                                       **moe), transformers.MixtralForCausalLM),
        "qwen2-moe": (lambda: transformers.Qwen2MoeConfig(intermediate_size=128, num_experts=4,
                                                          moe_intermediate_size=48,
                                                          shared_expert_intermediate_size=64, norm_topk_prob=False,
                                                          decoder_sparse_step=1, mlp_only_layers=[1],
                                                          use_sliding_window=False, **moe),
                      transformers.Qwen2MoeForCausalLM),
        "qwen2": (lambda: transformers.Qwen2Config(intermediate_size=96, use_sliding_window=False, **common),
                  transformers.Qwen2ForCausalLM),
        # Qwen3: head_dim 32 (4 heads x 32 = 128 != hidden 64), q/k norms; Qwen3-MoE: layer 0 dense, normalized top-k
        "qwen3": (lambda: transformers.Qwen3Config(intermediate_size=96, head_dim=32, use_sliding_window=False,
                                                   **common), transformers.Qwen3ForCausalLM),
        "qwen3-moe": (lambda: transformers.Qwen3MoeConfig(intermediate_size=96, head_dim=32, num_experts=4,
                                                          moe_intermediate_size=48, norm_topk_prob=True,
                                                          decoder_sparse_step=1, mlp_only_layers=[0],
                                                          use_sliding_window=False, **moe),
                      transformers.Qwen3MoeForCausalLM),
        # Llama 3.1's RoPE scaling (rope_type llama3, factor 8, Megatron's fixed band factors), positions to 2048
        "llama3": (lambda: llama3_config(transformers), transformers.LlamaForCausalLM),
        # position interpolation (rope_type linear, factor 4), positions to 2048
        "llama-linear": (lambda: llama3_config(transformers, {"rope_type": "linear", "factor": 4.0}),
                         transformers.LlamaForCausalLM)}
    short = np.random.default_rng(5).integers(0, 512, size=(2, 16))
    long = np.random.default_rng(6).integers(0, 512, size=(2, 2048))  # (llama3: positions reaching its bands)
    os.makedirs(out, exist_ok=True)
    np.savetxt(os.path.join(out, "tokens.txt"), short, fmt="%d")
    np.savetxt(os.path.join(out, "tokens_long.txt"), long, fmt="%d")
    for name in names or models:
        ids = long if name in ("llama3", "llama-linear") else short
        make_cfg, cls = models[name]
        torch.manual_seed(0)
        model = cls(make_cfg()).eval()
        with torch.no_grad():  # the q/k/v biases start at zero and the q/k norms at one: make them count
            for n, p in model.named_parameters():
                if n.endswith("_proj.bias"):
                    p.normal_(0.0, 0.5)
                if n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
                    p.uniform_(0.5, 1.5)
        model.save_pretrained(os.path.join(out, f"hf-{name}-ref"), safe_serialization=True)
        if name not in ("qwen2", "qwen3", "llama3", "llama-linear"):  # the MoE models' in-memory tensors as they are (transformers 5: fused experts)
            from safetensors.torch import save_file
            fused = os.path.join(out, f"hf-{name}-fused")
            os.makedirs(fused, exist_ok=True)
            model.config.to_json_file(os.path.join(fused, "config.json"))
            sd = {k: v.contiguous() for k, v in model.state_dict().items()}
            save_file(sd, os.path.join(fused, "model.safetensors"), metadata={"format": "pt"})
            print(json.dumps({"fused": name, "expert_tensors": {k: list(v.shape) for k, v in sd.items()
                                                                if k.startswith("model.layers.0.") and "expert" in k
                                                                and ".experts.1." not in k
                                                                and ".experts.2." not in k
                                                                and ".experts.3." not in k}}))
        with torch.no_grad():
            logits = model(torch.tensor(ids)).logits.float().numpy()
            if name in ("llama3", "llama-linear"):  # 2048 positions: the fp32 noise floor, HF's own fp32 vs float64
                f64 = model.double()(torch.tensor(ids)).logits.numpy()
                print(json.dumps({"model": f"{name}: HF fp32 against HF float64",
                                  "max_rel_err": float(np.max(np.abs(logits - f64)) / np.max(np.abs(f64)))}))
                np.save(os.path.join(out, f"hf_logits_{name}_f64.npy"), f64.astype(np.float32))
        np.save(os.path.join(out, f"hf_logits_{name}.npy"), logits)
        print(json.dumps({"made": cls.__name__, "logits": list(logits.shape),
                          "transformers": transformers.__version__, "torch": torch.__version__}))


def compare(out, name, ours_path):
    hf = np.load(os.path.join(out, f"hf_logits_{name}.npy"))
    ours = np.load(ours_path)
    err = float(np.max(np.abs(hf - ours)) / np.max(np.abs(hf))) if hf.shape == ours.shape else float("inf")
    print(json.dumps({"model": f"{name} (imported)", "shape": list(ours.shape), "max_rel_err": err}))
    print("HF_IMPORT_CHECK", "PASS" if err < 1e-4 else "FAIL")
    sys.exit(0 if err < 1e-4 else 1)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:])
    else:
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
