// Asynchronous sharded save: snapshot handed to a writer thread, vote + commit on the caller's thread;
// see async_save.h.
#include "mcpp/dist_checkpointing/async_save.h"

#include "mcpp/core/error.h"

namespace mcpp::dist_checkpointing {

AsyncCheckpointSaver::AsyncCheckpointSaver(comm::CommPtr world) : world_(std::move(world)) {
  MCPP_CHECK(world_ != nullptr, "AsyncCheckpointSaver needs a world communicator");
}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  if (pending_ && pending_->writer.valid()) pending_->writer.wait();
}

void AsyncCheckpointSaver::start(const std::string& save_dir, int64_t iteration, nlohmann::json meta,
                                 std::vector<ShardedTensor> shards) {
  maybe_finalize(/*blocking=*/true);  // at most one save in flight
  Pending p;
  p.save_dir = save_dir;
  p.iteration = iteration;
  p.meta = std::move(meta);
  p.shards = std::move(shards);
  p.started = std::chrono::steady_clock::now();
  p.tmp_dir = begin_sharded_save(save_dir, iteration, world_->host());  // collective, this thread
  pending_ = std::move(p);
  Pending& q = *pending_;
  // The writer reads q.shards, which stay put: pending_ is not touched until the writer has finished.
  q.writer = std::async(std::launch::async, [&q, rank = world_->rank(), size = world_->size()] {
    return write_rank_files_noexcept(q.tmp_dir, q.iteration, rank, size, q.shards);
  });
}

std::optional<std::string> AsyncCheckpointSaver::maybe_finalize(bool blocking) {
  if (!pending_) return std::nullopt;
  Pending& p = *pending_;
  if (!blocking) {
    Tensor done = Tensor::empty({1}, DType::I32);
    done.data<int32_t>()[0] = p.writer.wait_for(std::chrono::seconds(0)) == std::future_status::ready ? 1 : 0;
    world_->host().all_reduce(done, comm::ReduceOp::Min).wait();
    if (done.data<int32_t>()[0] == 0) return std::nullopt;
  }
  const RankWriteResult mine = p.writer.get();
  Pending finished = std::move(p);
  pending_.reset();  // nothing in flight from here on, whatever the outcome
  std::string dir = finish_sharded_save(finished.save_dir, finished.tmp_dir, finished.iteration, finished.meta,
                                        mine, world_->host());
  last_save_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - finished.started).count();
  return dir;
}

}  // namespace mcpp::dist_checkpointing
