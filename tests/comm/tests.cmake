# Multi-rank Communicator tests under mpiexec (world sizes 2, 4, 8 on a 2-core machine: --oversubscribe),
# and the watchdog scenario driven by tests/comm/watchdog_check.py (child mpiexec, exit code, timing, dumps).
# (mcpp_add_mpi_driver / MCPP_MPI_ENV: tests/CMakeLists.txt; these runs pass a per-np dump dir.)
mcpp_add_mpi_driver(comm_mpi_driver ${CMAKE_SOURCE_DIR}/tests/mpi/comm_mpi_driver.cpp)
foreach(np 2 4 8)
  add_test(NAME comm.mpi_np${np}
           COMMAND mpiexec --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:comm_mpi_driver>
                   --dump-dir=${CMAKE_CURRENT_BINARY_DIR}/comm_np${np})
  set_tests_properties(comm.mpi_np${np} PROPERTIES ENVIRONMENT "${MCPP_MPI_ENV}" TIMEOUT 120)
endforeach()

add_test(NAME comm.watchdog_skip_np4
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/comm/watchdog_check.py $<TARGET_FILE:comm_mpi_driver>
                 ${CMAKE_CURRENT_BINARY_DIR}/watchdog_np4 4)
set_tests_properties(comm.watchdog_skip_np4 PROPERTIES ENVIRONMENT "${MCPP_MPI_ENV}" TIMEOUT 90)
