// SentencePieceTokenizer's whitespace chunks for long texts (datasets/sentencepiece_tokenizer.h) against
// libsentencepiece's own Encode of the whole text, on the committed spm_train fixtures (tests/oracle/tokenizer/spm/):
//   - the unigram fixture qualifies, the BPE one (no extra-whitespace removal, identity normalizer) does not;
//   - a text up to kChunkBytes: the library's ids exactly (one Encode call);
//   - a 1 MB text: the same decode, and split at the boundaries both segmentations share, no region where ours scores
//     lower than the library's whole-text Viterbi (float64 sums of the pieces' scores: the unigram objective), and the
//     total strictly higher — the library's float32 path sum over 1 MB misses the optimum, the chunks do not;
//   - the BPE fixture over the same long text: the library's ids exactly (no chunks).
#include <sentencepiece_processor.h>

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mcpp/datasets/sentencepiece_tokenizer.h"

namespace mcpp {
namespace {

const std::string kSpm = std::string(MCPP_SOURCE_DIR) + "/tests/oracle/tokenizer/spm/";

std::string read(const std::string& name) {
  std::ifstream in(std::string(MCPP_SOURCE_DIR) + "/tests/oracle/tokenizer/texts/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ~bytes of the committed texts' lines, each repetition rotated by one more line (no two repetitions alike).
std::string long_text(size_t bytes) {
  std::vector<std::string> lines;
  std::istringstream in(read("varied.txt") + read("multilingual.txt"));
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  std::string out;
  for (size_t r = 0; out.size() < bytes; ++r)
    for (size_t i = 0; i < lines.size(); ++i) out += lines[(i + r) % lines.size()] + "\n";
  return out;
}

std::vector<int32_t> library_ids(const sentencepiece::SentencePieceProcessor& sp, const std::string& text) {
  std::vector<int> ids;
  EXPECT_TRUE(sp.Encode(text, &ids).ok());
  return {ids.begin(), ids.end()};
}

struct Regions {
  int differing = 0, ours_lower = 0;
  double ours = 0, theirs = 0;  // float64 totals
};

// Splits both id sequences at the boundaries they share (cumulative piece bytes) and compares each differing region's
// float64 score sum.
Regions compare(const sentencepiece::SentencePieceProcessor& sp, const std::vector<int32_t>& a,
                const std::vector<int32_t>& b) {
  Regions r;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    size_t la = 0, lb = 0;
    double sa = 0, sb = 0;
    const size_t i0 = i, j0 = j;
    do {  // grow the shorter side until both end at one byte offset
      if ((la <= lb && i < a.size()) || j == b.size()) {
        la += sp.IdToPiece(a[i]).size();
        sa += sp.GetScore(a[i++]);
      } else {
        lb += sp.IdToPiece(b[j]).size();
        sb += sp.GetScore(b[j++]);
      }
    } while (la != lb && (i < a.size() || j < b.size()));
    r.ours += sa, r.theirs += sb;
    const bool same = i - i0 == 1 && j - j0 == 1 && a[i0] == b[j0];
    if (same) continue;
    ++r.differing;
    if (sa < sb - 1e-4) ++r.ours_lower;
  }
  return r;
}

TEST(SentencePieceChunks, LongUnigramTextsReachTheOptimumTheWholeTextMisses) {
  const auto uni = SentencePieceTokenizer::from_file(kSpm + "unigram.model");
  ASSERT_TRUE(uni->encodes_in_chunks());
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(kSpm + "unigram.model").ok());

  const std::string shorter = long_text(SentencePieceTokenizer::kChunkBytes - 4096);
  EXPECT_EQ(uni->tokenize(shorter), library_ids(sp, shorter)) << "one Encode call up to kChunkBytes";

  const std::string text = long_text(1 << 20);
  const std::vector<int32_t> ours = uni->tokenize(text), theirs = library_ids(sp, text);
  EXPECT_EQ(uni->detokenize(ours), uni->detokenize(theirs));
  const Regions r = compare(sp, ours, theirs);
  EXPECT_EQ(r.ours_lower, 0) << "regions where the chunks' segmentation scores lower";
  EXPECT_GT(r.differing, 0) << "the library's whole-text encoding found the optimum here: the test shows nothing";
  EXPECT_GT(r.ours, r.theirs);
  std::printf("[ chunks   ] 1 MB: %d differing regions, float64 totals ours %.4f, the library's %.4f\n", r.differing,
              r.ours, r.theirs);
}

TEST(SentencePieceChunks, OtherModelsEncodeTheWholeText) {
  const auto bpe = SentencePieceTokenizer::from_file(kSpm + "bpe.model");
  EXPECT_FALSE(bpe->encodes_in_chunks());
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(kSpm + "bpe.model").ok());
  const std::string text = long_text(256 * 1024);
  EXPECT_EQ(bpe->tokenize(text), library_ids(sp, text));
}

}  // namespace
}  // namespace mcpp
