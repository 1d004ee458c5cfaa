// manifest.json of a checkpoint directory: what each saved tensor is and where its bytes are.
//
// Contract (docs/CHECKPOINT_FORMAT.md is the full description):
//   {"format": "mcpp-checkpoint", "format_version": 1, "iteration": N, "meta": {...},
//    "tensors": [{"key", "dtype", "global_shape", "global_offset", "local_shape", "file",
//                 "byte_offset", "byte_length", "xxh3"}, ...]}
// byte_offset is absolute in `file` (a plain file name inside the checkpoint directory); xxh3 is the
// XXH3-64 of the tensor's byte_length bytes as 16 lowercase hex digits. parse_manifest validates every
// field's type and the internal consistency (byte_length = numel(local_shape) * dtype size, offsets +
// local shape within the global shape, no duplicate (key, offset)) and names the manifest file and
// tensor key in its errors. Format version 1 (single-process saver) has one entry per key with
// global_offset all zeros and local_shape == global_shape; version 2 (sharded saver) has any number of
// entries per key; version 3 (this build writes it, single-writer and sharded) is version 2 plus the
// manifest checksum. All three are read. For every key the parser also checks the shard layout: all entries
// agree on dtype and global_shape, no two entries overlap, and together they cover every element of
// the global shape exactly once (sum of local numels == global numel with no overlap); and no two entries of
// one file alias the same bytes.
// Checksum (version 3): "manifest_field_xxh3" maps every field path — objects split down to depth 3
// ("format", "iteration", "meta.consumed_train_samples", "meta.optimizer.step", "meta.config.model"),
// arrays at depth <= 2 split into elements ("tensors[12]") — to the XXH3-64 of the value's compact dump
// (nlohmann: sorted keys, shortest round-trip numbers); "manifest_xxh3" is the XXH3-64 of that map's compact
// dump. Both are computed last, over everything else, and written as the file's last fields; the parser
// checks them before any field is used and names the fields whose value changed. read_manifest reads only a
// regular file (a FIFO is refused, not waited on) of at most kManifestMaxBytes, nesting at most kMaxJsonDepth.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/core/tensor.h"

namespace mcpp::dist_checkpointing {

inline constexpr int kManifestFormatVersion = 3;
inline constexpr int kManifestMinFormatVersion = 1;
inline constexpr const char* kManifestFormatName = "mcpp-checkpoint";
inline constexpr const char* kManifestChecksumField = "manifest_xxh3";
inline constexpr const char* kManifestFieldChecksumsField = "manifest_field_xxh3";
inline constexpr uint64_t kManifestMaxBytes = uint64_t{1} << 30;

struct ManifestEntry {
  std::string key;
  DType dtype = DType::F32;
  Shape global_shape;
  Shape global_offset;  // same rank as global_shape
  Shape local_shape;
  std::string file;     // relative to the checkpoint directory
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;
  bool is_whole() const;  // offset all zero and local == global
};

// The tensor's name inside its safetensors file: the key for a whole tensor, else
// "<key>@<offset0>,<offset1>,..." (unique per file because shards of a key never overlap).
std::string shard_entry_name(const std::string& key, const Shape& global_offset, bool whole);
inline std::string shard_entry_name(const ManifestEntry& e) {
  return shard_entry_name(e.key, e.global_offset, e.is_whole());
}

struct Manifest {
  int format_version = kManifestFormatVersion;  // 1: single-writer layout; 2: sharded; 3: 2 + manifest checksum
  int64_t iteration = 0;
  nlohmann::json meta = nlohmann::json::object();
  std::vector<ManifestEntry> tensors;
  const ManifestEntry* find(const std::string& key) const;  // first entry with key, or nullptr
};

// Checks the shard layout of every key (see the contract); errors name `path`, the key and the files.
void validate_shard_layout(const Manifest& m, const std::string& path);

// Without the checksum fields (seal_manifest adds them).
nlohmann::json manifest_to_json(const Manifest& m);
// Adds (or replaces) manifest_field_xxh3 and manifest_xxh3 over every other field of j.
void seal_manifest(nlohmann::json& j);
// The file's text: j's fields (indent 1), then the checksum fields last. j must be sealed.
std::string manifest_text(const nlohmann::json& sealed);
// `path` only names the source in errors. Checks the checksum first (version 3, or any manifest carrying one).
Manifest manifest_from_json(const nlohmann::json& j, const std::string& path);
// Reads and parses `path`; a missing file or bad JSON is an mcpp::Error naming it.
Manifest read_manifest(const std::string& path);

}  // namespace mcpp::dist_checkpointing
