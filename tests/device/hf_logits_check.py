# On the device (torch + transformers): HF loads our exports (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM,
# Qwen2MoeForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM) and computes the same logits as `mcpp forward` (CPU,
# fp32). Inputs come from tests/device/prepare_hf_check.sh (run here, carried as hf_carry/).
import json, sys, numpy as np, torch, transformers
from transformers import AutoModelForCausalLM
ok = True
for name in sys.argv[1:] or ["gpt2", "llama", "mixtral", "qwen2-moe", "qwen2", "qwen3", "qwen3-moe", "llama3",
                             "llama-linear"]:
    small = name.startswith("qwen3") or name == "qwen2"
    tokens = "hf_carry/tokens512.txt" if small else "hf_carry/tokens.txt"  # vocab 512 / GPT-2's
    if name in ("llama3", "llama-linear"):  # RoPE scaling / interpolation: 2048 positions, vocab 512
        tokens = "hf_carry/tokens_long.txt"
    ids = torch.tensor(np.loadtxt(tokens, dtype=np.int64))
    m = AutoModelForCausalLM.from_pretrained(f"hf_carry/hf-{name}", dtype=torch.float32).eval()
    with torch.no_grad():
        hf = m(ids).logits.float().numpy()
    ours = np.load(f"hf_carry/{name}.npy")
    err = float(np.max(np.abs(hf - ours)) / np.max(np.abs(hf)))
    print(json.dumps({"model": name, "class": type(m).__name__, "shape": list(hf.shape), "max_rel_err": err,
                      "transformers": transformers.__version__, "torch": torch.__version__}))
    ok &= hf.shape == ours.shape and err < 1e-4
    if name in ("llama3", "llama-linear"):  # the check must see the scaling: HF without it differs far more
        cfg = m.config
        for field in ("rope_scaling", "rope_parameters"):
            if isinstance(getattr(cfg, field, None), dict):
                setattr(cfg, field, {k: v for k, v in getattr(cfg, field).items() if k == "rope_theta"} |
                        {"rope_type": "default"})
        plain = AutoModelForCausalLM.from_pretrained(f"hf_carry/hf-{name}", config=cfg, dtype=torch.float32).eval()
        with torch.no_grad():
            unscaled = float(np.max(np.abs(plain(ids).logits.float().numpy() - ours)) / np.max(np.abs(hf)))
        print(json.dumps({"model": f"{name} against HF without the scaling", "max_rel_err": unscaled}))
        ok &= unscaled > 1e-3
print("HF_CHECK", "PASS" if ok else "FAIL")
