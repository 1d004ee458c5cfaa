#!/usr/bin/env python3
"""`mcpp train --finetune --load <imported HF Llama> --sft --data-path sft.jsonl` end to end on the CPU.

1. A tiny Llama-style model (RMSNorm, RoPE, SwiGLU, GQA, untied) with the Qwen3-style tokenizer fixture
   (chatml's <|im_start|> / <|im_end|>) is trained one step, exported to Hugging Face (hf-llama, the tokenizer
   files beside it) and imported back: the model a user fine-tunes.
2. Oracle: the fine-tune's first logged loss (lr 0, one global batch holding every packed sequence, per-token loss)
   equals the loss of each conversation run ALONE through `mcpp forward` (no packing, positions from 0), counted
   over the assistant's tokens and the EOD after them only — built here from the documented chatml rendering and
   next-fit packing (docs/SFT.md), tokenized piece by piece with `mcpp tokenize` (the softmax over the padded
   vocabulary, as Megatron's cross entropy). So the prompt masking, the
   packing, the document mask and the position reset are checked against runs that have none of them.
3. Fine-tuning for 30 steps lowers the loss; the checkpoint saves.
4. Bad JSONL lines / a bad prompt format: one `error:` line naming file:line, exit 2.
usage: sft_check.py MCPP_BIN WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

mcpp, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
here = os.path.dirname(os.path.abspath(__file__))
tok_dir = os.path.join(here, "..", "tokenizer", "hf", "qwen3")
env = dict(os.environ, OMP_NUM_THREADS="1")


def run(*args, check=True, stdin=None):
    p = subprocess.run([mcpp, *args], env=env, capture_output=True, text=True, timeout=300, input=stdin)
    if check:
        assert p.returncode == 0, f"{args[:3]}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p


# The conversations: prompt / response lines and chat turns (one with a system turn and two exchanges).
convs = []
for i in range(14):
    a, b = 3 + i, 11 + 2 * i
    convs.append([("user", f"What is {a} plus {b}?"), ("assistant", f"{a} plus {b} is {a + b}.")])
convs.append([("system", "You answer briefly."), ("user", "Hello!"), ("assistant", "Hi. How can I help?"),
              ("user", "Name a fruit."), ("assistant", "An apple.")])
convs.append([("user", "Say something long."),
              ("assistant", "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.")])
data = os.path.join(work, "sft.jsonl")
with open(data, "w") as f:
    for c in convs:
        if len(c) == 2:
            f.write(json.dumps({"prompt": c[0][1], "response": c[1][1]}) + "\n")
        else:
            f.write(json.dumps({"messages": [{"role": r, "content": t} for r, t in c]}) + "\n")

cache = {}


def tokenize(text):  # ids without special tokens added (the Qwen3 fixture adds none)
    if text not in cache:
        cache[text] = [int(t) for t in run("tokenize", "--tokenizer-type", "HuggingFaceTokenizer",
                                           "--tokenizer-model", tok_dir, stdin=text).stdout.split()]
    return cache[text]


eod = tokenize("<|endoftext|>")[0]


def render(conv):  # chatml: the assistant header and every non-assistant turn untrained; EOD after, trained
    toks, trained = [], []
    for role, content in conv:
        pieces = ([("<|im_start|>assistant\n", 0), (content + "<|im_end|>\n", 1)] if role == "assistant" else
                  [(f"<|im_start|>{role}\n{content}<|im_end|>\n", 0)])
        for text, t in pieces:
            ids = tokenize(text)
            toks += ids
            trained += [t] * len(ids)
    return toks + [eod], trained + [1]


rendered = [render(c) for c in convs]
seq = 128
cap = seq + 1
bins, used = [], cap + 1  # next-fit into bins of seq + 1 tokens (none here is longer than a bin)
for toks, _ in rendered:
    assert len(toks) <= cap
    if used + len(toks) > cap:
        bins.append(0)
        used = 0
    used += len(toks)
    bins[-1] += 1
n_bins = len(bins)
print(f"{len(convs)} conversations -> {n_bins} packed sequences of {seq}")

common = ["--sft", "--split", "100,0,0", "--sft-tokenizer-prompt-format", "chatml",
          "--tokenizer-type", "HuggingFaceTokenizer", "--eval-iters", "0",
          "--log-interval", "1", "--calculate-per-token-loss", "--micro-batch-size", "1",
          "--global-batch-size", str(n_bins), "--device", "cpu", "--seq-length", str(seq)]
# the fine-tunes: no dropout (the import carries Megatron's default 0.1), so the first loss is deterministic
ft_args = ["--load", None, "--finetune", "--use-checkpoint-args", *common, "--attention-dropout", "0",
           "--hidden-dropout", "0", "--data-path", data]
base = os.path.join(work, "base")
run("train", "--config", os.path.join(here, "..", "..", "..", "configs", "llama-tiny.toml"), *common, "--data-path", data, "--tokenizer-model", tok_dir,
    "--max-position-embeddings", str(seq), "--train-iters", "1", "--lr", "1e-3",
    "--lr-warmup-iters", "0", "--save", base)
hf = os.path.join(work, "hf")
run("ckpt", "export", "--load", base, "--format", "hf-llama", "--output", hf)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok_dir, f), hf)
imported = os.path.join(work, "imported")
run("ckpt", "import", "--input", hf, "--format", "hf-llama", "--save", imported)
ft_args[1] = imported

# 2. The first step's loss at lr 0 vs each conversation alone.
metrics = os.path.join(work, "lr0.jsonl")
p = run("train", *ft_args, "--tokenizer-model", hf, "--train-iters", "1", "--lr", "0", "--min-lr", "0", "--lr-warmup-iters", "0", "--metrics-path", metrics)
assert "loaded checkpoint" in p.stdout + p.stderr, (p.stdout[-1000:], p.stderr[-1000:])
packed_loss = [json.loads(l)["lm_loss"] for l in open(metrics) if '"event":"train"' in l][0]
loss_sum, count = 0.0, 0
for k, (toks, trained) in enumerate(rendered):
    ids = os.path.join(work, f"conv{k}.txt")
    with open(ids, "w") as f:
        f.write(" ".join(map(str, toks)) + "\n")
    out = os.path.join(work, f"conv{k}.npy")
    run("forward", "--load", imported, "--tokens", ids, "--output", out)
    logits = np.load(out)[0].astype(np.float64)  # [n, V]
    # The trainer's cross entropy runs over the padded vocabulary (Megatron's: V rounded up to a multiple of
    # --make-vocab-size-divisible-by 128); the import pads the output layer with zero rows, so each padded entry is
    # a logit of 0 in the softmax's sum (mcpp forward writes the V real ones).
    pad = -(-logits.shape[1] // 128) * 128 - logits.shape[1]
    mx = logits.max(1)
    lse = np.log(np.exp(logits - mx[:, None]).sum(1) + pad * np.exp(-mx)) + mx
    for pos in range(len(toks) - 1):  # input pos predicts toks[pos + 1]: counted where that label is trained
        if trained[pos + 1]:
            loss_sum += lse[pos] - logits[pos, toks[pos + 1]]
            count += 1
alone = loss_sum / count
rel = abs(packed_loss - alone) / alone
print(f"first-step loss packed {packed_loss:.6f} vs conversations alone {alone:.6f} ({count} tokens), rel {rel:.2e}")
assert rel < 1e-5, "fp32: the same tokens' losses summed in another order"

# 2b. A Hugging Face model with more vocabulary rows than its tokenizer has ids (Qwen3 ships 151,936 rows for
# 151,669): the export's embedding (and output layer) padded with zero rows to the multiple of 128 the trainer pads
# the tokenizer to, config.json's vocab_size set to the rows, then imported: --use-checkpoint-args adopts its
# vocabulary (logged) instead of refusing the vocab_size, and the lr-0 loss equals the one above (the same zero rows).
def pad_vocab_rows(src, dst, rows):
    shutil.copytree(src, dst)
    raw = open(os.path.join(src, "model.safetensors"), "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    width = {"F32": 4, "BF16": 2, "F16": 2}
    out_header, chunks, off = {}, [], 0
    for name, t in sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        blob, shape = data[b:e], list(t["shape"])
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            blob += bytes((rows - shape[0]) * shape[1] * width[t["dtype"]])
            shape[0] = rows
        out_header[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + len(blob)]}
        chunks.append(blob)
        off += len(blob)
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    hb = json.dumps(out_header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(len(hb).to_bytes(8, "little") + hb + b"".join(chunks))
    cfg = json.load(open(os.path.join(dst, "config.json")))
    cfg["vocab_size"] = rows
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))


tok_ids = json.load(open(os.path.join(hf, "config.json")))["vocab_size"]
rows = -(-tok_ids // 128) * 128
assert rows > tok_ids, "the fixture's tokenizer must not be a multiple of 128 already"
hf_rows, imported_rows = os.path.join(work, "hf_rows"), os.path.join(work, "imported_rows")
pad_vocab_rows(hf, hf_rows, rows)
run("ckpt", "import", "--input", hf_rows, "--format", "hf-llama", "--save", imported_rows)
metrics = os.path.join(work, "lr0_rows.jsonl")
p = run("train", *(a if a != imported else imported_rows for a in ft_args), "--tokenizer-model", hf, "--train-iters",
        "1", "--lr", "0", "--min-lr", "0", "--lr-warmup-iters", "0", "--metrics-path", metrics)
assert f"has {rows} vocabulary rows" in p.stdout + p.stderr, (p.stdout[-1500:], p.stderr[-1500:])
rows_loss = [json.loads(l)["lm_loss"] for l in open(metrics) if '"event":"train"' in l][0]
print(f"{rows}-row import of a {tok_ids}-id tokenizer: first-step loss {rows_loss:.6f} (vs {packed_loss:.6f})")
assert abs(rows_loss - packed_loss) <= 1e-6 * abs(packed_loss), (rows_loss, packed_loss)

# 3. Fine-tuning lowers the loss.
metrics = os.path.join(work, "ft.jsonl")
ft = os.path.join(work, "ft")
run("train", *ft_args, "--tokenizer-model", hf, "--train-iters", "30", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "0", "--metrics-path", metrics,
    "--save", ft)
losses = [json.loads(l)["lm_loss"] for l in open(metrics) if '"event":"train"' in l]
print(f"fine-tune: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
assert len(losses) == 30 and losses[-1] < 0.5 * losses[0], losses
assert os.path.isdir(ft)

# 4. Bad input: one error line naming file:line, exit 2.
bad = os.path.join(work, "bad.jsonl")
with open(bad, "w") as f:
    f.write(json.dumps({"prompt": "a", "response": "b"}) + "\n")
    f.write(json.dumps({"prompt": "only a prompt"}) + "\n")
for args, needle in [(["--data-path", bad], f"{bad}:2"),
                     (["--data-path", data, "--sft-tokenizer-prompt-format", "default"], "sft_tokenizer_prompt_format")]:
    q = run("train", *ft_args[:-2], "--tokenizer-model", hf, "--train-iters", "1", *args, check=False)
    assert q.returncode == 2 and needle in q.stderr and q.stderr.count("\n") == 1, (args, q.returncode, q.stderr)
print("sft OK")
