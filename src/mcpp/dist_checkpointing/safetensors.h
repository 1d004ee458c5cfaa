// safetensors container: write and read the format of huggingface/safetensors.
//
// Contract: a file is [u64 little-endian N][N bytes of JSON header][data]. The header maps each tensor
// name to {"dtype": "F32"|"BF16"|..., "shape": [...], "data_offsets": [begin, end]} with offsets
// relative to the start of the data section (byte 8 + N); "__metadata__" is a string->string map.
// The writer pads the header with spaces so 8 + N is a multiple of 8 (as safetensors does) and lays
// the tensors out back to back in the order given, so the file passes safetensors' own validation
// (offsets contiguous, covering the whole data section). The reader validates everything it parses
// (header length vs file size, dtype, shape, offsets in range, byte length = numel * dtype size, no
// overlaps) and throws mcpp::Error naming the file and tensor. Tensors are little-endian row-major.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp::dist_checkpointing {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_str;    // as written in the header ("F32", "BF16", "BOOL", ...)
  bool dtype_known = false;  // dtype_str is one of ours (F32, BF16, F16, I32, I64)
  DType dtype = DType::F32;  // valid when dtype_known
  Shape shape;
  uint64_t begin = 0;  // relative to the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::string path;
  uint64_t header_len = 0;  // N
  uint64_t data_start = 0;  // 8 + N: absolute file offset of the data section
  uint64_t file_size = 0;
  std::vector<SafetensorsEntry> entries;  // sorted by begin
  std::map<std::string, std::string> metadata;
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
};

// Parses and validates the header of `path`. Throws mcpp::Error naming the file (and tensor).
SafetensorsHeader read_safetensors_header(const std::string& path);

struct SafetensorsItem {
  std::string name;
  Tensor tensor;  // any device; copied to host for writing
};

struct WrittenTensor {
  std::string name;
  uint64_t byte_offset = 0;  // absolute offset in the file
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;         // XXH3-64 of the tensor's bytes
};

// Writes `items` (names unique, not "__metadata__") to `path` (created or truncated), fsyncs it when
// `fsync_file` is set. Returns, per item in order, where its bytes went and their checksum.
std::vector<WrittenTensor> write_safetensors(const std::string& path,
                                             const std::vector<SafetensorsItem>& items,
                                             const std::map<std::string, std::string>& metadata,
                                             bool fsync_file);

// Reads one tensor of a parsed file into a fresh CPU tensor of its own dtype (must be one of ours).
Tensor read_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& entry);

// Low-level helpers shared with the checkpoint reader.
// Reads exactly `length` bytes at absolute `offset` of `path` into dst; a short file is an error
// that names `path` and `what` (e.g. "tensor 'x'").
void pread_exact(const std::string& path, uint64_t offset, uint64_t length, void* dst,
                 const std::string& what);
uint64_t xxh3_bytes(const void* data, size_t length);
std::string xxh3_hex(uint64_t h);  // 16 lowercase hex digits

}  // namespace mcpp::dist_checkpointing
