# On the device (torch + transformers): HF loads our exports (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM,
# Qwen2MoeForCausalLM)
# and computes the same logits as `mcpp forward`
# (CPU, fp32). Inputs come from tests/device/prepare_hf_check.sh (run here, carried as device_carry/).
import json, sys, numpy as np, torch, transformers
from transformers import AutoModelForCausalLM
ids = torch.tensor(np.loadtxt("device_carry/tokens.txt", dtype=np.int64))
ok = True
for name in sys.argv[1:] or ["gpt2", "llama", "mixtral", "qwen2-moe"]:  # a subset when the carry's 64 MiB holds not all
    m = AutoModelForCausalLM.from_pretrained(f"device_carry/hf-{name}", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        hf = m(ids).logits.float().numpy()
    ours = np.load(f"device_carry/{name}.npy")
    err = float(np.max(np.abs(hf - ours)) / np.max(np.abs(hf)))
    print(json.dumps({"model": name, "class": type(m).__name__, "shape": list(hf.shape), "max_rel_err": err,
                      "transformers": transformers.__version__, "torch": torch.__version__}))
    ok &= hf.shape == ours.shape and err < 1e-4
print("HF_CHECK", "PASS" if ok else "FAIL")
