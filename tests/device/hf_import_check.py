# The import direction of the HF conversion, with HF's own writer: on the device (torch + transformers) build a random
# MixtralForCausalLM (GQA 4:2, 4 experts top-2, untied, vocab 512), save it with save_pretrained (safetensors) and
# write its fp32 logits on two fixed 16-token sequences:
#   python3 tests/device/hf_import_check.py make OUTDIR
# then here: `mcpp ckpt import --format hf-mixtral`, `mcpp forward` on the same tokens and
#   python3 tests/device/hf_import_check.py compare OUTDIR OURS.npy
# (max relative logit error < 1e-4, as hf_logits_check.py).
import json
import os
import sys

import numpy as np


def make(out):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                                     sliding_window=None, tie_word_embeddings=False, initializer_range=0.2)
    model = transformers.MixtralForCausalLM(cfg).eval()
    model.save_pretrained(os.path.join(out, "hf-mixtral-ref"), safe_serialization=True)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 512, size=(2, 16))
    np.savetxt(os.path.join(out, "tokens.txt"), ids, fmt="%d")
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits.float().numpy()
    np.save(os.path.join(out, "hf_logits.npy"), logits)
    print(json.dumps({"made": "MixtralForCausalLM", "logits": list(logits.shape),
                      "transformers": transformers.__version__, "torch": torch.__version__}))


def compare(out, ours_path):
    hf = np.load(os.path.join(out, "hf_logits.npy"))
    ours = np.load(ours_path)
    err = float(np.max(np.abs(hf - ours)) / np.max(np.abs(hf))) if hf.shape == ours.shape else float("inf")
    print(json.dumps({"model": "mixtral (imported)", "shape": list(ours.shape), "max_rel_err": err}))
    print("HF_IMPORT_CHECK", "PASS" if err < 1e-4 else "FAIL")
    sys.exit(0 if err < 1e-4 else 1)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        compare(sys.argv[2], sys.argv[3])
