#!/usr/bin/env python3
"""Float64 PyTorch reference for the whole GPT (both styles), written from the Megatron-Core / HF
definitions with torch autograd — the oracle for tests/models/gpt_model_test.cpp.

usage: gpt_ref.py DIR
DIR holds config.json (model fields), tokens.npy / labels.npy [s, b] int32, loss_mask.npy [s, b] f32,
<key>.npy for every parameter, and our outputs: logits.npy [s*b, Vp], loss.txt, grad.<key>.npy.
Exit 0 when logits (rel 1e-5), loss and every gradient (rel 1e-4) agree; prints the worst errors.

Dropout (training mode, as Megatron-Core: embedding and hidden dropout at hidden_dropout, attention dropout
on the softmax probabilities): config.json's "dropout" names the rates and each draw's Philox key — the
embedding output's, per layer the attention probabilities' ([b, nq, s, s]), the attention and mlp branches'
([s, b, h]) — and the masks are computed here from the keys with Philox-4x32-10 as the Random123 paper
defines it (element i: counter key.offset + i // 4, word i % 4, uniform (word >> 8) 2^-24, kept iff >= p,
kept values / (1 - p)); checked against Random123's known-answer vector first.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

M32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(seed, counters):
    """Philox-4x32-10 (Salmon et al., SC'11) of 64-bit counters (the high 64 counter bits 0): [n, 4] words."""
    ctr = np.asarray(counters, dtype=np.uint64)
    c = [ctr & M32, ctr >> np.uint64(32), np.zeros_like(ctr), np.zeros_like(ctr)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]  # < 2^64: no overflow
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & M32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
    return np.stack(c, -1)


def dropout_scale(key, shape, p):
    """The kept mask of a dropout draw times 1 / (1 - p), as a float64 tensor of `shape`."""
    n = int(np.prod(shape))
    words = philox4x32_10(key[0], key[1] + np.arange((n + 3) // 4, dtype=np.uint64)).reshape(-1)[:n]
    u = (words >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
    keep = u >= float(np.float32(p))  # p as the fp32 the run compares with
    return torch.tensor(keep.astype(np.float64) / (1.0 - p)).reshape(shape)


# Random123 kat_vectors: philox4x32_10, counter 0, key 0.
assert [int(w) for w in philox4x32_10(0, [0])[0]] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def main(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    keys = cfg["param_keys"]
    P = {k: torch.tensor(np.load(os.path.join(d, k + ".npy")).astype(np.float64), requires_grad=True) for k in keys}
    tokens = torch.tensor(np.load(os.path.join(d, "tokens.npy")).astype(np.int64))  # [s, b]
    labels = torch.tensor(np.load(os.path.join(d, "labels.npy")).astype(np.int64))
    mask = torch.tensor(np.load(os.path.join(d, "loss_mask.npy")).astype(np.float64))
    s, b = tokens.shape
    h, L = cfg["hidden_size"], cfg["num_layers"]
    nq, ng, hd = cfg["num_attention_heads"], cfg["num_query_groups"], cfg["kv_channels"]
    r = nq // ng
    eps = cfg["norm_epsilon"]
    drop = cfg.get("dropout")

    def dropped(t, key, p):
        return t if drop is None or p == 0 else t * dropout_scale(key, tuple(t.shape), p)

    def norm(x, prefix):
        w = P[prefix + ".weight"]
        if cfg["normalization"] == "LayerNorm":
            return F.layer_norm(x, (x.shape[-1],), w, P[prefix + ".bias"], eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def linear(x, prefix):
        y = x @ P[prefix + ".weight"].T
        if prefix + ".bias" in P:
            y = y + P[prefix + ".bias"]
        return y

    # Rotary tables (Megatron RotaryEmbedding; rotate_half form, as HF Llama).
    rot = int(round(hd * cfg["rotary_percent"]))
    # inv_freq and the angles in float32, as Megatron's RotaryEmbedding (and HF) compute them
    inv_freq = 1.0 / (cfg["rotary_base"] ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    if cfg.get("rope_scaling_factor"):  # Llama 3.1's (HF rope_type "llama3", Megatron's _apply_scaling)
        factor, old_context, low, high = cfg["rope_scaling_factor"], 8192.0, 1.0, 4.0
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    # the angle as Megatron / HF compute it: position x inv_freq in float32 (then cos / sin in float64)
    positions = torch.arange(s, dtype=torch.float32)
    if cfg.get("rotary_seq_len_interpolation_factor"):  # Megatron's linear interpolation: seq *= 1 / factor
        positions = positions * (1.0 / cfg["rotary_seq_len_interpolation_factor"])
    ang = torch.outer(positions, inv_freq).double()  # [s, rot/2]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]  # [s, 1, 1, rot]

    def rope(x):  # [s, b, n, hd]
        xr, xp = x[..., :rot], x[..., rot:]
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
        rotated = torch.cat([-x2, x1], -1)
        return torch.cat([xr * cos + rotated * sin, xp], -1)

    # Multi-latent attention's RoPE (DeepSeek-V2/V3 as HF transformers defines it: the rotary channels of q and of the
    # shared k_pe de-interleaved — evens then odds — then rotate_half; YaRN frequencies and attention factor from
    # HF's _compute_yarn_parameters, written here from its definitions).
    mla = cfg.get("multi_latent_attention", False)
    if mla:
        dr = cfg["qk_pos_emb_head_dim"]
        base = cfg["rotary_base"]
        pos_freqs = base ** (torch.arange(0, dr, 2, dtype=torch.float32) / dr)
        attention_factor = 1.0

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if cfg["rope_type"] == "yarn":
            factor = cfg["rotary_scaling_factor"]

            def correction_dim(rot):
                return (dr * math.log(cfg["original_max_position_embeddings"] / (rot * 2 * math.pi))) / (
                    2 * math.log(base))

            low = max(math.floor(correction_dim(cfg["beta_fast"])), 0)
            high = min(math.ceil(correction_dim(cfg["beta_slow"])), dr - 1)
            if low == high:
                high += 0.001
            ramp = torch.clamp((torch.arange(dr // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
            extrapolation = 1 - ramp
            mla_inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
            attention_factor = get_mscale(factor, cfg["mscale"]) / get_mscale(factor, cfg["mscale_all_dim"])
        else:
            mla_inv_freq = 1.0 / pos_freqs
        m_ang = torch.outer(torch.arange(s, dtype=torch.float32), mla_inv_freq).double()
        m_emb = torch.cat([m_ang, m_ang], -1)
        # HF applies the attention factor to the float32 cos / sin
        m_cos = (m_emb.cos().float() * attention_factor).double()[:, None, None, :]
        m_sin = (m_emb.sin().float() * attention_factor).double()[:, None, None, :]
        sm = get_mscale(cfg["rotary_scaling_factor"], cfg["mscale_all_dim"])  # the softmax's mscale (HF: yarn's)
        mla_scale = sm * sm / math.sqrt(cfg["qk_head_dim"] + dr)

    def mla_rope(x):  # [s, b, n, dr]
        sh = x.shape
        x = x.reshape(*sh[:-1], sh[-1] // 2, 2).transpose(-1, -2).reshape(sh)  # evens, then odds
        x1, x2 = x[..., : sh[-1] // 2], x[..., sh[-1] // 2:]
        return x * m_cos + torch.cat([-x2, x1], -1) * m_sin

    def mla_qkv(a, pre):  # -> q, k [s, b, nq, dn + dr], v [s, b, nq, dv], the softmax scale
        dn, dv, kr = cfg["qk_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
        if cfg["q_lora_rank"]:
            qc = linear(a, pre + ".linear_q_down_proj")
            if cfg.get("qk_layernorm"):
                qc = norm(qc, pre + ".q_layernorm")
            q = linear(qc, pre + ".linear_q_up_proj")
        else:
            q = linear(a, pre + ".linear_q_proj")
        q = q.view(s, b, nq, dn + dr)
        latent = linear(a, pre + ".linear_kv_down_proj")
        kvc, k_pe = latent[..., :kr], latent[..., kr:]
        if cfg.get("qk_layernorm"):
            kvc = norm(kvc, pre + ".kv_layernorm")
        kv = linear(kvc, pre + ".linear_kv_up_proj").view(s, b, nq, dn + dv)
        k_pe = mla_rope(k_pe[:, :, None, :]).expand(s, b, nq, dr)
        q = torch.cat([q[..., :dn], mla_rope(q[..., dn:])], -1)
        k = torch.cat([kv[..., :dn], k_pe], -1)
        return q, k, kv[..., dn:], mla_scale

    x = P["embedding.word_embeddings.weight"][tokens]  # [s, b, h]
    if cfg["position_embedding_type"] == "learned_absolute":
        x = x + P["embedding.position_embeddings.weight"][torch.arange(s)][:, None, :]
    if drop:
        x = dropped(x, drop["embedding"], drop["hidden"])
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)

    def layer(x, pre, dl):  # one pre-norm transformer layer; dl: its dropout keys (or None)
        a = norm(x, pre + ".input_layernorm")
        if mla:
            q, k, v, scale = mla_qkv(a, pre + ".self_attention")
            rr = 1
        else:
            qkv = linear(a, pre + ".self_attention.linear_qkv").view(s, b, ng, r + 2, hd)
            q = qkv[:, :, :, :r, :].reshape(s, b, nq, hd)
            k = qkv[:, :, :, r, :]
            v = qkv[:, :, :, r + 1, :]
            if cfg.get("qk_layernorm"):  # Megatron's q_layernorm / k_layernorm: per head over hd, before RoPE
                q = norm(q, pre + ".self_attention.q_layernorm")
                k = norm(k, pre + ".self_attention.k_layernorm")
            if cfg["position_embedding_type"] == "rope":
                q, k = rope(q), rope(k)
            scale, rr = 1.0 / math.sqrt(hd), r
        qh = q.permute(1, 2, 0, 3)  # [b, nq, s, hd]
        kh = k.permute(1, 2, 0, 3).repeat_interleave(rr, dim=1)
        vh = v.permute(1, 2, 0, 3).repeat_interleave(rr, dim=1)
        scores = (qh @ kh.transpose(-1, -2)) * scale
        scores = scores.masked_fill(causal, float("-inf"))
        probs = torch.softmax(scores, -1)
        if dl:
            probs = dropped(probs, dl["probs"], drop["attention"])
        ctx = probs @ vh  # [b, nq, s, hd]
        ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, -1)
        attn = linear(ctx, pre + ".self_attention.linear_proj")
        x = x + (dropped(attn, dl["attn"], drop["hidden"]) if dl else attn)
        m = norm(x, pre + ".pre_mlp_layernorm")
        f1 = linear(m, pre + ".mlp.linear_fc1")
        if cfg["swiglu"]:
            gate, up = f1.chunk(2, -1)
            act = F.silu(gate) * up
        else:
            act = F.gelu(f1, approximate="tanh")
        mlp = linear(act, pre + ".mlp.linear_fc2")
        return x + (dropped(mlp, dl["mlp"], drop["hidden"]) if dl else mlp)

    for i in range(L):
        x = layer(x, f"decoder.layers.{i}", drop["layers"][i] if drop else None)
    x = norm(x, "decoder.final_layernorm")
    w_out = P["output_layer.weight"] if "output_layer.weight" in P else P["embedding.word_embeddings.weight"]
    logits = (x @ w_out.T).reshape(s * b, -1)
    losses = F.cross_entropy(logits, labels.reshape(-1), reduction="none")
    loss = (losses * mask.reshape(-1)).sum() / mask.sum()
    total = loss

    # Multi-token prediction (Megatron-Core multi_token_prediction.py, DeepSeek-V3): depth k on the tokens, labels
    # and mask rolled k positions left (zero filled), concat(enorm(embedding), hnorm(h_{k-1})) -> eh_proj -> one
    # transformer layer -> final norm -> the shared output layer; each depth's masked mean loss weighted
    # mtp_loss_scaling_factor / D (per token: its masked sum times main tokens / its tokens).
    D = cfg.get("mtp_num_layers", 0)
    per_token = cfg.get("calculate_per_token_loss", False)
    if per_token:
        total = (losses * mask.reshape(-1)).sum()
    mtp_losses = []

    def roll(t):
        out = torch.roll(t, -1, 0)
        out[-1] = 0
        return out

    h_prev, tok, lab, msk = x, tokens, labels, mask
    for k in range(D):
        pre = f"mtp.layers.{k}"
        tok, lab, msk = roll(tok), roll(lab), roll(msk)
        e = P["embedding.word_embeddings.weight"][tok]
        if drop:
            e = dropped(e, drop["mtp"][k]["embedding"], drop["hidden"])
        cat = torch.cat([norm(e, pre + ".enorm"), norm(h_prev, pre + ".hnorm")], -1)
        t = layer(cat @ P[pre + ".eh_proj.weight"].T, pre + ".transformer_layer", drop["mtp"][k] if drop else None)
        h_prev = norm(t, pre + ".final_layernorm")
        lk = F.cross_entropy((h_prev @ w_out.T).reshape(s * b, -1), lab.reshape(-1), reduction="none")
        msum = (lk * msk.reshape(-1)).sum()
        mtp_losses.append(msum.item() / max(msk.sum().item(), 1.0))
        w = cfg["mtp_loss_scaling_factor"] / D
        total = total + (w * msum * mask.sum() / msk.sum() if per_token else w * msum / msk.sum())
    total.backward()

    ok = True

    # A gradient that is zero in exact arithmetic (the k_layernorm bias: adding one vector to every key shifts
    # each score row by a constant, which softmax ignores) is float64 roundoff here (< 1e-12 of the model's largest
    # gradient): ours must then be fp32 roundoff, below 1e-6 of that largest gradient. Every other gradient is
    # compared relative to its own largest element.
    gscale = max(float(P[k].grad.abs().max()) for k in keys)

    def compare(name, ours, ref, tol):
        nonlocal ok
        ref = ref.detach().numpy()
        if name.startswith("grad ") and float(np.max(np.abs(ref))) < 1e-12 * gscale:
            err = float(np.max(np.abs(ours.astype(np.float64)))) / gscale
            tol = 1e-6
        else:
            err = float(np.max(np.abs(ours.astype(np.float64) - ref))) / max(float(np.max(np.abs(ref))), 1e-30)
        bad = not (err < tol)
        ok &= not bad
        if bad or "-v" in sys.argv:
            print(f"{'FAIL' if bad else 'ok  '} {name}: max rel err {err:.3e} (tol {tol:g})")
        return err

    # Tolerances: our run is fp32 against this float64 reference; 1e-5 for logits, 1e-4 for gradients.
    worst = compare("logits", np.load(os.path.join(d, "logits.npy")), logits, 1e-5)
    our_loss = float(open(os.path.join(d, "loss.txt")).read())
    if abs(our_loss - loss.item()) > 1e-5 * abs(loss.item()):
        print(f"FAIL loss: ours {our_loss} ref {loss.item()}")
        ok = False
    if D:
        ours = [float(v) for v in open(os.path.join(d, "mtp_losses.txt")).read().split()]
        for k, (o, ref) in enumerate(zip(ours, mtp_losses)):
            if not abs(o - ref) <= 1e-5 * abs(ref):
                print(f"FAIL mtp_{k + 1} loss: ours {o} ref {ref}")
                ok = False
        if len(ours) != D:
            print(f"FAIL mtp losses: {len(ours)} values for {D} depths")
            ok = False
        print(f"gpt_ref: mtp losses ours {ours} ref {mtp_losses}")
    gworst = 0.0
    for k in keys:
        gworst = max(gworst, compare("grad " + k, np.load(os.path.join(d, "grad." + k + ".npy")), P[k].grad, 1e-4))
    print(f"gpt_ref: logits rel err {worst:.2e}, loss ours {our_loss:.8f} ref {loss.item():.8f}, "
          f"worst grad rel err {gworst:.2e}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
