// Single-process checkpoint: save a set of named tensors + JSON meta atomically, read them back by key.
//
// Contract (docs/CHECKPOINT_FORMAT.md is the full description):
//   <save_dir>/iter_0000100/manifest.json          what and where (manifest.h), written last
//   <save_dir>/iter_0000100/model.safetensors      keys not starting with "optimizer."
//   <save_dir>/iter_0000100/optimizer.safetensors  keys "optimizer.*" (only when there are some)
//   <save_dir>/latest_checkpointed_iteration.txt   Megatron's tracker file: the iteration number
// save_checkpoint stages everything in iter_N.tmp-<random>/, fsyncs files and directory, writes the
// manifest last (tmp + fsync + rename), renames the directory to iter_N, fsyncs save_dir and then
// replaces the tracker file (tmp + fsync + rename). It refuses to overwrite a committed iter_N. A crash
// leaves at most a *.tmp-* directory, which readers never look at.
// CheckpointReader parses the manifest (a regular file; its checksum first, manifest.h), reads tensors into
// caller-provided tensors (any device) after checking key, dtype and shape, checks every shard's entry in its
// data file's safetensors header (name, dtype, shape, byte range: swapped or moved entries are refused before a
// byte is used) and verifies the XXH3-64 of the bytes; every failure is an mcpp::Error naming the file and tensor
// key. The tracker and data files are opened as regular files only (a FIFO is refused, never waited on). It reads single-writer (version 1) and sharded (version 2, sharded_save.h)
// checkpoints alike: read_region is the load planner — it intersects the requested rectangle of the
// logical tensor with the saved shards of the key, checks before reading that they cover it exactly
// once, and reads only the shards that intersect (with checksums on, each such shard whole, since
// its XXH3 covers all of its bytes; with checksums off, only the byte span the intersection needs). Tensors in CheckpointContents are CPU tensors (others are copied to host to write).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/core/tensor.h"
#include "mcpp/dist_checkpointing/manifest.h"
#include "mcpp/dist_checkpointing/safetensors.h"

namespace mcpp::dist_checkpointing {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kManifestFile = "manifest.json";

struct NamedTensor {
  std::string key;  // "decoder.layers.0.self_attention.linear_qkv.weight", "optimizer.exp_avg.<key>"
  Tensor tensor;
};

struct CheckpointContents {
  int64_t iteration = 0;
  nlohmann::json meta = nlohmann::json::object();  // config, fingerprint, scheduler, rng, cursor, ...
  std::vector<NamedTensor> tensors;
};

std::string iteration_dir_name(int64_t iteration);  // "iter_0000100" (7 digits, as Megatron)

// Writes <save_dir>/iter_NNNNNNN atomically and updates the tracker; returns the committed directory.
std::string save_checkpoint(const std::string& save_dir, const CheckpointContents& contents);

// The iteration in <load_dir>/latest_checkpointed_iteration.txt, or -1 when the file does not exist.
// A malformed tracker is an mcpp::Error naming it.
int64_t latest_iteration(const std::string& load_dir);

// Committed iterations in save_dir (iter_NNNNNNN directories holding a manifest), ascending;
// staging directories (*.tmp-*) are skipped; a save_dir that does not exist yet gives {}.
std::vector<int64_t> list_iterations(const std::string& save_dir);

// `path` is a checkpoint directory (iter_N/) or a save directory; in the latter case `iteration`
// picks iter_N, or the tracker does when iteration < 0. Returns the checkpoint directory.
std::string resolve_checkpoint_dir(const std::string& path, int64_t iteration = -1);

class CheckpointReader {
 public:
  // See resolve_checkpoint_dir for `path` and `iteration`. Parses and validates the manifest.
  explicit CheckpointReader(const std::string& path, int64_t iteration = -1);

  const std::string& dir() const { return dir_; }
  int64_t iteration() const { return manifest_.iteration; }
  const nlohmann::json& meta() const { return manifest_.meta; }
  const Manifest& manifest() const { return manifest_; }
  bool has(const std::string& key) const { return index_.count(key) != 0; }
  const ManifestEntry& entry(const std::string& key) const;  // the first shard; throws naming the key
  std::vector<const ManifestEntry*> entries(const std::string& key) const;  // every shard of key
  std::vector<std::string> keys() const;  // distinct keys, in manifest order
  // On by default; off (--no-verify-checksums) reads only the bytes a region needs, unchecked.
  void set_verify_checksums(bool on) { verify_checksums_ = on; }
  // Bytes read from data files so far (read amplification = this / bytes delivered).
  uint64_t bytes_read() const { return bytes_read_; }

  // Reads the rectangle `region` of the logical tensor `key` into dst (dtype of the key, shape
  // region.shape, any device). Coverage of the region by the saved shards is checked before reading.
  void read_region(const std::string& key, const Shape& region_offset, const Tensor& dst) const;

  // Reads the tensor `key` into dst's storage (defined; same dtype and shape; any device; a view is
  // fine: Tensor is a handle, so const& still writes the caller's memory), checking the bytes'
  // XXH3-64 against the manifest; on a mismatch dst holds the damaged bytes and an Error is thrown.
  void read_into(const std::string& key, const Tensor& dst) const;
  Tensor read(const std::string& key) const;  // into a fresh CPU tensor
  // Reads every shard of `key` and checks its checksum and its entry in the data file's safetensors
  // header (once per reader: a key that passed is not re-read). Every read checks the header entry too.
  void verify(const std::string& key) const;
  // Entries of the data files' safetensors headers that no manifest entry names ("name (in file)").
  std::vector<std::string> unlisted_header_entries() const;

 private:
  const SafetensorsHeader& header_for(const ManifestEntry& e) const;  // parsed once, then cached
  void check_entry_bytes(const ManifestEntry& e) const;
  // check_sum: reads the whole entry into dst and checks its XXH3; otherwise only the bytes
  // [begin, end) of the entry, into dst + begin.
  void read_bytes(const ManifestEntry& e, void* dst, uint64_t begin, uint64_t end, bool check_sum) const;

  std::string dir_;
  Manifest manifest_;
  std::map<std::string, std::vector<size_t>> index_;  // key -> entries
  std::vector<std::string> key_order_;
  bool verify_checksums_ = true;
  mutable uint64_t bytes_read_ = 0;
  mutable const ManifestEntry* cached_entry_ = nullptr;  // last whole shard read and verified
  mutable std::vector<char> cached_bytes_;
  mutable std::set<std::string> verified_;  // keys whose shards all passed verify()
  mutable std::map<std::string, std::shared_ptr<SafetensorsHeader>> headers_;
};

}  // namespace mcpp::dist_checkpointing
