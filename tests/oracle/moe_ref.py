#!/usr/bin/python3
"""PyTorch oracle for mcpp's MoE layer (src/mcpp/transformer/moe/moe_layer.h: TopKRouter + dropless token dispatch +
SequentialMLP experts), written from Megatron-Core's router.py / moe_utils.py semantics.

Usage: moe_ref.py DIR
DIR holds meta.txt ("n h E k F swiglu bias pre_softmax aux_coeff z_coeff loss_grad_scale S capacity_factor
drop_policy scaling_factor score_function num_groups group_topk expert_bias balancing B [shared_gate jitter
random_logits]") and raw little-endian
float32 files written by tests/transformer/moe/moe_layer_test.cpp: inputs x.bin [n,h], dy.bin [n,h], router.bin [E,h] and per
expert e: fc1_w<e>.bin [F or 2F, h], fc2_w<e>.bin [h, F] (+ fc1_b<e>.bin, fc2_b<e>.bin with bias; expert_bias.bin [E]
when expert_bias is 1); mcpp's outputs
y.bin, dx.bin, d_router.bin, d_fc1_w<e>.bin, d_fc2_w<e>.bin (+ bias grads), losses.bin [2] = (aux, z). With a
shared expert (S > 0, Megatron-Core's SharedExpertMLP, no gate): sh_fc1_w.bin [S or 2S, h], sh_fc2_w.bin [h, S]
(+ sh_fc1_b.bin, sh_fc2_b.bin; with shared_gate sh_gate.bin [1, h]) and their grads d_sh_*.bin; its MLP output
(times sigmoid(x . gate) with the gate) is added to every token's. Training noise (Megatron's router.py): jitter 1
reads jitter.bin [n, h], the factors the router's input is multiplied by (apply_input_jitter; the experts and the
shared gate see x itself); random_logits 1 reads random_logits.bin [n, E], the logits used instead of the router's,
their gradient passed straight to the router's (RandomSTE, --moe-router-force-load-balancing). With a
capacity factor c > 0 (Megatron's topk_softmax_with_capacity): capacity = ceil(n * k / E * c); per expert the
routes of the `capacity` largest probabilities ("probs") or its first `capacity` tokens ("position") are kept,
the others' probabilities masked to 0 (the load-balancing loss still counts every route, as Megatron's).

The reference in float64: logits = x W_r^T; scores = softmax(logits); top-k of the logits with softmax over the k
(or, pre_softmax, top-k of scores; or sigmoid scores normalized over the k, the aux loss on the sigmoid normalized over
all E; with groups, Megatron's group_limited_topk); y[t] = sum_i probs[t,i] * MLP_{e_i}(x[t]) (+ MLP_shared(x[t]));
aux = coeff * E / (n*n*k) * sum_e sum_t scores[t,e] * tokens_e (balancing "aux_loss"; "seq_aux_loss": Megatron's
sequence_load_balancing_loss_func over the B sequences, tokens in [s, b] order, with the routes each expert kept as
its routing map); z = zcoeff * mean(logsumexp(logits)^2); grads by autograd of sum(dy * y) + loss_grad_scale * (aux +
z); "sinkhorn" balancing: the experts by Megatron's sinkhorn(logits), probs = sigmoid (k = 1) / softmax of the logits at
them, no aux loss. Prints the max relative errors; exit status 1 when any exceeds 2e-5.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from raw_f32 import load  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: moe_ref.py DIR")
    d = sys.argv[1]
    with open(os.path.join(d, "meta.txt")) as f:
        fields = f.read().split()
    n, h, E, k, Fw = (int(v) for v in fields[:5])
    swiglu, bias, pre_softmax = (v == "1" for v in fields[5:8])
    aux_coeff, z_coeff, scale = (float(v) for v in fields[8:11])
    S = int(fields[11])
    capacity_factor, policy = float(fields[12]), fields[13]
    scaling = float(fields[14])  # Megatron's moe_router_topk_scaling_factor (0: none)
    sigmoid = fields[15] == "sigmoid"  # moe_router_score_function
    groups, group_topk = int(fields[16]), int(fields[17])  # group-limited routing (0: off)
    expert_bias = load(d, "expert_bias", (E,)) if fields[18] == "1" else None  # sigmoid's routing bias
    balancing, B = fields[19], int(fields[20])  # moe_router_load_balancing_type; the sequences of the n tokens
    shared_gate = len(fields) > 21 and fields[21] == "1"  # moe_shared_expert_gate: sh_gate.bin [1, h]
    jitter = len(fields) > 22 and fields[22] == "1"  # moe_input_jitter_eps: jitter.bin [n, h]
    random_logits = len(fields) > 23 and fields[23] == "1"  # moe_router_force_load_balancing

    x = load(d, "x", (n, h)).requires_grad_()
    dy = load(d, "dy", (n, h))
    wr = load(d, "router", (E, h)).requires_grad_()
    f1 = 2 * Fw if swiglu else Fw
    w1 = [load(d, f"fc1_w{e}", (f1, h)).requires_grad_() for e in range(E)]
    w2 = [load(d, f"fc2_w{e}", (h, Fw)).requires_grad_() for e in range(E)]
    b1 = [load(d, f"fc1_b{e}", (f1,)).requires_grad_() for e in range(E)] if bias else None
    b2 = [load(d, f"fc2_b{e}", (h,)).requires_grad_() for e in range(E)] if bias else None

    def mlp(xs, w1_, b1_, w2_, b2_, width):
        a = xs @ w1_.T + (b1_ if bias else 0)
        if swiglu:
            act = F.silu(a[:, :width]) * a[:, width:]
        else:
            act = F.gelu(a, approximate="tanh")
        return act @ w2_.T + (b2_ if bias else 0)

    def expert(e, xs):
        return mlp(xs, w1[e], b1[e] if bias else None, w2[e], b2[e] if bias else None, Fw)

    shared = {}
    if S > 0:
        s1 = 2 * S if swiglu else S
        shapes = {"sh_fc1_w": (s1, h), "sh_fc2_w": (h, S)}
        if bias:
            shapes.update({"sh_fc1_b": (s1,), "sh_fc2_b": (h,)})
        if shared_gate:
            shapes["sh_gate"] = (1, h)
        shared = {name: load(d, name, shape).requires_grad_() for name, shape in shapes.items()}

    logits = (x * load(d, "jitter", (n, h)) if jitter else x) @ wr.T
    if random_logits:  # RandomSTE: the random values forward, the gradient straight through to the router's logits
        logits = logits + (load(d, "random_logits", (n, E)) - logits).detach()
    scores = torch.softmax(logits, dim=-1)
    # Megatron's topk_routing_with_score_function / group_limited_topk (router.py, moe_utils.py)
    sel = torch.sigmoid(logits) if sigmoid else scores if pre_softmax else logits

    def compute_topk(v):
        if not groups:
            return torch.topk(v, k, dim=-1)[1]
        group_scores = v.view(n, groups, -1).topk(k // group_topk, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(n, groups, E // groups).reshape(n, -1)
        return torch.topk(v.masked_fill(~score_mask.bool(), float("-inf")), k, dim=-1)[1]

    # Megatron: with an expert bias the experts (and groups) are chosen by scores + bias, probs from the scores
    top = compute_topk(sel.detach() + expert_bias if expert_bias is not None else sel.detach())
    if balancing == "sinkhorn":  # Megatron's sinkhorn_load_balancing in training: moe_utils.sinkhorn's top-k
        cost = torch.exp(logits.detach())
        d0, d1 = torch.ones(n, dtype=torch.float64), torch.ones(E, dtype=torch.float64)
        error, d1_old = 1e9, d1
        while error > 1e-4:
            d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + 1e-8)
            d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + 1e-8)
            error = torch.mean(torch.abs(d1_old - d1))
            d1_old = d1
        top = torch.topk(d1 * cost * d0.unsqueeze(1), k, dim=1)[1]
        act = torch.sigmoid(logits) if k == 1 else torch.softmax(logits, dim=-1)  # _sinkhorn_activation
        probs = act.gather(1, top)
    elif sigmoid:
        s_top = torch.sigmoid(logits).gather(1, top)
        probs = s_top / (s_top.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else s_top
        s_all = torch.sigmoid(logits)  # compute_routing_scores_for_aux_loss
        scores = s_all / (s_all.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else s_all
    elif pre_softmax:
        probs = scores.gather(1, top)
    else:
        probs = torch.softmax(logits.gather(1, top), dim=-1)
    tokens = torch.zeros(E, dtype=torch.float64)
    for e in range(E):
        tokens[e] = float((top == e).sum())
    z = torch.logsumexp(logits, dim=-1).square().mean() * z_coeff
    if scaling > 0:
        probs = probs * scaling
    gates = torch.zeros(n, E, dtype=torch.float64).scatter(1, top, probs)  # Megatron's topk_masked_gates
    routed = torch.zeros(n, E, dtype=torch.bool).scatter(1, top, True)
    keep = routed
    if capacity_factor > 0:
        capacity = math.ceil((n * k / E) * capacity_factor)
        if policy == "probs":  # each expert's `capacity` largest gates (torch.topk over the tokens)
            _, chosen = torch.topk(gates.detach(), k=min(capacity, n), dim=0)
            mask = torch.zeros(n, E, dtype=torch.bool).scatter(0, chosen, True)
        else:  # "position": each expert's first `capacity` tokens
            mask = torch.cumsum(routed.int(), dim=0) <= capacity
        keep = routed & mask
    gates = gates * keep
    if balancing == "aux_loss":  # switch_load_balancing_loss_func: every route counted (before any drop)
        aux = (scores.sum(0) * tokens).sum() * (E * aux_coeff / (n * n * k))
    elif balancing == "seq_aux_loss":  # sequence_load_balancing_loss_func: [s, b, E] views, the kept routes
        s_len = n // B
        cost = keep.view(s_len, B, E).sum(dim=0, dtype=torch.float64) / (s_len * k / E)
        aux = (cost * scores.view(s_len, B, E).mean(dim=0)).sum(dim=1).mean() * aux_coeff
    else:
        aux = torch.zeros((), dtype=torch.float64)
    y = torch.zeros(n, h, dtype=torch.float64)
    for e in range(E):
        rows = keep[:, e].nonzero(as_tuple=True)[0]
        if rows.numel() == 0:
            continue
        y = y.index_add(0, rows, gates[rows, e].unsqueeze(1) * expert(e, x[rows]))
    if S > 0:
        out = mlp(x, shared["sh_fc1_w"], shared.get("sh_fc1_b"), shared["sh_fc2_w"], shared.get("sh_fc2_b"), S)
        if shared_gate:  # Megatron's SharedExpertMLP gate: sigmoid(x . gate_weight) per token
            out = out * torch.sigmoid(x @ shared["sh_gate"].T)
        y = y + out
    ((y * dy).sum() + scale * (aux + z)).backward()

    def rel(got, want):  # normwise: max abs error over max |want|; an expert no token chose has no grad: zeros
        want = torch.zeros_like(got) if want is None else want
        m = float(want.abs().max())
        return float((got - want).abs().max()) / (m if m > 0 else 1.0)

    checks = [("y", rel(load(d, "y", (n, h)), y.detach())), ("dx", rel(load(d, "dx", (n, h)), x.grad)),
              ("d_router", rel(load(d, "d_router", (E, h)), wr.grad))]
    for e in range(E):
        checks.append((f"d_fc1_w{e}", rel(load(d, f"d_fc1_w{e}", (f1, h)), w1[e].grad)))
        checks.append((f"d_fc2_w{e}", rel(load(d, f"d_fc2_w{e}", (h, Fw)), w2[e].grad)))
        if bias:
            checks.append((f"d_fc1_b{e}", rel(load(d, f"d_fc1_b{e}", (f1,)), b1[e].grad)))
            checks.append((f"d_fc2_b{e}", rel(load(d, f"d_fc2_b{e}", (h,)), b2[e].grad)))
    for name, t in shared.items():
        checks.append((f"d_{name}", rel(load(d, f"d_{name}", tuple(t.shape)), t.grad)))
    losses = load(d, "losses", (2,))
    checks.append(("aux_loss", abs(float(losses[0]) - float(aux)) / max(abs(float(aux)), 1e-30)))
    checks.append(("z_loss", abs(float(losses[1]) - float(z)) / max(abs(float(z)), 1e-30)))
    ok = True
    for name, err in checks:
        # fp32 rounding of mcpp's GEMMs and sums: ~1e-6 of the largest term; the losses are float64 on the host.
        tol = 2e-5
        print(f"{name}: max rel err {err:.3e} (tol {tol:g})")
        ok = ok and err <= tol
    print("tokens per expert:", [int(t) for t in tokens], "kept:", [int(v) for v in keep.sum(0)])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
