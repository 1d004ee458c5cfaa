# Data-parallel equivalence under mpiexec (tests/mpi/ddp_equivalence_driver.cpp): DistributedDataParallel
# with plain Adam and with the distributed optimizer at DP = np (and TP2 x DP2 at np 4) against the
# single-rank model on the same global batch.
add_executable(ddp_equivalence_driver ${CMAKE_SOURCE_DIR}/tests/mpi/ddp_equivalence_driver.cpp)
target_compile_options(ddp_equivalence_driver PRIVATE ${MCPP_WARNINGS})
target_include_directories(ddp_equivalence_driver PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(ddp_equivalence_driver PRIVATE mcpp_lib GTest::gtest)
foreach(np 2 4)
  add_test(NAME parallel.ddp_equivalence_np${np}
           COMMAND mpiexec --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:ddp_equivalence_driver>)
  set_tests_properties(parallel.ddp_equivalence_np${np} PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1"
                       TIMEOUT 600)
endforeach()
