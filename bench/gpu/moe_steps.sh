#!/bin/bash
# The MoE training step on one GPU: GPT-2 124M shapes (bench/gpu/env.sh's $M124, bf16) at micro batch B, 8 experts
# top-2 with the aux loss and the z-loss, 30 iterations logged every 10; ms per iteration over iterations 21-30
# (the last record) for the dense model, dropless MoE, MoE padded to capacity (eager and with --enable-cuda-graph)
# and DeepSeek-V3's router padded (sigmoid, 4 groups, expert bias, sequence-wise loss; eager and graphed), and dropless
# with Megatron's sinkhorn routing, with the MoE layers recomputed, with a gated shared expert, with random logits
# (--moe-router-force-load-balancing) and with the router's input jitter; the activation
# peak from each run's pipeline_activation_memory record.
# With --moe-grouped-gemm (one grouped GEMM per linear for all experts, sizes on the device): dropless and padded, eager
# and with --enable-cuda-graph (dropless is capturable with it: no host read of the counts).
# SET: all (default) or grouped (dense, the sequential dropless / padded / padded-graph baselines and the four grouped
# runs only: the before / after of issue 35's grouped-GEMM MoE in one short call), or padded (the sequential
# padded-graph run and the grouped padded ones, eager and graphed, with the batched GEMMs' bias / GELU / gelu' in passes
# and in their epilogues (MCPP_GROUPED_GEMM_EPILOGUES=1): the padded layers' batched cuBLASLt GEMMs against one GEMM an
# expert), or deepseek: DeepSeek-V3's layout
# (configs/deepseek-v3-tiny.toml: MLA with query compression and latent norms, YaRN, a dense first layer, then MoE
# layers of 8 experts in 4 groups, top-2 of the best 2 groups by sigmoid scores, the expert bias, routed scaling 2.5,
# a shared expert, the sequence-wise balance loss, one MTP depth) at the 124M widths (d 768, 12 layers, T 1024), its
# MoE step (dropless, padded, padded + CUDA graph) against its dense equivalent: the same model with every MLP dense
# and as wide as a token's active experts (top-2 x 1536 + the shared 1536 = 4608), so both run the same FLOPs a token.
# usage (device machine, repo root, device_carry/ carried): bench/gpu/moe_steps.sh OUT [B] [CAPACITY] [SET]
set -u
OUT=$1
B=${2:-16} CAP=${3:-1.0} SET=${4:-all}
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_124m
RUN_FLAGS="$M124 --micro-batch-size $B --global-batch-size $B --train-iters 30"
MOE="--num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 0.01"
PAD="--moe-expert-capacity-factor $CAP --moe-pad-expert-input-to-capacity"
DS="--num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 0.001 --moe-router-score-function sigmoid
  --moe-router-num-groups 4 --moe-router-group-topk 2 --moe-router-enable-expert-bias
  --moe-router-load-balancing-type seq_aux_loss --moe-router-topk-scaling-factor 2.5"
GRAPH="--enable-cuda-graph --cuda-graph-warmup-steps 3"
if [ "$SET" = deepseek ]; then
  DSV3="--normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights
    --disable-bias-linear --multi-latent-attention --q-lora-rank 384 --kv-lora-rank 256 --qk-head-dim 64
    --qk-pos-emb-head-dim 32 --v-head-dim 64 --qk-layernorm --rope-type yarn --rotary-scaling-factor 4 --mscale 1.0
    --mscale-all-dim 1.0 --original-max-position-embeddings 256 --mtp-num-layers 1 --ffn-hidden-size 4608"
  DSV3_MOE="--num-experts 8 --moe-layer-freq [0]+[1]*11 --moe-ffn-hidden-size 1536 --moe-router-topk 2
    --moe-router-score-function sigmoid --moe-router-num-groups 4 --moe-router-group-topk 2
    --moe-router-topk-scaling-factor 2.5 --moe-router-enable-expert-bias --moe-router-load-balancing-type seq_aux_loss
    --moe-aux-loss-coeff 1e-4 --moe-shared-expert-intermediate-size 1536"
  run_train ds_dense 1 $DSV3
  run_train ds_moe_dropless 1 $DSV3 $DSV3_MOE
  run_train ds_moe_padded 1 $DSV3 $DSV3_MOE $PAD
  run_train ds_moe_padded_graph 1 $DSV3 $DSV3_MOE $PAD $GRAPH
  RUNS="ds_dense ds_moe_dropless ds_moe_padded ds_moe_padded_graph"
elif [ "$SET" = padded ]; then
  GG="--moe-grouped-gemm"
  run_train moe_padded_graph 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GRAPH
  run_train moe_padded_grouped 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GG
  run_train moe_padded_grouped_graph 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GG $GRAPH
  MCPP_GROUPED_GEMM_EPILOGUES=1 run_train moe_padded_grouped_epi 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GG
  MCPP_GROUPED_GEMM_EPILOGUES=1 run_train moe_padded_grouped_epi_graph 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GG $GRAPH
  RUNS="moe_padded_graph moe_padded_grouped moe_padded_grouped_graph moe_padded_grouped_epi
    moe_padded_grouped_epi_graph"
else
run_train dense 1
run_train moe_dropless 1 $MOE --moe-z-loss-coeff 0.001
run_train moe_padded 1 $MOE --moe-z-loss-coeff 0.001 $PAD
run_train moe_padded_graph 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GRAPH
GG="--moe-grouped-gemm"
run_train moe_dropless_grouped 1 $MOE --moe-z-loss-coeff 0.001 $GG
run_train moe_dropless_grouped_graph 1 $MOE --moe-z-loss-coeff 0.001 $GG $GRAPH
run_train moe_padded_grouped 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GG
run_train moe_padded_grouped_graph 1 $MOE --moe-z-loss-coeff 0.001 $PAD $GG $GRAPH
RUNS="dense moe_dropless moe_padded moe_padded_graph moe_dropless_grouped moe_dropless_grouped_graph moe_padded_grouped
  moe_padded_grouped_graph"
if [ "$SET" = all ]; then
run_train deepseek_padded 1 $DS $PAD
run_train deepseek_padded_graph 1 $DS $PAD $GRAPH
# Megatron's sinkhorn routing (dropless; one thread-block sinkhorn a layer): its cost over the dropless step
run_train moe_sinkhorn 1 --num-experts 8 --moe-router-topk 2 --moe-z-loss-coeff 0.001 \
  --moe-router-load-balancing-type sinkhorn
# Selective recompute of the MoE layers (--recompute-modules core_attn moe): time against the activations it saves
run_train moe_recompute 1 $MOE --moe-z-loss-coeff 0.001 --recompute-granularity selective \
  --recompute-modules core_attn moe
# A gated shared expert of the dense MLP's width beside the routed ones (Qwen-MoE's layout)
run_train moe_shared_gate 1 $MOE --moe-z-loss-coeff 0.001 --moe-shared-expert-intermediate-size 3072 \
  --moe-shared-expert-gate
# Megatron's benchmarking routing (--moe-router-force-load-balancing: random logits, balanced experts) dropless, and
# the router's input jitter
run_train moe_balanced 1 $MOE --moe-z-loss-coeff 0.001 --moe-router-force-load-balancing
run_train moe_jitter 1 $MOE --moe-z-loss-coeff 0.001 --moe-input-jitter-eps 0.01
RUNS="$RUNS deepseek_padded deepseek_padded_graph moe_sinkhorn moe_recompute moe_shared_gate moe_balanced moe_jitter"
fi
fi
echo "== MoE steps, 124M B$B, capacity $CAP (ms per iteration, iterations 21-30; lm loss at 30; router losses)"
for r in $RUNS; do
  python3 - "$OUT/$r.jsonl" "$r" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"event":"train"' in l] if sys.argv[1] else []
if not recs:
    print(f"{sys.argv[2]:>24}: no records"); sys.exit()
r = recs[-1]
lb = r.get("load_balancing_loss", r.get("seq_load_balancing_loss"))
mem = [json.loads(l) for l in open(sys.argv[1]) if '"event":"pipeline_activation_memory"' in l]
act = mem[-1]["stages"][0]["peak_bytes"] / 2**20 if mem else float("nan")
print(f"{sys.argv[2]:>24}: {r['elapsed_ms_per_iter']:8.2f} ms  {r['tokens_per_sec']:10.0f} tok/s  lm loss "
      f"{r['lm_loss']:.5f}  balancing {lb}  z {r.get('z_loss')}  activations {act:.0f} MiB")
EOF
done
grep -h "captured the training step" "$OUT"/*graph.log
