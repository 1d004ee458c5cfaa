# Parallel-equivalence tests under mpiexec (tests/mpi/*_driver.cpp, each its own executable): the same
# weights and global batch at TP/SP and PP = k against the single-rank model.
mcpp_add_mpi_driver(parallel_equivalence_driver ${CMAKE_SOURCE_DIR}/tests/mpi/parallel_equivalence_driver.cpp)
mcpp_add_mpi_tests(parallel.tp_equivalence parallel_equivalence_driver TIMEOUT 300 NP 2 4)
mcpp_add_mpi_driver(pipeline_equivalence_driver ${CMAKE_SOURCE_DIR}/tests/mpi/pipeline_equivalence_driver.cpp)
mcpp_add_mpi_tests(parallel.pp_equivalence pipeline_equivalence_driver TIMEOUT 300 NP 2 4)
# Expert parallelism: the MoE layer at EP = world against each rank's single-rank layer.
mcpp_add_mpi_driver(moe_driver ${CMAKE_SOURCE_DIR}/tests/mpi/moe_driver.cpp)
mcpp_add_mpi_tests(parallel.ep_equivalence moe_driver TIMEOUT 300 NP 2 4)
