// Megatron indexed dataset reader (mmap) and writer; layout and contract in indexed_dataset.h.
#include "mcpp/datasets/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>

#include "mcpp/core/error.h"
#include "mcpp/core/regular_file.h"

namespace mcpp {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // = 34: arrays start here
constexpr uint64_t kVersion = 1;

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void put(std::vector<std::byte>& out, T v) {
  const auto* b = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), b, b + sizeof(T));
}

// Token range of each dtype (floats: the int range they represent exactly is not checked).
bool fits(IndexedDType t, int64_t v) {
  switch (t) {
    case IndexedDType::U8: return v >= 0 && v <= 255;
    case IndexedDType::I8: return v >= -128 && v <= 127;
    case IndexedDType::I16: return v >= -32768 && v <= 32767;
    case IndexedDType::U16: return v >= 0 && v <= 65535;
    case IndexedDType::I32: return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    case IndexedDType::I64: case IndexedDType::F64: case IndexedDType::F32: return true;
  }
  return false;
}

// Store v as dtype t at dst (little-endian host).
void store_token(IndexedDType t, int64_t v, std::byte* dst) {
  switch (t) {
    case IndexedDType::U8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(dst, &x, 1); return; }
    case IndexedDType::I8: { int8_t x = static_cast<int8_t>(v); std::memcpy(dst, &x, 1); return; }
    case IndexedDType::I16: { int16_t x = static_cast<int16_t>(v); std::memcpy(dst, &x, 2); return; }
    case IndexedDType::U16: { uint16_t x = static_cast<uint16_t>(v); std::memcpy(dst, &x, 2); return; }
    case IndexedDType::I32: { int32_t x = static_cast<int32_t>(v); std::memcpy(dst, &x, 4); return; }
    case IndexedDType::I64: { std::memcpy(dst, &v, 8); return; }
    case IndexedDType::F64: { double x = static_cast<double>(v); std::memcpy(dst, &x, 8); return; }
    case IndexedDType::F32: { float x = static_cast<float>(v); std::memcpy(dst, &x, 4); return; }
  }
}

// Integer sources convert modulo 2^bits (C++20); float sources go through a clamped int64 first, so
// a NaN or huge value in a corrupt file gives a defined (wrong) token, never undefined behaviour.
template <typename Src, typename T>
void convert(const std::byte* src, int64_t n, T* out) {
  for (int64_t k = 0; k < n; ++k) {
    const Src v = load<Src>(src + k * sizeof(Src));
    if constexpr (std::is_floating_point_v<Src>) {
      const double d = static_cast<double>(v);
      const int64_t i = !(d == d) ? 0 : d >= 9.2e18 ? std::numeric_limits<int64_t>::max()
                                    : d <= -9.2e18 ? std::numeric_limits<int64_t>::min()
                                                   : static_cast<int64_t>(d);
      out[k] = static_cast<T>(i);
    } else {
      out[k] = static_cast<T>(v);
    }
  }
}

}  // namespace

bool indexed_dtype_valid(uint8_t code) { return code >= 1 && code <= 8; }

size_t indexed_dtype_size(IndexedDType t) {
  switch (t) {
    case IndexedDType::U8: case IndexedDType::I8: return 1;
    case IndexedDType::I16: case IndexedDType::U16: return 2;
    case IndexedDType::I32: case IndexedDType::F32: return 4;
    case IndexedDType::I64: case IndexedDType::F64: return 8;
  }
  return 0;
}

const char* indexed_dtype_name(IndexedDType t) {
  switch (t) {
    case IndexedDType::U8: return "uint8";
    case IndexedDType::I8: return "int8";
    case IndexedDType::I16: return "int16";
    case IndexedDType::I32: return "int32";
    case IndexedDType::I64: return "int64";
    case IndexedDType::F64: return "float64";
    case IndexedDType::F32: return "float32";
    case IndexedDType::U16: return "uint16";
  }
  return "?";
}

IndexedDType optimal_indexed_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::U16 : IndexedDType::I32;
}

// ---- read-only mmap of a whole file
struct IndexedDataset::Mapping {
  std::string path;
  const std::byte* data = nullptr;
  int64_t size = 0;

  explicit Mapping(const std::string& p) : path(p) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO opens at once (then is refused)
    if (fd < 0) fail("cannot open indexed dataset file {}: {}", p, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      fail("cannot stat {}: {}", p, std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("indexed dataset file {} is a {}, not a regular file", p, file_kind_name(st.st_mode));
    }
    size = static_cast<int64_t>(st.st_size);
    if (size > 0) {
      void* m = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        int e = errno;
        ::close(fd);
        fail("cannot mmap {}: {}", p, std::strerror(e));
      }
      data = static_cast<const std::byte*>(m);
    }
    ::close(fd);  // the mapping stays valid
  }
  ~Mapping() {
    if (data) ::munmap(const_cast<std::byte*>(data), static_cast<size_t>(size));
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

IndexedDataset::IndexedDataset(IndexedDataset&&) noexcept = default;
IndexedDataset& IndexedDataset::operator=(IndexedDataset&&) noexcept = default;
IndexedDataset::~IndexedDataset() = default;

IndexedDataset IndexedDataset::open(const std::string& prefix) {
  IndexedDataset ds;
  ds.prefix_ = prefix;
  ds.idx_ = std::make_unique<Mapping>(idx_path(prefix));
  const std::string& ip = ds.idx_->path;
  const std::byte* p = ds.idx_->data;
  const int64_t isz = ds.idx_->size;

  if (isz < 9) fail("{}: truncated index header ({} bytes, the header has {})", ip, isz, kHeaderBytes);
  if (std::memcmp(p, kMagic, 9) != 0)
    fail("{}: bad magic (not a Megatron indexed dataset index; expected \"MMIDIDX\\x00\\x00\")", ip);
  if (isz < kHeaderBytes) fail("{}: truncated index header ({} bytes, the header has {})", ip, isz, kHeaderBytes);
  const auto version = load<uint64_t>(p + 9);
  if (version != kVersion) fail("{}: unsupported index version {} (expected {})", ip, version, kVersion);
  const auto code = load<uint8_t>(p + 17);
  if (!indexed_dtype_valid(code)) fail("{}: unknown dtype code {} (valid codes are 1..8)", ip, code);
  ds.dtype_ = static_cast<IndexedDType>(code);
  const auto seq_count = load<uint64_t>(p + 18);
  const auto doc_count = load<uint64_t>(p + 26);

  // Extents, guarded against overflow: each count must fit in what the file could hold.
  const auto avail = static_cast<uint64_t>(isz - kHeaderBytes);
  if (seq_count > avail / 12 || doc_count > avail / 8 || seq_count * 12 + doc_count * 8 > avail)
    fail("{}: truncated index: {} sequences and {} document indices (12 and 8 bytes each) do not fit in "
         "the {} bytes after the header", ip, seq_count, doc_count, avail);
  ds.num_sequences_ = static_cast<int64_t>(seq_count);
  ds.num_doc_entries_ = static_cast<int64_t>(doc_count);
  ds.lengths_ = p + kHeaderBytes;
  ds.pointers_ = ds.lengths_ + 4 * seq_count;
  ds.doc_idx_ = ds.pointers_ + 8 * seq_count;

  if (doc_count == 0) fail("{}: document indices are empty (expected at least the leading 0)", ip);
  if (ds.document_index(0) != 0) fail("{}: document indices start at {} (expected 0)", ip, ds.document_index(0));
  for (int64_t j = 1; j < ds.num_doc_entries_; ++j) {
    const int64_t a = ds.document_index(j - 1), b = ds.document_index(j);
    if (b < a) fail("{}: document indices are not monotonic: entry {} is {} after {}", ip, j, b, a);
    if (b > ds.num_sequences_)
      fail("{}: document index entry {} is {}, past the {} sequences", ip, j, b, ds.num_sequences_);
  }

  ds.bin_ = std::make_unique<Mapping>(bin_path(prefix));
  const int64_t item = static_cast<int64_t>(indexed_dtype_size(ds.dtype_));
  int64_t tokens = 0;
  for (int64_t i = 0; i < ds.num_sequences_; ++i) {
    const int32_t len = ds.sequence_length(i);
    const int64_t ptr = ds.sequence_pointer(i);
    if (len < 0) fail("{}: sequence {} has negative length {}", ip, i, len);
    if (ptr < 0 || ptr > ds.bin_->size || (ds.bin_->size - ptr) / item < len)
      fail("{}: file is shorter than the index says: sequence {} starts at byte {} with {} tokens of {} "
           "bytes, the file has {} bytes", ds.bin_->path, i, ptr, len, item, ds.bin_->size);
    tokens += len;
  }
  ds.num_tokens_ = tokens;
  return ds;
}

int32_t IndexedDataset::sequence_length(int64_t i) const { return load<int32_t>(lengths_ + 4 * i); }
int64_t IndexedDataset::sequence_pointer(int64_t i) const { return load<int64_t>(pointers_ + 8 * i); }
int64_t IndexedDataset::document_index(int64_t j) const { return load<int64_t>(doc_idx_ + 8 * j); }

std::vector<int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<int32_t> out(static_cast<size_t>(num_sequences_));
  if (num_sequences_ > 0) std::memcpy(out.data(), lengths_, 4 * out.size());
  return out;
}

void IndexedDataset::check_sequence(int64_t i) const {
  if (i < 0 || i >= num_sequences_)
    fail("{}: sequence {} out of range (the dataset has {})", idx_path(prefix_), i, num_sequences_);
}

std::span<const std::byte> IndexedDataset::sequence_bytes(int64_t i) const {
  check_sequence(i);
  const size_t n = static_cast<size_t>(sequence_length(i)) * indexed_dtype_size(dtype_);
  if (n == 0) return {};
  return {bin_->data + sequence_pointer(i), n};
}

template <typename T>
void IndexedDataset::read_as(int64_t i, int64_t offset, int64_t length, T* out) const {
  check_sequence(i);
  const int64_t len = sequence_length(i);
  if (offset < 0 || length < 0 || offset > len || length > len - offset)
    fail("{}: read of tokens [{}, {}) outside sequence {} of length {}", bin_path(prefix_), offset,
         offset + length, i, len);
  if (length == 0) return;
  const std::byte* src = bin_->data + sequence_pointer(i) + offset * static_cast<int64_t>(indexed_dtype_size(dtype_));
  switch (dtype_) {
    case IndexedDType::U8: convert<uint8_t>(src, length, out); return;
    case IndexedDType::I8: convert<int8_t>(src, length, out); return;
    case IndexedDType::I16: convert<int16_t>(src, length, out); return;
    case IndexedDType::U16: convert<uint16_t>(src, length, out); return;
    case IndexedDType::I32: convert<int32_t>(src, length, out); return;
    case IndexedDType::I64: convert<int64_t>(src, length, out); return;
    case IndexedDType::F64: convert<double>(src, length, out); return;
    case IndexedDType::F32: convert<float>(src, length, out); return;
  }
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int32_t* out) const {
  read_as(i, offset, length, out);
}
void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int64_t* out) const {
  read_as(i, offset, length, out);
}

std::vector<int32_t> IndexedDataset::get(int64_t i) const {
  check_sequence(i);
  std::vector<int32_t> out(static_cast<size_t>(sequence_length(i)));
  read_as(i, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

// ---- writer

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& bin_file, IndexedDType dtype)
    : bin_file_(bin_file), dtype_(dtype) {
  if (!indexed_dtype_valid(static_cast<uint8_t>(dtype))) fail("{}: invalid dtype code {}", bin_file, static_cast<int>(dtype));
  bin_ = std::fopen(bin_file.c_str(), "wb");
  if (!bin_) fail("cannot create {}: {}", bin_file, std::strerror(errno));
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
}

template <typename T>
void IndexedDatasetBuilder::append(std::span<const T> tokens) {
  if (finalized_) fail("{}: add_item after finalize", bin_file_);
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("{}: sequence of {} tokens exceeds the int32 length field", bin_file_, tokens.size());
  const size_t item = indexed_dtype_size(dtype_);
  buf_.resize(tokens.size() * item);
  for (size_t k = 0; k < tokens.size(); ++k) {
    const auto v = static_cast<int64_t>(tokens[k]);
    if (!fits(dtype_, v))
      fail("{}: token {} (position {} of sequence {}) does not fit dtype {}", bin_file_, v, k, lengths_.size(),
           indexed_dtype_name(dtype_));
    store_token(dtype_, v, buf_.data() + k * item);
  }
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), bin_) != buf_.size())
    fail("write to {} failed: {}", bin_file_, std::strerror(errno));
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) { append(tokens); }
void IndexedDatasetBuilder::add_item(std::span<const int64_t> tokens) { append(tokens); }

void IndexedDatasetBuilder::end_document() { doc_indices_.push_back(static_cast<int64_t>(lengths_.size())); }

void IndexedDatasetBuilder::add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths) {
  size_t at = 0;
  for (int32_t len : lengths) {
    if (len < 0 || static_cast<size_t>(len) > tokens.size() - at)
      fail("{}: add_document lengths sum past the {} tokens given", bin_file_, tokens.size());
    append(tokens.subspan(at, static_cast<size_t>(len)));
    at += static_cast<size_t>(len);
  }
  if (at != tokens.size())
    fail("{}: add_document lengths sum to {} but {} tokens were given", bin_file_, at, tokens.size());
  end_document();
}

void IndexedDatasetBuilder::finalize(const std::string& idx_file) {
  if (finalized_) fail("{}: finalize called twice", bin_file_);
  finalized_ = true;
  const int close_rc = std::fclose(bin_);
  bin_ = nullptr;
  if (close_rc != 0) fail("closing {} failed: {}", bin_file_, std::strerror(errno));

  std::vector<std::byte> out;
  out.reserve(static_cast<size_t>(kHeaderBytes) + lengths_.size() * 12 + doc_indices_.size() * 8);
  for (char c : kMagic) out.push_back(static_cast<std::byte>(c));
  put<uint64_t>(out, kVersion);
  put<uint8_t>(out, static_cast<uint8_t>(dtype_));
  put<uint64_t>(out, lengths_.size());
  put<uint64_t>(out, doc_indices_.size());
  for (int32_t len : lengths_) put<int32_t>(out, len);
  int64_t ptr = 0;  // exclusive prefix sum of lengths, in bytes
  const auto item = static_cast<int64_t>(indexed_dtype_size(dtype_));
  for (int32_t len : lengths_) {
    put<int64_t>(out, ptr);
    ptr += static_cast<int64_t>(len) * item;
  }
  for (int64_t d : doc_indices_) put<int64_t>(out, d);

  std::FILE* f = std::fopen(idx_file.c_str(), "wb");
  if (!f) fail("cannot create {}: {}", idx_file, std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const int rc = std::fclose(f);
  if (!ok || rc != 0) fail("write to {} failed: {}", idx_file, std::strerror(errno));
}

}  // namespace mcpp
