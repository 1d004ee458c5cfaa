# parallel_state script tests (the gtests are rank_generator_test / parallel_context_test in mcpp_tests).
#   parallel_state.plan_ranks_cli: `mcpp plan ranks` group lists and table rows vs megatron_ranks.py (a
#     transcription of Megatron-Core's generate_masked_orthogonal_rank_groups), bad layouts exit 2.
#   parallel_state.mpi_np4 / np8: ParallelContext::create over the MPI backend under mpiexec; every held
#     group's members vs ParallelLayout, checked by an all_gather of global ranks over the group.
add_test(NAME parallel_state.plan_ranks_cli
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/parallel_state/plan_cli_check.py ${MCPP_BIN})

add_executable(parallel_context_mpi_driver ${CMAKE_SOURCE_DIR}/tests/parallel_state/parallel_context_mpi_driver.cpp)
target_compile_options(parallel_context_mpi_driver PRIVATE ${MCPP_WARNINGS})
target_include_directories(parallel_context_mpi_driver PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(parallel_context_mpi_driver PRIVATE mcpp_lib GTest::gtest)
foreach(np 4 8)
  add_test(NAME parallel_state.mpi_np${np}
           COMMAND mpiexec --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:parallel_context_mpi_driver>)
  set_tests_properties(parallel_state.mpi_np${np} PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1"
                       TIMEOUT 120)
endforeach()
