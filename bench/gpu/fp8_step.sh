#!/bin/bash
# FP8 vs bf16 training steps on one GPU, in ONE device call with the PyTorch FP8 anchor (the ratio measured on the
# same machine at the same time): GPT-2 124M (T 1024, B 32) and GPT 1.3B (T 2048, B 8) from bench/gpu/e2e_vs_torch.sh,
# each bf16, FP8 delayed scaling and FP8 tensorwise (--fp8-format hybrid: e4m3 forward, e5m2 gradients; the dense
# linears only — LM head, norms and attention stay bf16) and blockwise (e4m3), then ../shared/anchors/torch_gpt_fp8.py
# (its own bf16 and float8 runs); then the 8B-width Llama slice (bf16, delayed, blockwise; no anchor of that shape).
# One JSON line per run: step_ms (median of iterations 11-40), tok_s, MFU, peak memory, loss.
# usage (device machine, repo root, device_carry/ carried by bench/gpu/make_carry.sh):
#   bench/gpu/fp8_step.sh <out dir> [runs...]     (default: all below)
set -u
OUT=$1
shift
exec bench/gpu/e2e_vs_torch.sh "$OUT" ${*:-124m 124m-fp8 124m-fp8-tw 124m-fp8-block 1.3b 1.3b-fp8 1.3b-fp8-tw \
  1.3b-fp8-block torch-fp8 8b-slice 8b-slice-fp8 8b-slice-fp8-block}
