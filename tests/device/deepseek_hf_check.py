# DeepSeek-V2 / V3 HF import and export against transformers' own models (on the device: torch + transformers; CPU
# torch is enough). For each model below: build a tiny random transformers model (DeepseekV3ForCausalLM /
# DeepseekV2ForCausalLM, fp32, initializer_range 0.2, the routers' e_score_correction_bias random in [0, 0.5) so the
# expert bias changes the routing — positive because transformers masks the excluded groups' scores with 0.0 where
# Megatron (and mcpp) use -inf: the two differ only when a kept expert's biased score s + b is negative), save_pretrained (safetensors), take its logits on two fixed 16-token sequences, then
#   MCPP ckpt import --input hf-NAME --format hf-deepseek-vN --save ckpt-NAME
#   MCPP forward --load ckpt-NAME --tokens tokens.txt --output ours-NAME.npy         (CPU, fp32)
# and compare (max |ours - hf| / max |hf| < 1e-4, as hf_logits_check.py); then
#   MCPP ckpt export --load ckpt-NAME --format hf-deepseek-vN --output export-NAME
# and transformers loads the export (AutoModelForCausalLM) and computes the logits again (< 1e-4 against its own).
# Guards that the check sees what it claims: the V3 logits with the expert bias zeroed, and the YaRN model's with
# plain RoPE, differ from the reference by > 1e-3.
#   v3       q_lora_rank 32, plain RoPE, first_k_dense_replace 1, 8 routed experts top-4 in 4 groups of which 2 are
#            kept (top-4 = 2 x topk_group: HF's top-2 group ranking), 1 shared expert, routed_scaling_factor 2.5,
#            norm_topk_prob, untied
#   v3-yarn  the same with YaRN (factor 4, original 16, max positions 64, mscale 0.707, mscale_all_dim 1) and q_proj
#            (q_lora_rank null)
#   v2       DeepSeek-V2: q_proj, plain RoPE, 8 experts top-2 softmax group_limited_greedy in 4 groups of which 2 are
#            kept (top-2 = topk_group), 2 shared experts, routed_scaling_factor 1.5, norm_topk_prob false, untied
#   v2-tied  greedy routing, q_lora_rank 32, tied embeddings
# transformers drops DeepSeek-V3's MTP layers when it loads a model and does not build them: the MTP depths are
# checked by the C++ round trip only (tests/dist_checkpointing/hf_deepseek_test.cpp).
#
# Usage (on the device, from the repository root, after building mcpp there):
#   python3 tests/device/deepseek_hf_check.py build/bin/mcpp /tmp/ds_check [NAME...]
# Passing prints one JSON line per model and direction with max_rel_err (expected ~1e-6; fp32 noise) and ends with
#   DEEPSEEK_HF_CHECK PASS
import json
import os
import subprocess
import sys

import numpy as np


def configs(transformers):
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=16,
                  qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, rms_norm_eps=1e-6,
                  max_position_embeddings=64, initializer_range=0.2, attention_bias=False, hidden_act="silu")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 1.0}

    def v3(rope=None, **kw):
        args = dict(common, n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
                    routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False,
                    num_nextn_predict_layers=1, **kw)
        rp = dict(rope or {"rope_type": "default"}, rope_theta=10000.0)
        try:  # transformers 5: rope_parameters; 4: rope_theta + rope_scaling
            return transformers.DeepseekV3Config(rope_parameters=rp, **args)
        except TypeError:
            return transformers.DeepseekV3Config(rope_theta=10000.0, rope_scaling=rope, **args)

    def v2(**kw):
        args = dict(common, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, routed_scaling_factor=1.5,
                    norm_topk_prob=False, **kw)
        try:
            return transformers.DeepseekV2Config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                                 **args)
        except TypeError:
            return transformers.DeepseekV2Config(rope_theta=10000.0, **args)

    return {
        "v3": ("hf-deepseek-v3", transformers.DeepseekV3ForCausalLM, lambda: v3(q_lora_rank=32)),
        "v3-yarn": ("hf-deepseek-v3", transformers.DeepseekV3ForCausalLM, lambda: v3(yarn, q_lora_rank=None),
                    lambda: v3(None, q_lora_rank=None)),  # (the same without YaRN: the guard's model)
        "v2": ("hf-deepseek-v2", transformers.DeepseekV2ForCausalLM,
               lambda: v2(q_lora_rank=None, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                          tie_word_embeddings=False)),
        "v2-tied": ("hf-deepseek-v2", transformers.DeepseekV2ForCausalLM,
                    lambda: v2(q_lora_rank=32, topk_method="greedy", n_group=1, topk_group=1,
                               tie_word_embeddings=True)),
    }


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b))) if a.shape == b.shape else float("inf")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(json.dumps({"command": " ".join(cmd), "rc": r.returncode, "stderr": r.stderr[-2000:]}))
        raise SystemExit("DEEPSEEK_HF_CHECK FAIL")
    return r.stdout


def main():
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    mcpp, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    models = configs(transformers)
    names = sys.argv[3:] or list(models)
    os.makedirs(out, exist_ok=True)
    ids = np.random.default_rng(5).integers(0, 512, size=(2, 16))
    tokens = os.path.join(out, "tokens.txt")
    np.savetxt(tokens, ids, fmt="%d")
    ok = True
    for name in names:
        fmt, cls, make = models[name][:3]
        torch.manual_seed(0)
        model = cls(make()).eval()
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n.endswith("e_score_correction_bias"):
                    b.uniform_(0.0, 0.5)  # positive: see the note on masked_fill above
            ref = model(torch.tensor(ids)).logits.float().numpy()
        hf_dir, ckpt, exp = (os.path.join(out, f"{p}-{name}") for p in ("hf", "ckpt", "export"))
        model.save_pretrained(hf_dir, safe_serialization=True)
        run([mcpp, "ckpt", "import", "--input", hf_dir, "--format", fmt, "--save", ckpt])
        ours_path = os.path.join(out, f"ours-{name}.npy")
        run([mcpp, "forward", "--load", ckpt, "--tokens", tokens, "--output", ours_path])
        err = rel(np.load(ours_path), ref)
        print(json.dumps({"model": name, "direction": "import: mcpp forward vs transformers", "max_rel_err": err,
                          "class": cls.__name__, "transformers": transformers.__version__,
                          "torch": torch.__version__}))
        ok &= err < 1e-4
        run([mcpp, "ckpt", "export", "--load", ckpt, "--format", fmt, "--output", exp])
        back = AutoModelForCausalLM.from_pretrained(exp, dtype=torch.float32).eval()
        with torch.no_grad():
            err = rel(back(torch.tensor(ids)).logits.float().numpy(), ref)
        print(json.dumps({"model": name, "direction": "export: transformers on the export vs the reference",
                          "max_rel_err": err, "class": type(back).__name__}))
        ok &= err < 1e-4
        guards = []
        if name == "v3":  # the expert bias must change the routing
            with torch.no_grad():
                for n, b in model.named_buffers():
                    if n.endswith("e_score_correction_bias"):
                        b.zero_()
                guards.append(("without the expert bias", model(torch.tensor(ids)).logits.float().numpy()))
        if name == "v3-yarn":  # YaRN must matter
            m2 = cls(models[name][3]()).eval()
            m2.load_state_dict(model.state_dict(), strict=False)
            with torch.no_grad():
                guards.append(("with plain RoPE", m2(torch.tensor(ids)).logits.float().numpy()))
        for what, logits in guards:
            err = rel(logits, ref)
            print(json.dumps({"model": f"{name} {what} (must differ)", "max_rel_err": err}))
            ok &= err > 1e-3
    print("DEEPSEEK_HF_CHECK", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
