// Sharded multi-rank save with vote + atomic commit; see sharded_save.h.
#include "mcpp/dist_checkpointing/sharded_save.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/durable_file.h"
#include "mcpp/dist_checkpointing/fault_injection.h"
#include "mcpp/dist_checkpointing/manifest.h"
#include "mcpp/dist_checkpointing/safetensors.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
namespace {

std::string kind_of(const std::string& key) { return key.rfind("optimizer.", 0) == 0 ? "optimizer" : "model"; }

}  // namespace

nlohmann::json write_rank_files(const std::string& dir, int64_t iteration, int rank, int world_size,
                                const std::vector<ShardedTensor>& shards) {
  std::map<std::string, std::vector<const ShardedTensor*>> by_kind;
  for (const ShardedTensor& s : shards) by_kind[kind_of(s.key)].push_back(&s);
  nlohmann::json entries = nlohmann::json::array();
  for (const char* kind : {"model", "optimizer"}) {
    auto it = by_kind.find(kind);
    if (it == by_kind.end()) continue;
    // One writer: the single-writer names, so a 1-rank checkpoint has version 1's file layout.
    const std::string file = world_size == 1 ? fmt::format("{}.safetensors", kind)
                                             : fmt::format("{}.rank_{:05d}.safetensors", kind, rank);
    std::vector<SafetensorsItem> items;
    std::vector<ManifestEntry> es;
    for (const ShardedTensor* s : it->second) {
      ManifestEntry e;
      e.key = s->key;
      e.dtype = s->data.dtype();
      e.global_shape = s->global_shape;
      e.global_offset = s->rect.offset;
      e.local_shape = s->rect.shape;
      e.file = file;
      if (s->data.shape() != s->rect.shape)
        fail("shard of '{}' at {}: data shape {} differs from its rect {}", s->key, shape_str(s->rect.offset),
             shape_str(s->data.shape()), shape_str(s->rect.shape));
      items.push_back({shard_entry_name(e), s->data});
      es.push_back(e);
    }
    fault_point(kind == std::string("model") ? "before_write_model" : "before_write_optimizer");
    auto written = write_safetensors(dir + "/" + file, items,
                                     {{"format", "pt"}, {"mcpp_iteration", std::to_string(iteration)},
                                      {"mcpp_rank", std::to_string(rank)}},
                                     /*fsync_file=*/true);
    fault_point(kind == std::string("model") ? "after_fsync_model" : "after_fsync_optimizer");
    for (size_t k = 0; k < es.size(); ++k) {
      es[k].byte_offset = written[k].byte_offset;
      es[k].byte_length = written[k].byte_length;
      es[k].xxh3 = written[k].xxh3;
    }
    Manifest one;
    one.tensors = es;
    const nlohmann::json one_json = manifest_to_json(one);
    for (const auto& j : one_json.at("tensors")) entries.push_back(j);
  }
  fsync_path(dir, /*directory=*/true);
  fault_point("after_dir_fsync");
  return entries;
}

void commit_checkpoint(const std::string& save_dir, const std::string& tmp_dir, const std::string& final_dir,
            int64_t iteration, const nlohmann::json& meta, const std::vector<std::string>& rank_entries) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const std::string& s : rank_entries) {
    const nlohmann::json part = nlohmann::json::parse(s);
    for (const auto& e : part) tensors.push_back(e);
  }
  std::stable_sort(tensors.begin(), tensors.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return std::tie(a["key"].get_ref<const std::string&>(), a["global_offset"]) <
           std::tie(b["key"].get_ref<const std::string&>(), b["global_offset"]);
  });
  Manifest m;
  m.iteration = iteration;
  m.meta = meta;
  nlohmann::json j = manifest_to_json(m);
  j["tensors"] = std::move(tensors);
  seal_manifest(j);  // last: over every field, meta included
  const std::string manifest_path = tmp_dir + "/" + kManifestFile;
  manifest_from_json(j, manifest_path);  // the merged layout must cover every key exactly once
  fault_point("before_manifest_write");
  write_file_atomic(manifest_path, manifest_text(j), "between_manifest_write_and_rename");
  fault_point("after_manifest_rename");
  std::error_code ec;
  if (fs::exists(final_dir, ec)) fail("refusing to overwrite existing checkpoint {}", final_dir);
  fault_point("before_dir_rename");
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
    fail("cannot rename {} to {}: {}", tmp_dir, final_dir, std::strerror(errno));
  fault_point("after_dir_rename");
  fsync_path(save_dir, /*directory=*/true);
  fault_point("after_parent_fsync");
  write_file_atomic((fs::path(save_dir) / kTrackerFile).string(), std::to_string(iteration) + "\n",
                    "during_latest_update");
  fault_point("after_latest_update");
  // The orphaned iter_N this save superseded (begin_sharded_save moved it aside under this save's token) is no
  // longer needed once the tracker names the new one; a kill before this leaves it to the next start's clean-up.
  const size_t token = tmp_dir.rfind(".tmp-");
  if (token != std::string::npos) {
    std::error_code ec;
    fs::remove_all(final_dir + ".superseded-" + tmp_dir.substr(token + 5), ec);
  }
}

std::vector<std::string> all_gather_strings(comm::Communicator& comm, const std::string& mine) {
  Tensor len = Tensor::empty({1}, DType::I64), lens = Tensor::empty({comm.size()}, DType::I64);
  len.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  comm.all_gather(lens, len).wait();
  int64_t max_len = 0;
  for (int r = 0; r < comm.size(); ++r) max_len = std::max(max_len, lens.data<int64_t>()[r]);
  const int64_t words = (max_len + 3) / 4 + 1;
  Tensor in = Tensor::zeros({words}, DType::I32), out = Tensor::empty({words * comm.size()}, DType::I32);
  std::memcpy(in.raw(), mine.data(), mine.size());
  comm.all_gather(out, in).wait();
  std::vector<std::string> all;
  for (int r = 0; r < comm.size(); ++r)
    all.emplace_back(static_cast<const char*>(out.raw()) + r * words * 4, lens.data<int64_t>()[r]);
  return all;
}

std::string broadcast_string(comm::Communicator& comm, const std::string& s, int root) {
  Tensor len = Tensor::empty({1}, DType::I64);
  len.data<int64_t>()[0] = static_cast<int64_t>(s.size());
  comm.broadcast(len, root).wait();
  const int64_t n = len.data<int64_t>()[0];
  Tensor buf = Tensor::zeros({(n + 3) / 4 + 1}, DType::I32);
  if (comm.rank() == root) std::memcpy(buf.raw(), s.data(), s.size());
  comm.broadcast(buf, root).wait();
  return std::string(static_cast<const char*>(buf.raw()), n);
}

std::string begin_sharded_save(const std::string& save_dir, int64_t iteration, comm::Communicator& world) {
  const int rank = world.rank();
  set_fault_context(iteration, rank);
  fault_point("save_start");
  const std::string final_dir = (fs::path(save_dir) / iteration_dir_name(iteration)).string();
  // 1. Rank 0 creates the staging directory and broadcasts its uuid ("ok:<uuid>") or its error.
  std::string status;
  if (rank == 0) {
    try {
      if (iteration < 0) fail("save: negative iteration {}", iteration);
      std::error_code ec;
      fs::create_directories(save_dir, ec);
      if (ec) fail("cannot create save directory {}: {}", save_dir, ec.message());
      const std::string uuid = random_token();
      if (fs::exists(final_dir, ec)) {
        // A complete iter_N that the tracker never reached (a crash between the directory rename and the
        // tracker update) is moved aside, never overwritten in place; one the tracker points to is kept.
        if (latest_iteration(save_dir) >= iteration)
          fail("refusing to overwrite existing checkpoint {} (remove it or save another iteration)", final_dir);
        const std::string aside = final_dir + ".superseded-" + uuid;
        if (::rename(final_dir.c_str(), aside.c_str()) != 0)
          fail("cannot move uncommitted {} aside to {}: {}", final_dir, aside, std::strerror(errno));
        fsync_path(save_dir, /*directory=*/true);
      }
      if (!fs::create_directory(final_dir + ".tmp-" + uuid, ec) || ec)
        fail("cannot create staging directory {}.tmp-{}: {}", final_dir, uuid, ec ? ec.message() : "exists");
      status = "ok:" + uuid;
    } catch (const Error& e) {
      status = std::string("error:") + e.what();
    }
  }
  status = broadcast_string(world, status, 0);
  fault_point("after_uuid");
  if (status.rfind("ok:", 0) != 0)
    fail("saving checkpoint iteration {} to '{}' failed on rank 0: {}", iteration, save_dir, status.substr(6));
  return final_dir + ".tmp-" + status.substr(3);
}

std::string finish_sharded_save(const std::string& save_dir, const std::string& tmp_dir, int64_t iteration,
                                const nlohmann::json& meta, const RankWriteResult& mine, comm::Communicator& world) {
  const int rank = world.rank();
  set_fault_context(iteration, rank);
  const std::string final_dir = (fs::path(save_dir) / iteration_dir_name(iteration)).string();
  // 3. Vote.
  fault_point("before_vote");
  const std::vector<std::string> votes = all_gather_strings(world, mine.error);
  fault_point("after_vote");
  std::string failed;
  for (int r = 0; r < world.size(); ++r)
    if (!votes[r].empty()) failed += fmt::format("{}rank {}: {}", failed.empty() ? "" : "; ", r, votes[r]);
  if (!failed.empty()) {
    std::error_code ec;
    if (rank == 0) fs::remove_all(tmp_dir, ec);
    // No rank throws before rank 0 has removed the staging directory (a throwing rank may abort the job).
    world.barrier().wait();
    fail("saving checkpoint iteration {} to '{}' failed ({}); the previous checkpoint stays latest", iteration,
         save_dir, failed);
  }
  // 4. Gather the entries, rank 0 commits, everyone learns the outcome.
  fault_point("before_gather_manifest");
  const std::vector<std::string> rank_entries = all_gather_strings(world, mine.entries.dump());
  fault_point("after_gather_manifest");
  std::string commit_error;
  if (rank == 0) {
    try {
      commit_checkpoint(save_dir, tmp_dir, final_dir, iteration, meta, rank_entries);
    } catch (const Error& e) {
      commit_error = e.what();
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);  // gone already when the rename happened
    }
  }
  fault_point("before_final_broadcast");
  commit_error = broadcast_string(world, commit_error, 0);
  if (!commit_error.empty())
    fail("committing checkpoint iteration {} to '{}' failed on rank 0: {}", iteration, save_dir, commit_error);
  fault_point("save_end");
  return final_dir;
}

RankWriteResult write_rank_files_noexcept(const std::string& tmp_dir, int64_t iteration, int rank, int world_size,
                                          const std::vector<ShardedTensor>& shards) noexcept {
  RankWriteResult r;
  try {
    r.entries = write_rank_files(tmp_dir, iteration, rank, world_size, shards);
  } catch (const std::exception& e) {
    r.error = e.what();
    if (r.error.empty()) r.error = "unknown error";
  }
  return r;
}

std::string save_sharded_checkpoint(const std::string& save_dir, int64_t iteration, const nlohmann::json& meta,
                                    const std::vector<ShardedTensor>& shards, comm::Communicator& world) {
  const std::string tmp_dir = begin_sharded_save(save_dir, iteration, world);
  // 2. Every rank writes its files.
  const RankWriteResult mine = write_rank_files_noexcept(tmp_dir, iteration, world.rank(), world.size(), shards);
  return finish_sharded_save(save_dir, tmp_dir, iteration, meta, mine, world);
}

}  // namespace mcpp::dist_checkpointing
