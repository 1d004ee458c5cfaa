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

void save_npy(const std::string& path, const Tensor& t) {
  Tensor c = t.to(Device::CPU);
  std::string shape = "(";
  for (int i = 0; i < c.ndim(); ++i) shape += fmt::format("{},{}", c.size(i), i + 1 < c.ndim() ? " " : "");
  if (c.ndim() > 1) shape.pop_back();
  shape += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr(c.dtype()), shape);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write '{}'", path);
  f.write(kMagic, 6);
  const char ver[2] = {1, 0};
  f.write(ver, 2);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&hlen), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(c.raw()), static_cast<std::streamsize>(c.nbytes()));
  if (!f) fail("write failed for '{}'", path);
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
