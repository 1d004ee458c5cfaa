# parallel_state script tests (the gtests are rank_generator_test / parallel_context_test in mcpp_tests).
#   parallel_state.plan_ranks_cli: `mcpp plan ranks` group lists and table rows vs megatron_ranks.py (a
#     transcription of Megatron-Core's generate_masked_orthogonal_rank_groups), bad layouts exit 2.
#   parallel_state.mpi_np4 / np8: ParallelContext::create over the MPI backend under mpiexec; every held
#     group's members vs ParallelLayout, checked by an all_gather of global ranks over the group.
add_test(NAME parallel_state.plan_ranks_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/parallel_state/plan_cli_check.py ${MCPP_BIN})

mcpp_add_mpi_driver(parallel_context_mpi_driver ${CMAKE_SOURCE_DIR}/tests/parallel_state/parallel_context_mpi_driver.cpp)
mcpp_add_mpi_tests(parallel_state.mpi parallel_context_mpi_driver TIMEOUT 120 NP 4 8)
