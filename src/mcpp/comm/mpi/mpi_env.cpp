// Process-level MPI: init_mpi / world / finalize_mpi, the MCPP_MPI_CHECK error path, MPI_Abort action.
#include "mcpp/comm/mpi/mpi_check.h"

#include <numeric>

#include "mcpp/comm/mpi/mpi_check.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/comm/mpi/mpi_reduce_ops.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {

namespace {
CommPtr g_world;
int g_world_rank = -1;
int g_thread_level = -1;
bool g_initialized_here = false;
}  // namespace

namespace mpi {
int cached_world_rank() { return g_world_rank; }

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) len = 0;
  throw Error(fmt::format("MPI error on rank {}: {} failed: {} ({}:{})", g_world_rank, call,
                          len > 0 ? std::string(buf, static_cast<size_t>(len)) : fmt::format("code {}", code), file,
                          line));
}
}  // namespace mpi

namespace {
CommPtr init_impl(int* argc, char*** argv, const MpiInitOptions& opts) {
  if (g_initialized_here) fail("comm::init_mpi called twice");
  int already = 0;
  MCPP_MPI_CHECK(MPI_Initialized(&already));
  if (already) fail("comm::init_mpi: MPI was already initialized by someone else");
  int provided = 0;
  MCPP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  g_initialized_here = true;
  g_thread_level = provided;
  if (provided < MPI_THREAD_SERIALIZED) {
    fail("comm::init_mpi: the MPI library grants thread level {} (< MPI_THREAD_SERIALIZED); the watchdog needs more",
         provided);
  }
  MCPP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  MCPP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MCPP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  g_world_rank = rank;
  mpi::create_reduce_ops();
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  MPI_Comm dup = MPI_COMM_NULL;
  MCPP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  auto rec = std::make_shared<FlightRecorder>(rank, size, opts.recorder_capacity);
  g_world = std::make_shared<MpiCommunicator>("world", std::move(ranks), rank, std::move(rec), dup);
  return g_world;
}
}  // namespace

CommPtr init_mpi(int& argc, char**& argv, const MpiInitOptions& opts) { return init_impl(&argc, &argv, opts); }
CommPtr init_mpi(const MpiInitOptions& opts) { return init_impl(nullptr, nullptr, opts); }

CommPtr world() {
  if (!g_world) fail("comm::world(): call comm::init_mpi first (or use comm::make_local_world for one process)");
  return g_world;
}

bool mpi_initialized_here() { return g_initialized_here; }
int mpi_thread_level() { return g_thread_level; }

void finalize_mpi() {
  if (!g_initialized_here) return;
  g_world.reset();
  mpi::free_reduce_ops();
  MCPP_MPI_CHECK(MPI_Finalize());
  g_initialized_here = false;
}

std::function<void(int, const std::string&)> mpi_abort_action() {
  return [](int code, const std::string&) { MPI_Abort(MPI_COMM_WORLD, code); };
}

}  // namespace mcpp::comm
