#!/usr/bin/env python3
"""The demo GPT (configs/demo.toml) in PyTorch on CPU: the peer for our end-to-end tokens/s.

Same model and step as `mcpp train --config configs/demo.toml`: GPT-2 style pre-LN decoder (LayerNorm eps 1e-5,
learned absolute positions, fused QKV with bias, causal softmax attention, 4h MLP with tanh GELU, biases on every
linear, final LayerNorm, output layer tied to the word embedding), fp32, micro batch = global batch (no
accumulation), cross entropy averaged over all s*b tokens, global grad-norm clipping at 1.0, AdamW
(beta 0.9/0.95, eps 1e-8, weight decay 0.01). One timed step = zero_grad + forward + backward + clip + optimizer
step, exactly what one `mcpp train` iteration does (minus data loading, which is negligible).

Data: random token ids (the step cost does not depend on the values). Prints one JSON line:
  {"impl": "torch", "threads": T, "step_ms_min": .., "step_ms_median": .., "tokens_per_s": .. (from the min), ...}
Usage: /usr/bin/python3 bench/torch_cpu_gpt.py [--steps 10 --warmup 2 --threads 2 --layers 4 --hidden 128 ...]
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h, eps=1e-5)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x, mask):  # x [b, s, h]
        b, s, h = x.shape
        hn = h // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)  # [b, s, h] each
        q, k, v = (t.view(b, s, self.heads, hn).transpose(1, 2) for t in (q, k, v))  # [b, np, s, hn]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hn))  # [b, np, s, s]
        probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)  # [b, s, h]
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, heads, seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h, eps=1e-5)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1))

    def forward(self, tokens, labels):  # [b, s] -> mean loss
        b, s = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(s))[None]
        for blk in self.blocks:
            x = blk(x, self.mask[:s, :s])
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output layer, [b, s, V]
        return F.cross_entropy(logits.view(b * s, -1), labels.reshape(b * s))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if min(a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab, a.steps, a.threads) <= 0 or a.hidden % a.heads:
        sys.exit("error: sizes, --steps and --threads must be positive and --hidden a multiple of --heads")
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    model = GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # [b, s] each
    times, losses = [], []
    for it in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = model(inputs, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if it >= a.warmup:
            times.append(dt)
    tmin = min(times)
    print(json.dumps({"impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "layers": a.layers, "hidden": a.hidden, "seq": a.seq, "batch": a.batch, "vocab": a.vocab,
                      "steps": a.steps, "step_ms_min": 1e3 * tmin, "step_ms_median": 1e3 * statistics.median(times),
                      "tokens_per_s": a.batch * a.seq / tmin, "first_loss": losses[0], "last_loss": losses[-1]}))


if __name__ == "__main__":
    main()
