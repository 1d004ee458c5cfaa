# tools.timeline_cli: `mcpp train` with PP2 under mpiexec writes a --timeline trace with both ranks and an
# F and B event per microbatch per step, a pipeline_bubble metrics record; `mcpp trace summarize` prints
# the per-rank table and exits 2 with one error line on a malformed or missing file.
add_test(NAME tools.timeline_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/tools/timeline_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/timeline_check)
set_tests_properties(tools.timeline_cli PROPERTIES TIMEOUT 600)

# tools.plan_memory_cli: `mcpp plan memory` — GPT-2 124M's planned parameters equal the textbook count, the
# model state Megatron's mixed-precision bytes per parameter; TP2 x PP4 (V2) x DP2 with SP and the distributed
# optimizer: interleaved in-flight counts, sharded optimizer, stage shards summing to the model; bad input exits
# 2 with one named error. (The plan against measured activations: tests/oracle/cli/*_train_check.py.)
add_test(NAME tools.plan_memory_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/tools/plan_memory_check.py ${MCPP_BIN})

# tools.plan_layout_cli: `mcpp plan layout` — a costs file whose LM head is heavy gets a proposal with fewer layers
# on the last stage, faster than the even split in the simulator (JSON and CSV the same); a PP2 `--timeline` trace on
# CPU ranks carries layer rows the plan reads; bad input exits 2 with one named error line.
add_test(NAME tools.plan_layout_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/tools/plan_layout_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/plan_layout_check)
set_tests_properties(tools.plan_layout_cli PROPERTIES TIMEOUT 300)
