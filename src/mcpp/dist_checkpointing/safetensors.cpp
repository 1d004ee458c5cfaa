// safetensors container: see safetensors.h for the format and the checks.
#include "mcpp/dist_checkpointing/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/dist_checkpointing/fault_injection.h"

namespace mcpp::dist_checkpointing {
namespace {

constexpr uint64_t kMaxHeaderLen = 100ull << 20;  // safetensors' own limit (100 MB)

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool known_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},
      {"I32", DType::I32}, {"I64", DType::I64}};
  for (const auto& [name, dt] : kTable) {
    if (s == name) {
      *out = dt;
      return true;
    }
  }
  return false;
}

// Element size of every safetensors dtype (also the ones we do not compute with), 0 if unknown.
size_t safetensors_dtype_size(const std::string& s) {
  if (s == "F64" || s == "I64" || s == "U64") return 8;
  if (s == "F32" || s == "I32" || s == "U32") return 4;
  if (s == "F16" || s == "BF16" || s == "I16" || s == "U16") return 2;
  if (s == "BOOL" || s == "U8" || s == "I8" || s == "F8_E4M3" || s == "F8_E5M2") return 1;
  return 0;
}

void write_all(int fd, const void* data, size_t length, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (length > 0) {
    ssize_t n = ::write(fd, p, std::min<size_t>(length, 1u << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write {}: {}", path, std::strerror(errno));
    }
    p += n;
    length -= static_cast<size_t>(n);
  }
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name,
                             const nlohmann::json& v, uint64_t data_len) {
  SafetensorsEntry e;
  e.name = name;
  if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
      !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2) {
    fail("{}: tensor '{}' header entry needs dtype (string), shape (array), data_offsets ([begin, "
         "end])",
         path, name);
  }
  e.dtype_str = v["dtype"].get<std::string>();
  e.dtype_known = known_dtype(e.dtype_str, &e.dtype);
  size_t esize = safetensors_dtype_size(e.dtype_str);
  if (esize == 0) fail("{}: tensor '{}' has unknown dtype '{}'", path, name, e.dtype_str);
  uint64_t numel = 1;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned()) fail("{}: tensor '{}' shape has a non-integer entry", path, name);
    uint64_t dim = d.get<uint64_t>();
    if (dim > (1ull << 48) || (dim && numel > (1ull << 48) / dim))
      fail("{}: tensor '{}' shape is too large", path, name);
    numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  for (const auto& o : v["data_offsets"])
    if (!o.is_number_unsigned()) fail("{}: tensor '{}' data_offsets are not integers", path, name);
  e.begin = v["data_offsets"][0].get<uint64_t>();
  e.end = v["data_offsets"][1].get<uint64_t>();
  if (e.begin > e.end) fail("{}: tensor '{}' data_offsets [{}, {}] are reversed", path, name, e.begin, e.end);
  if (e.end > data_len) {
    fail("{} is truncated or damaged: tensor '{}' data_offsets [{}, {}] run past the data section ({} "
         "bytes)",
         path, name, e.begin, e.end, data_len);
  }
  if (e.end - e.begin != numel * esize) {
    fail("{}: tensor '{}' data_offsets span {} bytes but shape {} of {} needs {}", path, name,
         e.end - e.begin, shape_str(e.shape), e.dtype_str, numel * esize);
  }
  return e;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

uint64_t xxh3_bytes(const void* data, size_t length) { return XXH3_64bits(data, length); }

std::string xxh3_hex(uint64_t h) { return fmt::format("{:016x}", h); }

void pread_exact(const std::string& path, uint64_t offset, uint64_t length, void* dst,
                 const std::string& what) {
  const FileDescriptor f = open_regular_file(path, "data file");  // a FIFO is refused, not waited on
  char* p = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(f.get(), p + done, std::min<uint64_t>(length - done, 1u << 30),
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read {} ({}): {}", path, what, std::strerror(errno));
    }
    if (n == 0) {
      fail("{} is truncated: {} needs bytes [{}, {}) but the file ends at byte {}", path, what,
           offset, offset + length, offset + done);
    }
    done += static_cast<uint64_t>(n);
  }
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  SafetensorsHeader h;
  h.path = path;
  h.file_size = open_regular_file(path, "safetensors file").size();
  if (h.file_size < 8) fail("{} is truncated: {} bytes, no safetensors header length", path, h.file_size);
  unsigned char len_bytes[8];
  pread_exact(path, 0, 8, len_bytes, "the header length");
  for (int i = 7; i >= 0; --i) h.header_len = (h.header_len << 8) | len_bytes[i];
  if (h.header_len > kMaxHeaderLen) fail("{}: header length {} exceeds 100 MB", path, h.header_len);
  if (8 + h.header_len > h.file_size) {
    fail("{} is truncated: header needs {} bytes but the file has {}", path, 8 + h.header_len,
         h.file_size);
  }
  h.data_start = 8 + h.header_len;
  std::string text(h.header_len, '\0');
  pread_exact(path, 8, h.header_len, text.data(), "the header");
  const nlohmann::json j =
      parse_json_limited(text, fmt::format("{}: safetensors header", path), {.max_bytes = kMaxHeaderLen});
  if (!j.is_object()) fail("{}: safetensors header is not a JSON object", path);
  uint64_t data_len = h.file_size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) fail("{}: __metadata__ is not an object", path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) fail("{}: __metadata__ value '{}' is not a string", path, m.key());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(path, it.key(), it.value(), data_len));
  }
  std::sort(h.entries.begin(), h.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  for (size_t i = 1; i < h.entries.size(); ++i) {
    const auto& a = h.entries[i - 1];
    const auto& b = h.entries[i];
    if (b.begin < a.end && b.end > b.begin && a.end > a.begin)
      fail("{}: tensors '{}' and '{}' overlap", path, a.name, b.name);
  }
  return h;
}

std::vector<WrittenTensor> write_safetensors(const std::string& path,
                                             const std::vector<SafetensorsItem>& items,
                                             const std::map<std::string, std::string>& metadata,
                                             bool fsync_file) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<WrittenTensor> out;
  uint64_t offset = 0;
  for (const auto& it : items) {
    if (it.name.empty() || it.name == "__metadata__") fail("{}: invalid tensor name '{}'", path, it.name);
    if (header.contains(it.name)) fail("{}: duplicate tensor name '{}'", path, it.name);
    if (!it.tensor.defined()) fail("{}: tensor '{}' is undefined", path, it.name);
    uint64_t n = it.tensor.nbytes();
    header[it.name] = {{"dtype", std::string(dtype_safetensors_name(it.tensor.dtype()))},
                       {"shape", it.tensor.shape()},
                       {"data_offsets", {offset, offset + n}}};
    out.push_back({it.name, 0, n, 0});
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  uint64_t data_start = 8 + text.size();
  for (auto& w : out) {
    w.byte_offset = data_start + (header[w.name]["data_offsets"][0].get<uint64_t>());
  }

  Fd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) fail("cannot create {}: {}", path, std::strerror(errno));
  unsigned char len_bytes[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  write_all(f.fd, len_bytes, 8, path);
  write_all(f.fd, text.data(), text.size(), path);
  fault_point("mid_file");  // header written, data not yet (kill tests)
  for (size_t i = 0; i < items.size(); ++i) {
    Tensor host = items[i].tensor.is_cpu() ? items[i].tensor : items[i].tensor.to(Device::CPU);
    out[i].xxh3 = xxh3_bytes(host.raw(), host.nbytes());
    write_all(f.fd, host.raw(), host.nbytes(), path);
  }
  if (fsync_file && ::fsync(f.fd) != 0) fail("cannot fsync {}: {}", path, std::strerror(errno));
  int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) fail("cannot close {}: {}", path, std::strerror(errno));
  return out;
}

Tensor read_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& entry) {
  if (!entry.dtype_known) {
    fail("{}: tensor '{}' has dtype {}, which mcpp does not compute with", header.path, entry.name,
         entry.dtype_str);
  }
  Tensor t = Tensor::empty(entry.shape, entry.dtype, Device::CPU);
  pread_exact(header.path, header.data_start + entry.begin, entry.end - entry.begin, t.raw(),
              fmt::format("tensor '{}'", entry.name));
  return t;
}

}  // namespace mcpp::dist_checkpointing
