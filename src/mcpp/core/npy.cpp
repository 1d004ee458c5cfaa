#include "mcpp/core/npy.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "mcpp/core/error.h"

namespace mcpp {
namespace {
const char kMagic[] = "\x93NUMPY";

std::string descr(DType t) {
  switch (t) {
    case DType::F32: return "<f4";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::F16: return "<f2";
    default: fail("save_npy: dtype {} has no numpy equivalent", dtype_name(t));
  }
}
}  // namespace

NpyWriter::NpyWriter(const std::string& path, const Shape& shape, DType dtype)
    : path_(path), dtype_(dtype), remaining_(static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype)) {
  std::string dims = "(";
  for (size_t i = 0; i < shape.size(); ++i) dims += fmt::format("{},{}", shape[i], i + 1 < shape.size() ? " " : "");
  if (shape.size() > 1) dims.pop_back();
  dims += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr(dtype), dims);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  out_.open(path, std::ios::binary | std::ios::trunc);
  if (!out_) fail("cannot write '{}'", path);
  out_.write(kMagic, 6);
  const char ver[2] = {1, 0};
  out_.write(ver, 2);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  out_.write(reinterpret_cast<const char*>(&hlen), 2);
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (!out_) fail("write failed for '{}'", path);
}

void NpyWriter::append(const Tensor& t) {
  Tensor c = t.is_cpu() ? t : t.to(Device::CPU);
  if (c.dtype() != dtype_) fail("'{}': appending {} to a {} array", path_, dtype_name(c.dtype()), dtype_name(dtype_));
  if (c.nbytes() > remaining_) fail("'{}': appending {} bytes past the array's end", path_, c.nbytes());
  out_.write(static_cast<const char*>(c.raw()), static_cast<std::streamsize>(c.nbytes()));
  if (!out_) fail("write failed for '{}'", path_);
  remaining_ -= c.nbytes();
}

void NpyWriter::close() {
  if (remaining_ != 0) fail("'{}': {} bytes of the array were never written", path_, remaining_);
  out_.close();
  if (!out_) fail("write failed for '{}'", path_);
}

void save_npy(const std::string& path, const Tensor& t) {
  NpyWriter w(path, t.shape(), t.dtype());
  w.append(t);
  w.close();
}

Tensor load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '{}'", path);
  char magic[8];
  uint16_t hlen = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, kMagic, 6) != 0 || magic[6] != 1) fail("'{}' is not a .npy v1 file", path);
  f.read(reinterpret_cast<char*>(&hlen), 2);
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) fail("'{}': truncated header", path);
  auto field = [&](const std::string& key) {
    size_t p = header.find(key);
    if (p == std::string::npos) fail("'{}': header lacks {}", path, key);
    return p + key.size();
  };
  size_t dp = field("'descr': '");
  std::string d = header.substr(dp, header.find('\'', dp) - dp);
  DType dt = d == "<f4" ? DType::F32 : d == "<i4" ? DType::I32 : d == "<i8" ? DType::I64 : d == "<f2" ? DType::F16
                                                                                          : (fail("'{}': unsupported dtype {}", path, d), DType::F32);
  if (header.find("'fortran_order': False") == std::string::npos) fail("'{}': fortran order not supported", path);
  size_t sp = field("'shape': (");
  std::string dims = header.substr(sp, header.find(')', sp) - sp);
  Shape shape;
  std::stringstream ss(dims);
  std::string tok;
  while (std::getline(ss, tok, ','))
    if (tok.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoll(tok));
  Tensor t = Tensor::empty(shape, dt);
  if (!f.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.nbytes())))
    fail("'{}': data shorter than shape {} needs", path, shape_str(shape));
  return t;
}

}  // namespace mcpp
