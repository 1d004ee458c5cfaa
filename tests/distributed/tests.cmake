# Data-parallel equivalence under mpiexec (tests/mpi/ddp_equivalence_driver.cpp): DistributedDataParallel
# with plain Adam and with the distributed optimizer at DP = np (and TP2 x DP2 at np 4) against the
# single-rank model on the same global batch.
mcpp_add_mpi_driver(ddp_equivalence_driver ${CMAKE_SOURCE_DIR}/tests/mpi/ddp_equivalence_driver.cpp)
mcpp_add_mpi_tests(parallel.ddp_equivalence ddp_equivalence_driver TIMEOUT 600 NP 2 4)
