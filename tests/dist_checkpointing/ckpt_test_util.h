// Shared helpers of the dist_checkpointing tests: a self-deleting temp dir, random tensors, byte-level
// file edits (flip, truncate) and bitwise tensor comparison.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"

namespace mcpp::dist_checkpointing::testing {

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = (std::filesystem::temp_directory_path() /
             ("mcpp_ckpt_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd())))
                .string();
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& sub) const { return path_ + "/" + sub; }

 private:
  std::string path_;
};

// Random bytes for any dtype (bit patterns; for F32 finite values in [-1, 1)).
inline Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 gen(seed);
  if (dtype == DType::F32) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(gen);
  } else {
    auto* p = static_cast<unsigned char*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(gen());
  }
  return t;
}

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Runs `fn`, expects an mcpp::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an mcpp::Error mentioning '" << *parts.begin() << "'";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n  lacks: " << p;
  }
}

}  // namespace mcpp::dist_checkpointing::testing
