# Parallel-equivalence tests under mpiexec (tests/mpi/*_driver.cpp, each its own executable): the same
# weights and global batch at TP/SP (and later DP/PP) = k against the single-rank model.
add_executable(parallel_equivalence_driver ${CMAKE_SOURCE_DIR}/tests/mpi/parallel_equivalence_driver.cpp)
target_compile_options(parallel_equivalence_driver PRIVATE ${MCPP_WARNINGS})
target_include_directories(parallel_equivalence_driver PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(parallel_equivalence_driver PRIVATE mcpp_lib GTest::gtest)
foreach(np 2 4)
  add_test(NAME parallel.tp_equivalence_np${np}
           COMMAND mpiexec --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:parallel_equivalence_driver>)
  set_tests_properties(parallel.tp_equivalence_np${np} PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1"
                       TIMEOUT 300)
endforeach()

add_executable(pipeline_equivalence_driver ${CMAKE_SOURCE_DIR}/tests/mpi/pipeline_equivalence_driver.cpp)
target_compile_options(pipeline_equivalence_driver PRIVATE ${MCPP_WARNINGS})
target_include_directories(pipeline_equivalence_driver PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(pipeline_equivalence_driver PRIVATE mcpp_lib GTest::gtest)
foreach(np 2 4)
  add_test(NAME parallel.pp_equivalence_np${np}
           COMMAND mpiexec --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:pipeline_equivalence_driver>)
  set_tests_properties(parallel.pp_equivalence_np${np} PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1"
                       TIMEOUT 300)
endforeach()
