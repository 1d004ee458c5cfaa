# training.cli_end_to_end: mcpp data preprocess -> train (save, resume bit-exact) -> forward (vs float64
# torch from the checkpoint bytes) -> generate; bad inputs exit 2 with one error line.
add_test(NAME training.cli_end_to_end
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/train_cli_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/train_cli_check)
# training.parallel_cli: `mcpp train` under mpiexec (TP2 x DP2 + SP) equals 1 rank; 4-rank resume is
# bit-exact; the TP2 x DP2 checkpoint continues at TP1; a bad layout fails cleanly on every rank.
add_test(NAME training.parallel_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/parallel_train_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/parallel_train_check)
set_tests_properties(training.parallel_cli PROPERTIES TIMEOUT 600)
# training.op_profile: MCPP_PROFILE_OPS=1 prints the per-op time table at exit (kernels/op_profile.h),
# with the ops a training step runs and their call counts.
add_test(NAME training.op_profile
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/op_profile_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/op_profile_check)
# training.pipeline_cli: distributed optimizer with virtual stages (PP4 x V2 x DP2, 8 ranks) and
# --calculate-per-token-loss (PP2 x DP2) equal 1 rank; recompute with dropout bit-identical at PP2; the
# per-stage activation-memory record; --variable-seq-lengths; --account-for-embedding/loss-in-pipeline-split.
add_test(NAME training.pipeline_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/pipeline_train_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/pipeline_train_check)
set_tests_properties(training.pipeline_cli PROPERTIES TIMEOUT 600)
# training.launch_cli: `mcpp launch --nproc-per-node 4 -- train` (TCP world, no MPI) equals one process at
# TP2 x PP2 and TP2+SP x DP2 + distributed optimizer; a killed rank ends the job; usage errors exit 2.
add_test(NAME training.launch_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/launch_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/launch_check)
set_tests_properties(training.launch_cli PROPERTIES TIMEOUT 600)
# training.launch_multinode_cli: two launchers on loopback (`--nnodes 2 --node-rank R --master-addr 127.0.0.1
# --master-port P`, a TCP rendezvous) train TP2 x DP2 equal to one process; a rank killed on node 1 stops both
# nodes; a bad node rank / unreachable or unresolvable master / busy port / mismatched node exits 2 with one line.
add_test(NAME training.launch_multinode_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/launch_multinode_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/launch_multinode_check)
set_tests_properties(training.launch_multinode_cli PROPERTIES TIMEOUT 600)
# training.context_parallel_cli: `mcpp train --context-parallel-size` (all-to-all attention) under mpiexec —
# CP2 / CP4 / CP2 x TP2+SP / CP2 x PP2 / CP2 x DP2 + distributed optimizer / Llama / unfused / selective recompute
# / per-token loss / --qk-layernorm (TP2 without SP, CP2 x TP2 + SP, TP2 + SP x PP2) equal 1 rank; resume
# bit-exact and continued at 1 rank; the memory plan equals the measured activations; bad CP / EP input fails with
# one named error.
add_test(NAME training.context_parallel_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/context_parallel_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/context_parallel_check)
set_tests_properties(training.context_parallel_cli PROPERTIES TIMEOUT 600)
# training.ring_attention_cli: `--cp-comm-type p2p` (ring attention) under mpiexec — CP2 / CP4 / CP2 x TP2+SP /
# CP2 x PP2 / CP2 x DP2 + distributed optimizer / recompute / Llama (RoPE, GQA, TP2 x CP2 with 2 groups) equal
# 1 rank; a p2p checkpoint continues at 1 rank and at a2a; the memory plan equals the measured activations; bad
# ring input fails with one named error.
add_test(NAME training.ring_attention_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/ring_attention_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/ring_attention_check)
set_tests_properties(training.ring_attention_cli PROPERTIES TIMEOUT 600)
# training.moe_cli: `mcpp train --num-experts` (MoE layers at EP 1) — trains, DP2 / DP2 + distributed optimizer /
# PP2 / Llama-style equal 1 rank; resume bit-exact and a 1-rank checkpoint continued at DP2; bad MoE input fails
# with one named error.
add_test(NAME training.moe_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/moe_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/moe_check)
set_tests_properties(training.moe_cli PROPERTIES TIMEOUT 600)
# training.moe_etp_cli: expert tensor parallelism (the default under TP) — TP2 + SP, expert TP 2 / 4 at TP 1,
# TP2 x EP2 x expert TP 2 + distributed optimizer, padded to capacity equal 1 rank; checkpoints reshard; memory plan.
add_test(NAME training.moe_etp_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/moe_etp_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/moe_etp_check)
set_tests_properties(training.moe_etp_cli PROPERTIES TIMEOUT 600)
# training.mtp_cli: multi-token prediction (--mtp-num-layers) — logged MTP losses; TP2 + SP x DP2, PP2 x DP2, a layout
# with 'm', tied embeddings at PP2 and MoE depths at EP2 equal 1 rank; full recompute bit-exact; PP2 resume bit-exact,
# continued at 1 rank, a converted checkpoint continued at PP2; memory plans equal the measured; bad MTP input fails
# with one named error.
add_test(NAME training.mtp_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/mtp_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/mtp_check)
set_tests_properties(training.mtp_cli PROPERTIES TIMEOUT 600)
# training.mla_cli: multi-latent attention (--multi-latent-attention) — TP2 (+ SP, + tp-comm-overlap) x DP2, PP2 x DP2
# with the distributed optimizer and TP2 x PP2 equal 1 rank; recompute bit-exact; a TP2 checkpoint continued at 1 rank
# and resumed bit-exact; memory plans equal the measured; bad MLA input fails with one named error.
add_test(NAME training.mla_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/mla_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/mla_check)
set_tests_properties(training.mla_cli PROPERTIES TIMEOUT 600)
# training.cli_robustness (issue 38): `--help` of every command and sub-command; bad input is one named error
# (exit 2) within seconds — --temperature nan, ckpt verify --iteration -1, absurd sizes refused by the memory plan
# against the host, damaged manifests (negative counters, a 2^40-element tensor, a 100,000-deep meta), FIFOs as
# manifest / tracker / .idx, a 100,000-deep corpus line; forward on 1,000 sequences in batches equals one pass.
add_test(NAME training.cli_robustness
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/robustness_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/robustness_check)
set_tests_properties(training.cli_robustness PROPERTIES TIMEOUT 600)

# training.observability_cli: per-rank metrics of an np 4 run (timers >= 0, phases within the step), TFLOP/s and MFU
# against Megatron's formula, min / max over ranks, the timer and straggler reports, TensorBoard events read with an
# independent CRC-32C and decoder equal to the JSONL, provenance in metrics / checkpoints / --version, the MoE load
# report, the module trace per pipeline stage, `mcpp metrics plot|summarize`, bad input (tests/oracle/cli/).
add_test(NAME training.observability_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/observability_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/observability_check)
set_tests_properties(training.observability_cli PROPERTIES TIMEOUT 600)

# training.inject_fault_cli: a malformed --inject-fault, or a drill that could never fire in its run (a layer, RANK or
# ITER outside it, a layer another pipeline stage holds, bad-shard without a save at ITER, a collective drill on one
# rank), exits 2 at startup with one "error:" line (per rank) and no outputs; drills at the run's edges fire.
add_test(NAME training.inject_fault_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/training/inject_fault_cli_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/inject_fault_cli_check)
set_tests_properties(training.inject_fault_cli PROPERTIES TIMEOUT 300)

# config.cli_reliability: non-finite / out-of-range flag and TOML values, integers beyond int64, wrong TOML types
# and a --config that is a directory or a FIFO each exit 2 with one "error:" line naming the flag, key or file.
add_test(NAME config.cli_reliability
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/training/config_cli_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/config_cli_check)

# training.diagnosis_cli: --check-for-nan-in-loss-and-grad names the injected NaN's iteration, rank, layer, module and
# tensor (DP2, TP2, PP2), transient vs reproducible, the step skipped; --check-for-spiky-loss; each --inject-fault
# kind on 2 CPU ranks: exit within the watchdog timeout + 10 s, no orphans, the detector's message, an exact restart
# after `kill`; `mcpp debug hang` names the culprit of the hang and wrong-collective dumps (tests/oracle/cli/).
add_test(NAME training.diagnosis_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/diagnosis_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/diagnosis_check)
set_tests_properties(training.diagnosis_cli PROPERTIES TIMEOUT 600)
# training.cpu_rerun_cli: --rerun-on-cpu: an injected NaN (a device fault) re-runs finite in fp32 on CPU, an overflow
# from --lr 1e30 names the same first non-finite module as the same-rank re-run; from the step's checkpoint or the
# pre-step state (no checkpoint, an older one, a corrupted shard); one rank, TP2, DP2 + distributed optimizer, PP2.
add_test(NAME training.cpu_rerun_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/cpu_rerun_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/cpu_rerun_check)
set_tests_properties(training.cpu_rerun_cli PROPERTIES TIMEOUT 300)
# training.forensics_cli: --check-data-consistency (TP2xDP2, PP2xDP2 pass; an injected bad-batch is named: iteration,
# tp group, microbatch, rank), --flight-recorder-checksums (a corrupted result named by `mcpp debug hang`), SIGUSR1
# dumps with every rank's host stack (`mcpp debug hang` names the hung rank and shows the stacks); no orphans.
add_test(NAME training.forensics_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/forensics_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/forensics_check)
set_tests_properties(training.forensics_cli PROPERTIES TIMEOUT 300)
# training.sft_cli: `mcpp train --finetune --load <imported hf-llama> --sft --data-path sft.jsonl` (chatml, packed):
# the first step's loss equals each conversation run alone (mcpp forward) over the assistant tokens; fine-tuning
# lowers the loss; a bad JSONL line is one error naming file:line.
add_test(NAME training.sft_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/sft_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/sft_check)
set_tests_properties(training.sft_cli PROPERTIES TIMEOUT 600)
# training.packed_pretrain_cli: --reset-position-ids --reset-attention-mask on EOD-separated documents: the first
# loss equals every document piece run alone through mcpp forward (GPTDataset's samples from mcpp data samples);
# refused with context parallelism.
add_test(NAME training.packed_pretrain_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/packed_pretrain_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/packed_pretrain_check)
set_tests_properties(training.packed_pretrain_cli PROPERTIES TIMEOUT 600)

# training.fp8_parallel_cli (~25 s): FP8 (emulated) delayed and blockwise at PP2 (iteration 1 bit for bit, then 5e-4),
# DP2 + distributed optimizer (blockwise 5e-4; delayed 1e-3: per-replica scaling state), blockwise TP2 + SP; PP2 and
# DP2 resumes with the FP8 state bit for bit; full / selective recompute at PP2 bit for bit (tests/oracle/cli/).
add_test(NAME training.fp8_parallel_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/fp8_parallel_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/fp8_parallel_check)
set_tests_properties(training.fp8_parallel_cli PROPERTIES TIMEOUT 300)

# training.fp8_errors_cli (~3 s): bad FP8 combinations (blockwise dims not multiples of 128, mxfp8, --fp8-param-gather,
# --tp-comm-overlap) get one `error:` line naming the problem and exit 2.
add_test(NAME training.fp8_errors_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/fp8_errors_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/fp8_errors_check)
set_tests_properties(training.fp8_errors_cli PROPERTIES TIMEOUT 120)
