# The import direction of the HF conversion, with HF's own writer: on the device (torch + transformers) build a random
# MixtralForCausalLM and a random Qwen2MoeForCausalLM (GQA 4:2, 4 experts top-2, untied, vocab 512; Qwen2-MoE: q/k/v
# biases, unnormalized top-k, a gated shared expert, layer 1 dense), save them with save_pretrained (safetensors) and
# write their fp32 logits on two fixed 16-token sequences:
#   python3 tests/device/hf_import_check.py make OUTDIR
# then here, for NAME in mixtral, qwen2-moe: `mcpp ckpt import --input OUTDIR/hf-NAME-ref --format hf-NAME`,
# `mcpp forward --tokens OUTDIR/tokens.txt` and
#   python3 tests/device/hf_import_check.py compare OUTDIR NAME OURS.npy
# (max relative logit error < 1e-4, as hf_logits_check.py).
import json
import os
import sys

import numpy as np


def make(out):
    import torch
    import transformers
    common = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, num_experts_per_tok=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  initializer_range=0.2)
    models = {
        "mixtral": (transformers.MixtralConfig(intermediate_size=96, num_local_experts=4, sliding_window=None,
                                               **common), transformers.MixtralForCausalLM),
        "qwen2-moe": (transformers.Qwen2MoeConfig(intermediate_size=128, num_experts=4, moe_intermediate_size=48,
                                                  shared_expert_intermediate_size=64, norm_topk_prob=False,
                                                  decoder_sparse_step=1, mlp_only_layers=[1], use_sliding_window=False,
                                                  **common), transformers.Qwen2MoeForCausalLM)}
    ids = np.random.default_rng(5).integers(0, 512, size=(2, 16))
    np.savetxt(os.path.join(out, "tokens.txt"), ids, fmt="%d")
    for name, (cfg, cls) in models.items():
        torch.manual_seed(0)
        model = cls(cfg).eval()
        with torch.no_grad():  # the q/k/v biases start at zero: make them count
            for n, p in model.named_parameters():
                if n.endswith("_proj.bias"):
                    p.normal_(0.0, 0.5)
        model.save_pretrained(os.path.join(out, f"hf-{name}-ref"), safe_serialization=True)
        with torch.no_grad():
            logits = model(torch.tensor(ids)).logits.float().numpy()
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
        make(sys.argv[2])
    else:
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
