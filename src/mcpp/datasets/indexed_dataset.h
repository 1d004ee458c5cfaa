// Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.py), byte for byte.
//
// Files: <prefix>.idx and <prefix>.bin.
//   .idx = b"MMIDIDX\x00\x00" (9 bytes) | version u64 LE = 1 | dtype code u8 | sequence_count u64 |
//          document_count u64 (= entries of document_indices = documents + 1) |
//          sequence_lengths  int32[sequence_count]   (starts at byte 34, unaligned)
//          sequence_pointers int64[sequence_count]   (byte offsets into .bin)
//          document_indices  int64[document_count]   (0, then the sequence count after each document)
//   .bin = the tokens of all sequences, concatenated, in the dtype of the code.
// A "sequence" is what Megatron's IndexedDataset[i] returns; a document is a run of sequences. Our
// preprocess writes one sequence per document, as Megatron's preprocess_data.py does without
// --split-sentences. (Multimodal sequence_modes are not supported: they are written only with
// multimodal=True, which GPT pretraining never uses.)
//
// Reader: both files are mmap'ed read-only; tokens are read in place (zero copy) and converted on the
// way out to int32/int64. The index arrays are unaligned in the file, so they are read through
// memcpy accessors, never through casted pointers. open() validates everything a later read relies
// on (magic, version, dtype code, array extents, every sequence inside .bin, document indices
// non-decreasing and ending at sequence_count); any problem is an mcpp::Error naming the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace mcpp {

// Megatron's DType codes.
enum class IndexedDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };

bool indexed_dtype_valid(uint8_t code);
size_t indexed_dtype_size(IndexedDType t);
const char* indexed_dtype_name(IndexedDType t);  // numpy spelling: "uint16", "int32", ...
// DType.optimal_dtype: uint16 when the vocabulary (cardinality) is < 65500, else int32.
IndexedDType optimal_indexed_dtype(int64_t vocab_size);

inline std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
inline std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

class IndexedDataset {
 public:
  // Opens <prefix>.idx and <prefix>.bin. Throws mcpp::Error naming the file and the problem.
  static IndexedDataset open(const std::string& prefix);
  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  ~IndexedDataset();

  const std::string& prefix() const { return prefix_; }
  IndexedDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_entries_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }  // sum of sequence lengths

  int32_t sequence_length(int64_t i) const;   // i in [0, num_sequences)
  int64_t sequence_pointer(int64_t i) const;  // byte offset into .bin
  int64_t document_index(int64_t j) const;    // j in [0, num_documents] (document_count entries)
  std::vector<int32_t> sequence_lengths() const;  // a copy, [num_sequences]

  // Zero-copy view of sequence i's bytes in .bin: [sequence_length(i) * itemsize] bytes (unaligned
  // when the file's pointers are not multiples of the itemsize).
  std::span<const std::byte> sequence_bytes(int64_t i) const;

  // Tokens [offset, offset + length) of sequence i converted into out[length]; like Megatron's
  // get(idx, offset, length). Throws when the range is outside the sequence.
  void read(int64_t i, int64_t offset, int64_t length, int32_t* out) const;
  void read(int64_t i, int64_t offset, int64_t length, int64_t* out) const;
  std::vector<int32_t> get(int64_t i) const;  // the whole sequence as int32

 private:
  IndexedDataset() = default;
  template <typename T>
  void read_as(int64_t i, int64_t offset, int64_t length, T* out) const;
  void check_sequence(int64_t i) const;

  struct Mapping;
  std::string prefix_;
  std::unique_ptr<Mapping> idx_, bin_;
  IndexedDType dtype_ = IndexedDType::U16;
  int64_t num_sequences_ = 0, num_doc_entries_ = 0, num_tokens_ = 0;
  const std::byte* lengths_ = nullptr;   // int32[num_sequences], unaligned
  const std::byte* pointers_ = nullptr;  // int64[num_sequences], unaligned
  const std::byte* doc_idx_ = nullptr;   // int64[num_doc_entries], unaligned
};

// Writes <prefix>.bin while sequences arrive and <prefix>.idx at finalize(); the mirror of Megatron's
// IndexedDatasetBuilder (add_item / end_document / add_document / finalize). A token that does not fit
// the dtype is an mcpp::Error (Megatron would wrap it silently).
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(const std::string& bin_file, IndexedDType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  void add_item(std::span<const int32_t> tokens);  // one sequence
  void add_item(std::span<const int64_t> tokens);
  void end_document();  // closes the current document (may be empty, as in Megatron)
  // A whole document of several sequences: tokens concatenated, lengths per sequence.
  void add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths);
  void finalize(const std::string& idx_file);  // flushes .bin, writes .idx

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t bytes_written() const { return num_tokens_ * static_cast<int64_t>(indexed_dtype_size(dtype_)); }

 private:
  template <typename T>
  void append(std::span<const T> tokens);

  std::string bin_file_;
  std::FILE* bin_ = nullptr;
  IndexedDType dtype_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
  std::vector<std::byte> buf_;
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace mcpp
