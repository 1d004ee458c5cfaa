#!/usr/bin/env python3
"""`mcpp train` refuses the FP8 combinations it cannot run with ONE `error:` line naming the problem and exit code 2,
before any training (each case takes well under a second).

usage: fp8_errors_check.py MCPP WORKDIR
Cases: --fp8-recipe blockwise with a hidden size, a token count (seq_length * micro_batch_size) or an FFN size not a
multiple of 128 (its 1x128 tiles / 128x128 blocks); --fp8-recipe mxfp8 (Blackwell's) and an unknown format;
--fp8-param-gather without FP8, without the distributed optimizer, and with it (not implemented); FP8 on the GPU
without --bf16; --first-last-layers-bf16 with more bf16 layers than layers, or a negative count. The valid blockwise
command line the cases start from trains (2 iterations).
"""
import subprocess

from cli_harness import ENV, MCPP, failures, random_tokens

data = random_tokens()
# A blockwise-valid model: h 128, 4 heads of 32, FFN 512, 64 tokens x micro-batch 2 = 128 tokens per GEMM.
BASE = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--ffn-hidden-size", "512",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-iters", "2", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512", "--data-path", data,
        "--split", "100,0,0", "--eval-iters", "0", "--device", "cpu"]
BLOCKWISE = ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"]


def check(what, flags, needles):
    p = subprocess.run([MCPP, "train", *flags], capture_output=True, text=True, env=ENV, timeout=60)
    lines = [l for l in p.stderr.splitlines() + p.stdout.splitlines() if l.startswith("error:")]
    if p.returncode != 2 or len(lines) != 1 or any(n not in lines[0] for n in needles):
        failures.append(f"{what}: exit {p.returncode}, error lines {lines}, want one naming {needles}; "
                        f"stderr {p.stderr[-600:]!r}")


def with_flag(flags, name, value):
    out = list(flags)
    out[out.index(name) + 1] = value
    return out


check("blockwise, hidden 96", with_flag(with_flag(BASE, "--hidden-size", "96"), "--num-attention-heads", "3")
      + BLOCKWISE, ["fp8_recipe", "hidden_size must be a multiple of 128", "got 96"])
check("blockwise, 32 tokens per GEMM", with_flag(BASE, "--seq-length", "16") + BLOCKWISE,
      ["fp8_recipe", "seq_length * micro_batch_size", "multiple of 128", "got 32"])
check("blockwise, FFN 320", with_flag(BASE, "--ffn-hidden-size", "320") + BLOCKWISE,
      ["fp8_recipe", "ffn_hidden_size", "multiple of 128", "got 320"])
check("mxfp8", BASE + ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"], ["fp8_recipe", "mxfp8", "not implemented"])
check("format e5m2", BASE + ["--fp8-format", "e5m2"], ["fp8_format", "unknown value 'e5m2'"])
check("fp8-param-gather without FP8", BASE + ["--fp8-param-gather", "--use-distributed-optimizer"],
      ["fp8_param_gather", "needs FP8"])
check("fp8-param-gather without the distributed optimizer", BASE + BLOCKWISE + ["--fp8-param-gather"],
      ["fp8_param_gather", "use_distributed_optimizer"])
check("fp8-param-gather", BASE + BLOCKWISE + ["--fp8-param-gather", "--use-distributed-optimizer"],
      ["fp8_param_gather", "not implemented"])
check("FP8 on the GPU without --bf16", with_flag(BASE, "--device", "cuda") + ["--fp8-format", "hybrid"],
      ["fp8_format", "needs --bf16"])
check("first/last bf16 layers 2 + 1 of 2", BASE + BLOCKWISE + ["--first-last-layers-bf16",
      "--num-layers-at-start-in-bf16", "2"], ["num_layers_at_start_in_bf16 (2)", "num_layers_at_end_in_bf16 (1)",
                                             "exceeds num_layers (2)"])
check("negative bf16 layers at the end", BASE + ["--num-layers-at-end-in-bf16", "-1"],
      ["num_layers_at_end_in_bf16", ">= 0", "-1"])
# The valid blockwise model trains (two iterations): the refusals above are about the named dims only.
p = subprocess.run([MCPP, "train", *BASE, *BLOCKWISE], capture_output=True, text=True, env=ENV, timeout=120)
if p.returncode != 0:
    failures.append(f"valid blockwise run: exit {p.returncode}: {p.stderr[-800:]!r}")

if failures:
    print("\n".join(failures))
    raise SystemExit(1)
print("fp8 errors check: ok")
