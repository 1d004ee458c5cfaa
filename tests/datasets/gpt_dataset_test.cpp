// GPTDataset: indices and samples equal Megatron's (tests/oracle/data/megatron_gpt_indices.py restates
// Megatron-Core's construction with numpy.random.RandomState), plus self-contained checks: a
// flattened-stream reference for samples, token coverage, determinism, resume, EOD loss mask, errors.
#include "mcpp/datasets/gpt_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "mcpp/core/error.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;
constexpr int32_t kEod = 1000000;  // above every position-valued token

struct Corpus {
  fs::path dir;
  std::string prefix;
  std::vector<std::vector<int32_t>> seqs;
};

// Sequences with random lengths (some empty, some longer than a sample) and token = global position,
// so every token is unique and coverage is checkable. Every 5th sequence ends with `eod`.
Corpus make_corpus(const std::string& name, int nseq, uint32_t seed, int32_t eod = kEod) {
  Corpus c;
  c.dir = fs::temp_directory_path() / ("mcpp_gpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(c.dir);
  fs::create_directories(c.dir);
  c.prefix = (c.dir / "corpus").string();
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> len(0, 40);
  IndexedDatasetBuilder b(bin_path(c.prefix), IndexedDType::I32);
  int32_t next = 0;
  for (int q = 0; q < nseq; ++q) {
    std::vector<int32_t> s(static_cast<size_t>(len(gen)));
    for (auto& t : s) t = next++;
    if (q % 5 == 0 && !s.empty()) s.back() = eod;
    b.add_item(std::span<const int32_t>(s));
    b.end_document();
    c.seqs.push_back(std::move(s));
  }
  b.finalize(idx_path(c.prefix));
  return c;
}

GPTDatasetOptions opts(const Corpus& c, int split_index, int64_t seq, int64_t num_samples, uint32_t seed) {
  return GPTDatasetOptions{.prefix = c.prefix, .split = "8,1,1", .split_index = split_index,
                           .seq_length = seq, .num_samples = num_samples, .seed = seed};
}

nlohmann::json run_oracle(const GPTDatasetOptions& o) {
  std::string cmd = mcpp::test::oracle_python() + MCPP_SOURCE_DIR + "/tests/oracle/data/megatron_gpt_indices.py " +
                    o.prefix + " " + o.split + " " + std::to_string(o.split_index) + " " +
                    std::to_string(o.seq_length) + " " + std::to_string(o.num_samples) + " " + std::to_string(o.seed);
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  return nlohmann::json::parse(out);
}

void expect_matches_megatron(const GPTDatasetOptions& o, bool expect_separate) {
  SCOPED_TRACE("split_index=" + std::to_string(o.split_index) + " num_samples=" + std::to_string(o.num_samples) +
               " seed=" + std::to_string(o.seed));
  GPTDataset ds(o);
  nlohmann::json m = run_oracle(o);
  EXPECT_EQ(ds.split_begin(), m["split_indices"][o.split_index].get<int64_t>());
  EXPECT_EQ(ds.split_end(), m["split_indices"][o.split_index + 1].get<int64_t>());
  EXPECT_EQ(ds.num_epochs(), m["num_epochs"].get<int64_t>());
  EXPECT_EQ(ds.separate_final_epoch(), m["separate_final_epoch"].get<bool>());
  EXPECT_EQ(ds.separate_final_epoch(), expect_separate);
  EXPECT_EQ(ds.document_index(), m["document_index"].get<std::vector<int32_t>>());
  EXPECT_EQ(ds.sample_index(), m["sample_index"].get<std::vector<int64_t>>());
  EXPECT_EQ(ds.shuffle_index(), m["shuffle_index"].get<std::vector<int64_t>>());
  auto samples = m["samples"].get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(ds.size(), static_cast<int64_t>(samples.size()));
  EXPECT_GE(ds.size(), o.num_samples);
  for (int64_t i = 0; i < ds.size(); ++i) ASSERT_EQ(ds.sample(i).tokens, samples[static_cast<size_t>(i)]) << i;
}

TEST(GPTDataset, IndicesAndSamplesMatchMegatron) {
  Corpus c = make_corpus("megatron", 120, 1);
  const int64_t s = 16;
  GPTDataset one(opts(c, 0, s, 0, 1234));
  const int64_t per_epoch = (one.tokens_per_epoch() - 1) / s;
  ASSERT_GT(per_epoch, 20);
  expect_matches_megatron(opts(c, 0, s, 0, 1234), false);             // one epoch (num_samples=None)
  expect_matches_megatron(opts(c, 0, s, 10, 99), false);              // fewer than an epoch
  expect_matches_megatron(opts(c, 0, s, per_epoch + 3, 1234), true);  // 2 epochs, small final: separate
  expect_matches_megatron(opts(c, 0, s, 3 * per_epoch - 1, 5), false);  // 3 epochs, full final epoch
  expect_matches_megatron(opts(c, 1, 8, 40, 1234), false);            // valid split, several epochs
  expect_matches_megatron(opts(c, 2, 4, 0, 1234), false);             // test split
  fs::remove_all(c.dir);
}

TEST(GPTDataset, SplitIndicesMatchMegatronFormula) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"969,30,1", 1000}, {"969,30,1", 10}, {"969,30,1", 12345}, {"1,1", 5},    {"1,1,1", 7},
      {"98,2,0", 3},      {"100,0,0", 17},  {"0.5,0.25,0.25", 6}, {"949,50,1", 1}, {"1/1/2", 11},
      {"969,30,1", 517},  {"969,30,1", 3},  {"1,2,3", 1}};
  std::string py = "import json,sys; sys.path.insert(0,'" + std::string(MCPP_SOURCE_DIR) +
                   "/tests/oracle/data'); from megatron_gpt_indices import split_indices; print(json.dumps([";
  for (const auto& [sp, n] : cases) py += "split_indices('" + sp + "'," + std::to_string(n) + "),";
  py += "]))";
  FILE* p = ::popen((mcpp::test::oracle_python() + "-c \"" + py + "\"").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0);
  auto want = nlohmann::json::parse(out);
  for (size_t k = 0; k < cases.size(); ++k) {
    auto got = split_indices(cases[k].first, cases[k].second);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want[k].get<std::vector<int64_t>>())
        << cases[k].first << " over " << cases[k].second;
  }
  // Each cumulative bookend rounds half to even on its own (Python's round): "1,1" over 5 -> 2.5 -> 2, 5.
  auto h = split_indices("1,1", 5);
  EXPECT_EQ(h[1], 2);
  EXPECT_EQ(h[2], 5);
  // The example: 969,30,1 over 517 -> train [0, 501) (the pre-core_r0.5 rule gave [0, 500)).
  EXPECT_EQ(split_indices("969,30,1", 517)[1], 501);
}

// Reference: concatenate the split's sequences in document_index order; pre-shuffle sample j is
// flat[j*s, j*s + s + 1).
TEST(GPTDataset, SamplesAreWindowsOfTheShuffledStream) {
  Corpus c = make_corpus("windows", 80, 2);
  for (int64_t num_samples : {0, 100}) {
    GPTDataset ds(opts(c, 0, 12, num_samples, 42));
    std::vector<int32_t> flat;
    for (int32_t q : ds.document_index()) flat.insert(flat.end(), c.seqs[q].begin(), c.seqs[q].end());
    const int64_t s = ds.seq_length();
    for (int64_t i = 0; i < ds.size(); ++i) {
      const int64_t j = ds.shuffle_index()[static_cast<size_t>(i)];
      std::vector<int32_t> want(flat.begin() + j * s, flat.begin() + j * s + s + 1);
      ASSERT_EQ(ds.sample(i).tokens, want) << "sample " << i;
    }
  }
  fs::remove_all(c.dir);
}

TEST(GPTDataset, OneEpochCoversEveryTokenOfTheSplitButTheTail) {
  Corpus c = make_corpus("cover", 90, 3);
  GPTDataset ds(opts(c, 0, 10, 0, 7));
  std::set<int32_t> seen;
  for (int64_t i = 0; i < ds.size(); ++i)
    for (int32_t t : ds.sample(i).tokens) seen.insert(t);
  std::set<int32_t> split_tokens;
  for (int64_t q = ds.split_begin(); q < ds.split_end(); ++q)
    split_tokens.insert(c.seqs[q].begin(), c.seqs[q].end());
  std::set<int32_t> missing;
  for (int32_t t : split_tokens)
    if (!seen.count(t)) missing.insert(t);
  for (int32_t t : seen) EXPECT_TRUE(split_tokens.count(t)) << "token " << t << " is not in the split";
  // Only the last partial sample is dropped: fewer than seq_length tokens (the EOD id kEod repeats).
  EXPECT_LT(static_cast<int64_t>(missing.size()), ds.seq_length());
  EXPECT_EQ(ds.size(), (ds.tokens_per_epoch() - 1) / ds.seq_length());
  fs::remove_all(c.dir);
}

TEST(GPTDataset, DeterministicPerSeed) {
  Corpus c = make_corpus("seed", 60, 4);
  GPTDataset a(opts(c, 0, 8, 0, 1234)), b(opts(c, 0, 8, 0, 1234)), d(opts(c, 0, 8, 0, 1235));
  ASSERT_EQ(a.size(), b.size());
  for (int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.sample(i).tokens, b.sample(i).tokens);
  EXPECT_NE(a.shuffle_index(), d.shuffle_index());
  EXPECT_NE(a.document_index(), d.document_index());
  fs::remove_all(c.dir);
}

TEST(GPTDataset, CursorResumesExactly) {
  Corpus c = make_corpus("resume", 50, 5);
  GPTDataset ds(opts(c, 0, 8, 30, 3));
  const int64_t s = ds.seq_length(), total = ds.size() + 5;  // also past the end: wraps
  GPTSampleCursor fresh(ds, 0);
  std::vector<std::vector<int32_t>> stream;
  std::vector<int32_t> tok(static_cast<size_t>(s + 1));
  std::vector<float> mask(static_cast<size_t>(s));
  for (int64_t i = 0; i < total; ++i) {
    fresh.next(tok, mask);
    stream.push_back(tok);
  }
  EXPECT_EQ(fresh.consumed_samples(), total);
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{17}, ds.size() - 1}) {
    GPTSampleCursor resumed(ds, k);
    for (int64_t i = k; i < total; ++i) {
      resumed.next(tok, mask);
      ASSERT_EQ(tok, stream[static_cast<size_t>(i)]) << "resume at " << k << ", sample " << i;
    }
  }
  EXPECT_EQ(stream[static_cast<size_t>(ds.size())], stream[0]);
  EXPECT_THROW(GPTSampleCursor(ds, -1), Error);
  fs::remove_all(c.dir);
}

TEST(GPTDataset, EodMaskLossMasksInputEodOnly) {
  Corpus c = make_corpus("eod", 60, 6, kEod);
  GPTDatasetOptions o = opts(c, 0, 16, 0, 1);
  GPTDataset plain(o);
  o.eod_mask_loss = true;
  o.eod_token = kEod;
  GPTDataset masked(o);
  int64_t zeros = 0;
  for (int64_t i = 0; i < masked.size(); ++i) {
    GPTSample a = plain.sample(i), b = masked.sample(i);
    ASSERT_EQ(a.tokens, b.tokens);
    for (int64_t k = 0; k < 16; ++k) {
      EXPECT_EQ(a.loss_mask[k], 1.0f);
      EXPECT_EQ(b.loss_mask[k], b.tokens[k] == kEod ? 0.0f : 1.0f);
      zeros += b.loss_mask[k] == 0.0f;
    }
  }
  EXPECT_GT(zeros, 0);
  fs::remove_all(c.dir);
}

void expect_error(const GPTDatasetOptions& o, const std::string& text) {
  try {
    GPTDataset ds(o);
    ADD_FAILURE() << "expected mcpp::Error containing '" << text << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(GPTDataset, BadOptionsAreNamedErrors) {
  Corpus c = make_corpus("errors", 30, 7);
  GPTDatasetOptions o = opts(c, 0, 8, 0, 1);
  o.split = "0,1,0";
  expect_error(o, "train split empty");
  o.split = "a,1";
  expect_error(o, "weight 'a' is not a non-negative number");
  o.split = "1,2,3,4";
  expect_error(o, "more than three weights");
  o.split = "0,0,0";
  expect_error(o, "sum to 0");
  o.split = "1,-1";
  expect_error(o, "weight '-1'");
  o = opts(c, 3, 8, 0, 1);
  expect_error(o, "split_index 3");
  o = opts(c, 0, 100000, 0, 1);
  expect_error(o, "fewer than seq_length + 1 = 100001");
  o = opts(c, 0, 0, 0, 1);
  expect_error(o, "seq_length 0");
  o = opts(c, 0, 8, 0, 1);
  o.eod_mask_loss = true;
  expect_error(o, "eod_mask_loss needs eod_token");
  o = opts(c, 0, 8, 0, 1);
  o.prefix = (c.dir / "missing").string();
  expect_error(o, "missing.idx");
  GPTDataset ds(opts(c, 0, 8, 0, 1));
  EXPECT_THROW(ds.sample(ds.size()), Error);
  std::vector<int32_t> small(3);
  std::vector<float> mask(8);
  EXPECT_THROW(ds.sample(0, small, mask), Error);
  fs::remove_all(c.dir);
}

}  // namespace
}  // namespace mcpp
