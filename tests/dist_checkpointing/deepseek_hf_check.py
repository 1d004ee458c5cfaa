#!/usr/bin/env python3
"""DeepSeek-V2 / V3 Hugging Face directories through `mcpp ckpt import`, `mcpp forward` and `mcpp ckpt export`.

usage: deepseek_hf_check.py MCPP WORKDIR
  1. random HF directories (tensor names and layouts of transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM,
     written as safetensors here; vocabulary 100, padded to 128 on import) for a V3 model (q_a / q_b with the latent
     norm, YaRN factor 4 with mscale / mscale_all_dim, first layer dense, 8 experts top-4 in 4 groups of which 2 are
     kept, positive e_score_correction_bias, routed scaling 2.5, a shared expert, one MTP layer with its copies of
     the embedding and head) and a V2 one (q_proj, plain RoPE, softmax top-2 group_limited_greedy, 2 shared experts,
     tied) import, and `mcpp forward`'s logits equal a float64 transcription of transformers' DeepseekV3 / V2 forward
     (modeling_deepseek_v3 / _v2: interleaved RoPE, YaRN's inv_freq and attention factor as
     modeling_rope_utils._compute_yarn_parameters, the group-limited routers) within 1e-4 (fp32 against fp64);
  2. the import exported again is tensor for tensor the input (bit-exact, every name, nothing more);
  3. bad input is one named error: rope_interleave false, a tensor the model has no place for;
  4. configs/deepseek-v3-tiny.toml with --moe-router-group-topk 1 (DeepSeek-V3's top-2 group ranking: top-2 / 1
     group) trains 2 iterations, exports as hf-deepseek-v3, imports, and `mcpp train` with the same recipe loads the
     import with --finetune and trains on; the recipe as committed (top-2 of the best 2 of 4 groups ranked by their
     top-1) is refused by the export naming model.moe_router_group_topk.
The float64 reference is written from transformers' modeling code (the device check tests/device/deepseek_hf_check.py
runs transformers itself).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "cli"))
from cli_harness import MCPP, WORK, check_error, failures, losses, record_corpus, run  # noqa: E402

torch.manual_seed(0)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32).reshape(v["shape"])
            for k, v in header.items()}


V, H, N, DN, DR, DV, RKV, F, FE = 100, 32, 4, 8, 4, 8, 12, 48, 16


def hf_model(v3):
    rq = 16 if v3 else None
    E, k, G, TG = (8, 4, 4, 2) if v3 else (8, 2, 4, 2)
    c = {"architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
         "model_type": "deepseek_v3" if v3 else "deepseek_v2", "vocab_size": V, "hidden_size": H,
         "intermediate_size": F, "moe_intermediate_size": FE, "num_hidden_layers": 2, "num_attention_heads": N,
         "num_key_value_heads": N, "n_shared_experts": 1 if v3 else 2, "n_routed_experts": E,
         "num_experts_per_tok": k, "n_group": G, "topk_group": TG, "routed_scaling_factor": 2.5 if v3 else 1.5,
         "kv_lora_rank": RKV, "q_lora_rank": rq, "qk_rope_head_dim": DR, "qk_nope_head_dim": DN, "v_head_dim": DV,
         "first_k_dense_replace": 1, "norm_topk_prob": v3, "hidden_act": "silu", "rms_norm_eps": 1e-6,
         "max_position_embeddings": 64 if v3 else 32, "tie_word_embeddings": not v3, "rope_theta": 10000.0,
         "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32,
                          "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0} if v3 else None,
         "attention_bias": False, "num_nextn_predict_layers": 1 if v3 else 0,
         "topk_method": "noaux_tc" if v3 else "group_limited_greedy"}
    w = {}

    def r(name, *shape, scale=0.2):
        w[name] = torch.randn(*shape, dtype=torch.float64) * scale

    def layer(j, moe):
        P = f"model.layers.{j}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            w[P + n + ".weight"] = 1 + 0.1 * torch.randn(H, dtype=torch.float64)
        if rq:
            r(P + "self_attn.q_a_proj.weight", rq, H)
            w[P + "self_attn.q_a_layernorm.weight"] = 1 + 0.1 * torch.randn(rq, dtype=torch.float64)
            r(P + "self_attn.q_b_proj.weight", N * (DN + DR), rq)
        else:
            r(P + "self_attn.q_proj.weight", N * (DN + DR), H)
        r(P + "self_attn.kv_a_proj_with_mqa.weight", RKV + DR, H)
        w[P + "self_attn.kv_a_layernorm.weight"] = 1 + 0.1 * torch.randn(RKV, dtype=torch.float64)
        r(P + "self_attn.kv_b_proj.weight", N * (DN + DV), RKV)
        r(P + "self_attn.o_proj.weight", H, N * DV)
        mlps = [("mlp.", F)]
        if moe:
            r(P + "mlp.gate.weight", E, H, scale=0.5)
            if v3:
                w[P + "mlp.gate.e_score_correction_bias"] = torch.rand(E, dtype=torch.float64) * 0.5
            mlps = [(f"mlp.experts.{e}.", FE) for e in range(E)] + [("mlp.shared_experts.", FE * c["n_shared_experts"])]
        for X, width in mlps:
            r(P + X + "gate_proj.weight", width, H)
            r(P + X + "up_proj.weight", width, H)
            r(P + X + "down_proj.weight", H, width)

    r("model.embed_tokens.weight", V, H, scale=1.0)
    layer(0, False)
    layer(1, True)
    w["model.norm.weight"] = 1 + 0.1 * torch.randn(H, dtype=torch.float64)
    if v3:
        r("lm_head.weight", V, H)
        layer(2, True)  # the MTP layer: DeepSeek's extra decoder layer and its own parts
        for n in ("enorm", "hnorm", "shared_head.norm"):
            w[f"model.layers.2.{n}.weight"] = 1 + 0.1 * torch.randn(H, dtype=torch.float64)
        r("model.layers.2.eh_proj.weight", H, 2 * H)
        w["model.layers.2.embed_tokens.weight"] = w["model.embed_tokens.weight"].clone()
        w["model.layers.2.shared_head.head.weight"] = w["lm_head.weight"].clone()
    w = {k: t.to(torch.float32).to(torch.float64) for k, t in w.items()}  # the values fp32 holds
    return c, w


def get_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def hf_forward(c, w, ids):
    """transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM forward, float64 (MTP layers ignored, as HF)."""
    v3 = c["model_type"] == "deepseek_v3"
    b, s = ids.shape
    eps = c["rms_norm_eps"]

    def rms(x, wt):
        return wt * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def lin(x, name):
        return x @ w[name].T

    base, dim = c["rope_theta"], DR
    rs = c["rope_scaling"]
    scaling = (DN + DR) ** -0.5
    attn_factor = 1.0
    if rs:  # _compute_yarn_parameters
        factor = c["max_position_embeddings"] / rs["original_max_position_embeddings"]
        orig = rs["original_max_position_embeddings"]
        attn_factor = (get_mscale(factor, rs["mscale"]) / get_mscale(factor, rs["mscale_all_dim"])
                       if rs["mscale"] and rs["mscale_all_dim"] else get_mscale(factor))

        def fcd(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        low, high = max(math.floor(fcd(rs["beta_fast"])), 0), min(math.ceil(fcd(rs["beta_slow"])), dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        extra = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
        if rs["mscale_all_dim"]:
            scaling *= get_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    else:
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)  # [s, dim/2]

    def rotate_half(x):
        return torch.cat((-x[..., dim // 2:], x[..., :dim // 2]), -1)

    def rope(x):  # [b, n, s, dim]
        if v3:  # apply_rotary_pos_emb_interleave
            emb = torch.cat((freqs, freqs), -1)
            cos, sin = emb.cos() * attn_factor, emb.sin() * attn_factor
            x = x.reshape(*x.shape[:-1], dim // 2, 2).transpose(-1, -2).reshape(x.shape)
            return x * cos + rotate_half(x) * sin
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())  # DeepseekV2's apply_rotary_emb
        return torch.view_as_real(xc * torch.polar(torch.ones_like(freqs), freqs) * attn_factor).flatten(-2)

    def attention(x, P):
        if c["q_lora_rank"]:
            q = lin(rms(lin(x, P + "q_a_proj.weight"), w[P + "q_a_layernorm.weight"]), P + "q_b_proj.weight")
        else:
            q = lin(x, P + "q_proj.weight")
        q = q.view(b, s, N, DN + DR).transpose(1, 2)
        q_pass, q_rot = q[..., :DN], q[..., DN:]
        ckv = lin(x, P + "kv_a_proj_with_mqa.weight")
        k_pass, k_rot = ckv[..., :RKV], ckv[..., RKV:]
        kv = lin(rms(k_pass, w[P + "kv_a_layernorm.weight"]), P + "kv_b_proj.weight").view(b, s, N, DN + DV)
        kv = kv.transpose(1, 2)
        k_pass, v = kv[..., :DN], kv[..., DN:]
        q_rot, k_rot = rope(q_rot), rope(k_rot.view(b, 1, s, DR))
        query = torch.cat((q_pass, q_rot), -1)
        key = torch.cat((k_pass, k_rot.expand(b, N, s, DR)), -1)
        att = query @ key.transpose(-1, -2) * scaling
        att = att.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return lin((att @ v).transpose(1, 2).reshape(b, s, N * DV), P + "o_proj.weight")

    def mlp(x, P):
        return lin(torch.nn.functional.silu(lin(x, P + "gate_proj.weight")) * lin(x, P + "up_proj.weight"),
                   P + "down_proj.weight")

    def moe(x, P):
        E, k, G, TG = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
        t = x.reshape(-1, H)
        logits = t @ w[P + "gate.weight"].T
        if v3:  # DeepseekV3MoE.route_tokens_to_experts
            sc = logits.sigmoid()
            choice = sc + w[P + "gate.e_score_correction_bias"]
            gs = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        else:  # DeepseekV2Moe: softmax, group_limited_greedy
            sc = logits.softmax(-1)
            choice = sc
            gs = sc.view(-1, G, E // G).max(-1).values
        gidx = gs.topk(TG, dim=-1)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        idx = choice.masked_fill(~smask.bool(), 0.0).topk(k, dim=-1)[1]
        wt = sc.gather(1, idx)
        if v3 and c["norm_topk_prob"]:
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        wt = wt * c["routed_scaling_factor"]
        out = torch.zeros_like(t)
        for e in range(E):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if len(rows):
                out[rows] += wt[rows, slot, None] * mlp(t[rows], f"{P}experts.{e}.")
        return out.view(x.shape) + mlp(x, P + "shared_experts.")

    x = w["model.embed_tokens.weight"][ids]
    for j in range(c["num_hidden_layers"]):
        P = f"model.layers.{j}."
        x = x + attention(rms(x, w[P + "input_layernorm.weight"]), P + "self_attn.")
        y = rms(x, w[P + "post_attention_layernorm.weight"])
        x = x + (mlp(y, P + "mlp.") if j < c["first_k_dense_replace"] else moe(y, P + "mlp."))
    x = rms(x, w["model.norm.weight"])
    return x @ w["lm_head.weight" if not c["tie_word_embeddings"] else "model.embed_tokens.weight"].T


ids = torch.randint(0, V, (2, 16))
tokens = os.path.join(WORK, "tokens.txt")
np.savetxt(tokens, ids.numpy(), fmt="%d")
for v3 in (True, False):
    name = "v3" if v3 else "v2"
    fmt_ = "hf-deepseek-v3" if v3 else "hf-deepseek-v2"
    c, w = hf_model(v3)
    hf_dir = os.path.join(WORK, f"hf-{name}")
    os.makedirs(hf_dir)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(c, f)
    write_safetensors(os.path.join(hf_dir, "model.safetensors"), w)
    ckpt = os.path.join(WORK, f"ckpt-{name}")
    run([MCPP, "ckpt", "import", "--input", hf_dir, "--format", fmt_, "--save", ckpt])
    out = os.path.join(WORK, f"ours-{name}.npy")
    run([MCPP, "forward", "--load", ckpt, "--tokens", tokens, "--output", out])
    if not os.path.exists(out):
        continue
    ref = hf_forward(c, w, ids).numpy()
    ours = np.load(out)
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref))) if ours.shape == ref.shape else float("inf")
    print(json.dumps({"model": name, "max_rel_err": err}))
    if not err < 1e-4:  # fp32 forward against float64
        failures.append(f"{name}: mcpp forward vs the transformers transcription: max rel err {err}")
    exp = os.path.join(WORK, f"export-{name}")
    run([MCPP, "ckpt", "export", "--load", ckpt, "--format", fmt_, "--output", exp])
    got = read_safetensors(os.path.join(exp, "model.safetensors"))
    want = {k: t.to(torch.float32).numpy() for k, t in w.items()}
    if sorted(got) != sorted(want):
        failures.append(f"{name}: exported names differ: extra {sorted(set(got) - set(want))}, "
                        f"missing {sorted(set(want) - set(got))}")
    else:
        for k in want:
            if got[k].shape != want[k].shape or got[k].tobytes() != want[k].tobytes():
                failures.append(f"{name}: exported tensor {k} differs from the imported one")

# bad input: one named error (a config.json field mcpp cannot represent, a tensor it has no place for)
bad = os.path.join(WORK, "hf-bad")
os.makedirs(bad)
c, w = hf_model(True)
with open(os.path.join(bad, "config.json"), "w") as f:
    json.dump({**c, "rope_interleave": False}, f)
write_safetensors(os.path.join(bad, "model.safetensors"), w)
check_error("rope_interleave", ["ckpt", "import", "--input", bad, "--format", "hf-deepseek-v3", "--save",
                                os.path.join(WORK, "bad")], ["rope_interleave", "config.json"])
with open(os.path.join(bad, "config.json"), "w") as f:
    json.dump(c, f)
write_safetensors(os.path.join(bad, "model.safetensors"), {**w, "model.layers.1.mlp.experts.8.up_proj.weight":
                                                           w["model.layers.1.mlp.experts.7.up_proj.weight"]})
check_error("extra tensor", ["ckpt", "import", "--input", bad, "--format", "hf-deepseek-v3", "--save",
                             os.path.join(WORK, "bad")], ["model.layers.1.mlp.experts.8.up_proj.weight"])

# 3. the recipe through HF and back into `mcpp train`
data = record_corpus()
DS3 = ["--config", os.path.join(ROOT, "configs", "deepseek-v3-tiny.toml"), "--data-path", data, "--log-interval", "1",
       "--eval-iters", "0", "--split", "90,10,0", "--seed", "5", "--micro-batch-size", "2", "--global-batch-size", "2",
       "--seq-length", "16", "--max-position-embeddings", "16", "--make-vocab-size-divisible-by", "128",
       "--lr-warmup-iters", "1", "--train-iters", "2", "--save-interval", "2"]
HF_GROUPS = ["--moe-router-group-topk", "1"]  # top-2 of the best group: DeepSeek-V3's top-2 group ranking
first = os.path.join(WORK, "recipe")
run([MCPP, "train", *DS3, *HF_GROUPS, "--save", first])
hf_recipe = os.path.join(WORK, "hf-recipe")
run([MCPP, "ckpt", "export", "--load", first, "--format", "hf-deepseek-v3", "--output", hf_recipe])
imported = os.path.join(WORK, "recipe-imported")
run([MCPP, "ckpt", "import", "--input", hf_recipe, "--format", "hf-deepseek-v3", "--save", imported])
tuned = os.path.join(WORK, "recipe-tuned")
run([MCPP, "train", *DS3, *HF_GROUPS, "--finetune", "--load", imported, "--save", tuned])
if sorted(losses(tuned)) != [1, 2]:
    failures.append(f"the recipe did not fine-tune from its HF import: {losses(tuned)}")
committed = os.path.join(WORK, "recipe-committed")
run([MCPP, "train", *DS3, "--save", committed])
check_error("recipe as committed", ["ckpt", "export", "--load", committed, "--format", "hf-deepseek-v3", "--output",
                                    os.path.join(WORK, "hf-committed")], ["model.moe_router_group_topk"])

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
