# mcpp ckpt end to end against the independent Python oracle (tests/oracle/ckpt/read_safetensors.py:
# struct + json + numpy + python3-xxhash): import, verify, info, export, byte-flip detection.
add_test(NAME ckpt_cli_oracle
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/oracle/ckpt/ckpt_cli_test.sh ${MCPP_BIN} ${MCPP_PY}
                 ${CMAKE_BINARY_DIR}/ckpt_cli_test_work)
# Sharded checkpoints through `mcpp train` under mpiexec (issue 5): TP2 x DP2 + distributed optimizer
# reloads bit-identically (model + optimizer, independent oracle dcp_oracle.py) at TP1, TP4, TP2 x DP2
# without distopt, DP4, DP2 + distopt, and continues with the uninterrupted run's losses (1e-6).
add_test(NAME dcp.reshard_matrix
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/dist_checkpointing/dcp_matrix_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/dcp_matrix_check)
set_tests_properties(dcp.reshard_matrix PROPERTIES TIMEOUT 600)
# SIGKILL of one rank / all ranks at 25 named points of a sharded save and of retention (MCPP_FAULT_KILL_AT), sync
# and async, with --keep-last-n-checkpoints: the tracker always names a checkpoint that verifies and resumes bit for
# bit; staging / set-aside directories are never loadable; the next start leaves committed checkpoints only.
add_test(NAME dcp.kill_points
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/dist_checkpointing/dcp_kill_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/dcp_kill_check)
set_tests_properties(dcp.kill_points PROPERTIES TIMEOUT 1800)
# Damaged sharded checkpoints (flipped data / header bytes, truncated and deleted rank files, manifest
# edits): `mcpp ckpt verify` and a loading `mcpp train` exit 2 naming the file and the tensor.
add_test(NAME dcp.corruption
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/dist_checkpointing/dcp_corrupt_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/dcp_corrupt_check)
set_tests_properties(dcp.corruption PROPERTIES TIMEOUT 600)
# --async-save byte-identical to sync (1 rank, TP2 x DP2 + distopt), a failed background write surfaces
# and leaves latest, --keep-last-n-checkpoints + stale staging clean-up, per-rank RNG (TP2, PP2 dropout
# resume bit-exact).
add_test(NAME dcp.async_retention_rng
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/dist_checkpointing/dcp_async_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/dcp_async_check)
set_tests_properties(dcp.async_retention_rng PROPERTIES TIMEOUT 900)
# Pipeline / virtual-stage reshard (E11): PP4 V2, TP2 x PP2, TP2 x PP2 x DP2 + distopt checkpoints load at
# PP2, PP1, PP4 V1/V2, TP1 x PP4, TP4, TP1 bit-identically (oracle) with the uninterrupted losses;
# `mcpp ckpt convert` (TP2 x PP2 -> TP1, TP4) and `mcpp ckpt info` against the manifest.
add_test(NAME dcp.pp_matrix_convert
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/dist_checkpointing/dcp_pp_matrix_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/dcp_pp_matrix_check)
set_tests_properties(dcp.pp_matrix_convert PROPERTIES TIMEOUT 1500)
# Checkpoints saved by an older build (tests/fixtures/ckpt_v1) verify, load and continue bit for bit.
add_test(NAME dcp.old_checkpoint_fixture
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/dist_checkpointing/old_checkpoint_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/old_checkpoint_check)
set_tests_properties(dcp.old_checkpoint_fixture PROPERTIES TIMEOUT 300)
# DeepSeek-V2 / V3 HF directories (issue 36): imported `mcpp forward` logits equal a float64 transcription of
# transformers' DeepseekV3 / V2 forward (MLA, YaRN, group-limited routing with expert bias, shared experts); the export
# of the import is the input tensor for tensor; the deepseek-v3-tiny recipe goes to HF and back into `mcpp train`.
add_test(NAME dcp.deepseek_hf
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/dist_checkpointing/deepseek_hf_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/deepseek_hf_check)
set_tests_properties(dcp.deepseek_hf PROPERTIES TIMEOUT 300)
