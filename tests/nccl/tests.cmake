# NCCL Communicator tests (tests/nccl/nccl_driver.cpp) under mpiexec, one rank per GPU. Built only when
# the NCCL backend is (MCPP_HAVE_NCCL, cmake/cuda.cmake). Without a GPU the driver prints "SKIPPED: ..."
# and ctest reports the test as skipped. libnccl.so.2 must be on the loader path (docs/NCCL.md).
if(MCPP_HAVE_NCCL)
  add_executable(nccl_driver ${CMAKE_SOURCE_DIR}/tests/nccl/nccl_driver.cpp)
  target_compile_options(nccl_driver PRIVATE ${MCPP_WARNINGS})
  target_include_directories(nccl_driver PRIVATE ${CMAKE_SOURCE_DIR})
  target_link_libraries(nccl_driver PRIVATE mcpp_lib GTest::gtest)
  set(nccl_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1;NCCL_NVLS_ENABLE=0")
  add_test(NAME nccl.ops_np2 COMMAND mpiexec --allow-run-as-root -np 2 $<TARGET_FILE:nccl_driver>)
  add_test(NAME nccl.watchdog_np2 COMMAND mpiexec --allow-run-as-root -np 2 $<TARGET_FILE:nccl_driver> --scenario=watchdog)
  set_tests_properties(nccl.ops_np2 nccl.watchdog_np2 PROPERTIES ENVIRONMENT "${nccl_env}" TIMEOUT 300
                       SKIP_REGULAR_EXPRESSION "SKIPPED: no CUDA device")
  set_tests_properties(nccl.watchdog_np2 PROPERTIES PASS_REGULAR_EXPRESSION "WATCHDOG OK")
endif()
