// mcpp train [--config RECIPE.toml] [Megatron-LM flags]: GPT pretraining on CPU ranks or GPUs.
// One process, under `mcpp launch --nproc-per-node N` (TCP world, comm/tcp/) or under `mpirun -np N`
// (detected from the launcher's environment): MPI world, watchdog
// (--distributed-timeout-minutes; dumps to <save or metrics dir>/flight_recorder/, also on SIGUSR1, with the main
// thread's host stack), --check-collectives, --flight-recorder-checksums, the
// ParallelContext (tp/pp/cp from flags, dp = world / (tp*pp*cp)). The tokenizer fixes the vocabulary
// (padded to --make-vocab-size-divisible-by * tp), then the Trainer runs.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>

#include "apps/mcpp/command.h"
#include "apps/mcpp/tokenizer_flags.h"
#include "mcpp/comm/host_stack.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/comm/nccl/nccl_communicator.h"
#include "mcpp/comm/tcp/tcp_communicator.h"
#include "mcpp/comm/watchdog.h"
#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt2_tokenizer.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/training/arguments.h"
#include "mcpp/training/checkpointing.h"
#include "mcpp/training/provenance.h"
#include "mcpp/training/trainer.h"

namespace {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

// The node-local rank from the launcher (Open MPI, PMIx, Slurm), 0 when unknown: picks this rank's GPU.
int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "MCPP_LOCAL_RANK", "LOCAL_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

int train(mcpp::Config cfg, mcpp::comm::CommPtr world) {
  cfg.apply_world_size(world->size());
  const int64_t eod = mcpp::cli::apply_tokenizer(cfg);
  mcpp::adopt_checkpoint_vocab_padding(cfg);  // a checkpoint of another TP size: its padded vocabulary, if it fits
  cfg.validate();
  mcpp::validate_parallel_layout(world->size(), cfg);
  // GPUs under mpirun or `mcpp launch` (one rank too): the parallel groups are NCCL communicators (one GPU per rank, by
  // local rank), bootstrapped over the MPI / TCP world, which keeps serving host values (Communicator::host()).
  if (mcpp::resolve_training_device(cfg.training) == mcpp::Device::CUDA && !world->takes_device_tensors())
    world = mcpp::comm::init_nccl(world, local_rank(), {});
  world->set_check_collectives(cfg.parallel.check_collectives);
  world->recorder()->set_checksums(cfg.parallel.flight_recorder_checksums);  // every group shares the recorder
  auto pc = mcpp::parallel_state::ParallelContext::create(world, mcpp::parallel_state::parallel_options(cfg.parallel));
  if (pc.rank() == pc.world_size() - 1)
    fmt::print("{}\n{}\n", mcpp::format_provenance_line(mcpp::provenance()), mcpp::format_args(cfg));
  mcpp::Trainer trainer(cfg, eod, std::move(pc));
  mcpp::TrainSummary s = trainer.train();
  if (world->rank() == world->size() - 1)
    fmt::print("training done: {} iterations run, at iteration {}\n", s.iterations_run, s.final_iteration);
  return 0;
}

// Multi-process run (mpirun, or `mcpp launch`): the watchdog over the world, and one rank's error ends the
// job (`abort` kills every rank under MPI; under mcpp launch this rank exits and the launcher stops the others).
int run_distributed(const mcpp::Config& cfg, mcpp::comm::CommPtr world,
                    const std::function<void(int, const std::string&)>& abort) {
  int rc = 0;
  try {
    // <save>/flight_recorder/, else <dir of --metrics-path>/flight_recorder/, else $TMPDIR/mcpp/flight_recorder/
    // (a run id broadcast by the watchdog keeps concurrent jobs' markers apart).
    std::string dump_dir = cfg.training.save;
    if (dump_dir.empty() && !cfg.training.metrics_path.empty())
      dump_dir = std::filesystem::path(cfg.training.metrics_path).parent_path().string();
    if (dump_dir.empty()) dump_dir = (std::filesystem::temp_directory_path() / "mcpp").string();
    mcpp::comm::install_host_stack_capture();  // the main thread's stack in every dump (comm/host_stack.h)
    mcpp::comm::Watchdog watchdog(
        world, {.timeout_seconds = mcpp::comm::distributed_timeout_seconds(cfg.parallel.distributed_timeout_minutes),
                .dump_dir = dump_dir,
                .on_abort = abort});
    // SIGUSR1 (`kill -USR1 <mpirun pid>`: mpirun forwards it): flight recorder + host stack into the same file
    const mcpp::comm::SignalDumper sigusr1_dump(world->recorder_ptr(), watchdog.dump_path());
    rc = train(cfg, world);
  } catch (const std::exception& e) {
    std::fflush(stdout);  // the error after the arguments table and the log lines, not amid them (main.cpp)
    fmt::print(stderr, "error: [rank {}] {}\n", world->rank(), e.what());
    std::fflush(stderr);
    abort(2, e.what());
  }
  return rc;
}

int run_train(const std::vector<std::string>& args) {
  mcpp::Config cfg = mcpp::parse_train_args(args);
  cfg.validate_for_training();
  if (mcpp::comm::launched_by_mcpp_launch()) {
    mcpp::comm::CommPtr world = mcpp::comm::init_tcp_world(mcpp::comm::tcp_options_from_env());
    return run_distributed(cfg, world, [](int code, const std::string&) {
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(code);
    });
  }
  if (!launched_by_mpi()) return train(cfg, mcpp::comm::make_local_world());
  mcpp::comm::CommPtr world = mcpp::comm::init_mpi();
  const int rc = run_distributed(cfg, world, mcpp::comm::mpi_abort_action());
  world.reset();
  mcpp::comm::finalize_mpi();
  return rc;
}

const mcpp::cli::Register reg{"train", "pretrain a GPT (Megatron-LM flags, --config recipe.toml; under mpirun or mcpp launch: TP/SP/PP/DP)",
                              &run_train};

}  // namespace
