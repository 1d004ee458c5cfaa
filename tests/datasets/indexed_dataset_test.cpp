// IndexedDataset / IndexedDatasetBuilder: round trips in every dtype, byte identity with an independent
// Python writer of Megatron's layout (tests/oracle/megatron_indexed_writer.py), and bad files that must
// become mcpp::Error naming the file.
#include "mcpp/datasets/indexed_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "mcpp/core/error.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;
using Docs = std::vector<std::vector<std::vector<int64_t>>>;  // documents -> sequences -> tokens

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mcpp_idx_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Random documents with tokens in [lo, hi]: multi-sequence documents, an empty sequence, an empty doc.
Docs random_docs(uint32_t seed, int64_t lo, int64_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> tok(lo, hi);
  std::uniform_int_distribution<int> nseq(1, 4), len(1, 40);
  Docs docs(7);
  for (auto& d : docs) {
    d.resize(static_cast<size_t>(nseq(gen)));
    for (auto& s : d) {
      s.resize(static_cast<size_t>(len(gen)));
      for (auto& t : s) t = tok(gen);
    }
  }
  docs[2][0].clear();  // an empty sequence
  docs[4].clear();     // an empty document (no sequences), as Megatron records one
  return docs;
}

void write_ours(const std::string& prefix, IndexedDType dtype, const Docs& docs) {
  IndexedDatasetBuilder b(bin_path(prefix), dtype);
  for (const auto& d : docs) {
    for (const auto& s : d) b.add_item(std::span<const int64_t>(s));
    b.end_document();
  }
  b.finalize(idx_path(prefix));
}

void expect_contents(const IndexedDataset& ds, const Docs& docs, IndexedDType dtype) {
  EXPECT_EQ(ds.dtype(), dtype);
  ASSERT_EQ(ds.num_documents(), static_cast<int64_t>(docs.size()));
  int64_t seq = 0, tokens = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(ds.document_index(static_cast<int64_t>(d)), seq);
    for (const auto& s : docs[d]) {
      ASSERT_EQ(ds.sequence_length(seq), static_cast<int32_t>(s.size()));
      std::vector<int64_t> got64(s.size());
      ds.read(seq, 0, static_cast<int64_t>(s.size()), got64.data());
      EXPECT_EQ(got64, s) << "sequence " << seq;
      std::vector<int32_t> got32 = ds.get(seq);
      for (size_t k = 0; k < s.size(); ++k)  // int32 reads of wider tokens: only where they fit
        if (s[k] == static_cast<int32_t>(s[k])) {
          EXPECT_EQ(got32[k], s[k]);
        }
      EXPECT_EQ(ds.sequence_bytes(seq).size(), s.size() * indexed_dtype_size(dtype));
      tokens += static_cast<int64_t>(s.size());
      ++seq;
    }
  }
  EXPECT_EQ(ds.document_index(static_cast<int64_t>(docs.size())), seq);
  EXPECT_EQ(ds.num_sequences(), seq);
  EXPECT_EQ(ds.num_tokens(), tokens);
}

struct DtypeCase {
  IndexedDType dtype;
  int64_t lo, hi;
};
const DtypeCase kCases[] = {
    {IndexedDType::U8, 0, 255},          {IndexedDType::I8, -128, 127},
    {IndexedDType::I16, -32768, 32767},  {IndexedDType::I32, -2147483648LL, 2147483647LL},
    {IndexedDType::I64, -(1LL << 40), 1LL << 40}, {IndexedDType::F64, -(1LL << 40), 1LL << 40},
    {IndexedDType::F32, -(1 << 24), 1 << 24},     {IndexedDType::U16, 0, 65535},
};

TEST(IndexedDataset, RoundTripEveryDtype) {
  fs::path dir = temp_dir("roundtrip");
  for (const auto& c : kCases) {
    SCOPED_TRACE(indexed_dtype_name(c.dtype));
    std::string prefix = (dir / indexed_dtype_name(c.dtype)).string();
    Docs docs = random_docs(static_cast<uint32_t>(c.dtype), c.lo, c.hi);
    write_ours(prefix, c.dtype, docs);
    IndexedDataset ds = IndexedDataset::open(prefix);
    expect_contents(ds, docs, c.dtype);
    // Partial reads (Megatron's get(idx, offset, length)).
    int64_t q = 0;
    while (ds.sequence_length(q) < 3) ++q;
    std::vector<int32_t> part(3);
    ds.read(q, 1, 2, part.data());
    std::vector<int32_t> whole = ds.get(q);
    EXPECT_EQ(part[0], whole[1]);
    EXPECT_EQ(part[1], whole[2]);
    EXPECT_THROW(ds.read(q, 1, static_cast<int64_t>(whole.size()), part.data()), Error);
    EXPECT_THROW(ds.get(ds.num_sequences()), Error);
  }
  fs::remove_all(dir);
}

TEST(IndexedDataset, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(optimal_indexed_dtype(50257), IndexedDType::U16);
  EXPECT_EQ(optimal_indexed_dtype(65499), IndexedDType::U16);
  EXPECT_EQ(optimal_indexed_dtype(65500), IndexedDType::I32);
}

TEST(IndexedDataset, TokenOutsideDtypeIsAnError) {
  fs::path dir = temp_dir("range");
  IndexedDatasetBuilder b((dir / "x.bin").string(), IndexedDType::U16);
  std::vector<int32_t> bad = {1, 65536};
  try {
    b.add_item(std::span<const int32_t>(bad));
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("65536"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uint16"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// The oracle: Megatron's layout written by tests/oracle/megatron_indexed_writer.py (numpy, struct).
int run_python(const std::string& args) {
  std::string cmd = mcpp::test::oracle_python() + MCPP_SOURCE_DIR + "/tests/oracle/megatron_indexed_writer.py " +
                    args + " > /dev/null";
  return std::system(cmd.c_str());
}

std::string docs_json(const Docs& docs) {
  std::string s = "[";
  for (size_t d = 0; d < docs.size(); ++d) {
    s += d ? ",[" : "[";
    for (size_t q = 0; q < docs[d].size(); ++q) {
      s += q ? ",[" : "[";
      for (size_t k = 0; k < docs[d][q].size(); ++k) s += (k ? "," : "") + std::to_string(docs[d][q][k]);
      s += "]";
    }
    s += "]";
  }
  return s + "]";
}

TEST(IndexedDataset, ByteIdenticalToPythonMegatronWriter) {
  fs::path dir = temp_dir("oracle");
  for (const auto& c : kCases) {
    SCOPED_TRACE(indexed_dtype_name(c.dtype));
    Docs docs = random_docs(100 + static_cast<uint32_t>(c.dtype), c.lo, c.hi);
    std::string json = (dir / "docs.json").string();
    write_bytes(json, docs_json(docs));
    std::string py = (dir / (std::string("py_") + indexed_dtype_name(c.dtype))).string();
    std::string ours = (dir / (std::string("ours_") + indexed_dtype_name(c.dtype))).string();
    ASSERT_EQ(run_python("write --prefix " + py + " --dtype " + std::to_string(static_cast<int>(c.dtype)) +
                         " --input " + json),
              0);
    // Our reader on the Python writer's files.
    expect_contents(IndexedDataset::open(py), docs, c.dtype);
    // Our writer's files equal the Python writer's, byte for byte.
    write_ours(ours, c.dtype, docs);
    EXPECT_EQ(read_bytes(idx_path(ours)), read_bytes(idx_path(py)));
    EXPECT_EQ(read_bytes(bin_path(ours)), read_bytes(bin_path(py)));
    // And the Python reader agrees with our files (rewrite compares bytes, exit 1 on a difference).
    EXPECT_EQ(run_python("rewrite --prefix " + ours + " --out " + (dir / "re").string()), 0);
  }
  fs::remove_all(dir);
}

// ---- bad files: each is an mcpp::Error whose message names the file and the problem.
void expect_open_error(const std::string& prefix, const std::string& file, const std::string& problem) {
  try {
    IndexedDataset::open(prefix);
    ADD_FAILURE() << "expected mcpp::Error for " << problem;
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(file), std::string::npos) << m;
    EXPECT_NE(m.find(problem), std::string::npos) << m;
  }
}

TEST(IndexedDataset, BadFilesAreNamedErrors) {
  fs::path dir = temp_dir("bad");
  std::string good = (dir / "good").string();
  Docs docs = random_docs(7, 0, 1000);
  write_ours(good, IndexedDType::U16, docs);
  const std::string idx = read_bytes(idx_path(good)), bin = read_bytes(bin_path(good));
  std::string p = (dir / "bad").string();
  auto with = [&](const std::string& i, const std::string& b) {
    write_bytes(idx_path(p), i);
    write_bytes(bin_path(p), b);
  };

  with(idx.substr(0, 5), bin);
  expect_open_error(p, idx_path(p), "truncated index header");
  with("XXIDIDX" + idx.substr(7), bin);
  expect_open_error(p, idx_path(p), "bad magic");
  with(idx.substr(0, 20), bin);
  expect_open_error(p, idx_path(p), "truncated index header");
  std::string v = idx;
  v[9] = 2;
  with(v, bin);
  expect_open_error(p, idx_path(p), "unsupported index version 2");
  std::string d = idx;
  d[17] = 9;
  with(d, bin);
  expect_open_error(p, idx_path(p), "unknown dtype code 9");
  with(idx.substr(0, idx.size() - 3), bin);
  expect_open_error(p, idx_path(p), "truncated index");
  std::string huge = idx;  // sequence_count = 2^62: must not overflow into a pass
  huge[18 + 7] = 0x40;
  with(huge, bin);
  expect_open_error(p, idx_path(p), "truncated index");
  with(idx, bin.substr(0, bin.size() - 1));
  expect_open_error(p, bin_path(p), "shorter than the index says");
  // Document indices: swap two entries so they decrease.
  std::string nm = idx;
  const size_t doc_at = idx.size() - 8 * (docs.size() + 1);
  std::string e1 = nm.substr(doc_at + 8, 8), e2 = nm.substr(doc_at + 16, 8);
  nm.replace(doc_at + 8, 8, e2);
  nm.replace(doc_at + 16, 8, e1);
  ASSERT_NE(e1, e2);
  with(nm, bin);
  expect_open_error(p, idx_path(p), "not monotonic");
  // Missing files.
  fs::remove(bin_path(p));
  with(idx, bin);
  fs::remove(bin_path(p));
  expect_open_error(p, bin_path(p), "cannot open");
  fs::remove(idx_path(p));
  expect_open_error(p, idx_path(p), "cannot open");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mcpp
