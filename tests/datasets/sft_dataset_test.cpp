// SFTDataset (datasets/sft_dataset.h) and the conversation rendering (sft_conversation.h) with the Qwen3-style
// tokenizer fixture (tests/oracle/tokenizer/hf/qwen3, <|im_start|> / <|im_end|> added tokens), chatml format:
// the bins hold the conversations' tokens in file order, next-fit, EOD after each, padded with EOD; the loss mask
// is 1 exactly on the labels of assistant text (and the EOD after it) inside one conversation; documents() gives
// each conversation's start; the split cuts lines by Megatron's bookends. Bad lines name file:line and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/datasets/megatron_tokenizer.h"
#include "mcpp/datasets/sft_conversation.h"
#include "mcpp/datasets/sft_dataset.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<MegatronTokenizer> qwen3() {
  return build_tokenizer({.tokenizer_type = "HuggingFaceTokenizer",
                          .tokenizer_model = std::string(MCPP_SOURCE_DIR) + "/tests/oracle/tokenizer/hf/qwen3"});
}

std::string write_jsonl(const std::string& name, const std::vector<std::string>& lines) {
  const fs::path p = fs::temp_directory_path() / ("mcpp_sft_" + name + ".jsonl");
  std::ofstream out(p);
  for (const auto& l : lines) out << l << "\n";
  return p.string();
}

// The tokens and trained flags the header describes, built here from the pieces (chatml).
struct Expect {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;
  void add(const MegatronTokenizer& t, const std::string& text, bool train) {
    for (int32_t id : t.tokenize_text(text)) tokens.push_back(id), trained.push_back(train);
  }
};

Expect chatml(const MegatronTokenizer& t, const std::vector<std::pair<std::string, std::string>>& turns) {
  Expect e;
  for (const auto& [role, content] : turns) {
    if (role == "assistant") {
      e.add(t, "<|im_start|>assistant\n", false);
      e.add(t, content + "<|im_end|>\n", true);
    } else {
      e.add(t, "<|im_start|>" + role + "\n" + content + "<|im_end|>\n", false);
    }
  }
  e.tokens.push_back(t.eod()), e.trained.push_back(1);
  return e;
}

TEST(SFTDataset, PacksConversationsAndMasksPrompts) {
  const auto tok = qwen3();
  const std::string path = write_jsonl(
      "pack", {R"({"prompt": "What is 2+2?", "response": "4"})",
               "",  // blank lines are skipped
               R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
               R"( {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Bye"},)"
               R"( {"role": "assistant", "content": "Goodbye"}]})",
               R"({"prompt": "Name a color", "response": "Blue, like the sky on a clear summer day."})"});
  const std::vector<Expect> conv = {
      chatml(*tok, {{"user", "What is 2+2?"}, {"assistant", "4"}}),
      chatml(*tok, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello there"}, {"user", "Bye"},
                    {"assistant", "Goodbye"}}),
      chatml(*tok, {{"user", "Name a color"}, {"assistant", "Blue, like the sky on a clear summer day."}})};
  // seq_length: the first two conversations fit one bin, the third starts the next (next-fit).
  const int64_t n0 = conv[0].tokens.size(), n1 = conv[1].tokens.size(), n2 = conv[2].tokens.size();
  const int64_t seq = std::max(n0 + n1, n2) + 1;  // cap = seq + 1 > n0 + n1, and n0 + n1 + n2 > cap
  ASSERT_GT(n0 + n1 + n2, seq + 1);
  SFTDataset ds({.path = path, .split = "1,0,0", .split_index = 0, .seq_length = seq, .prompt_format = "chatml",
                 .tokenizer = tok.get()});
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.num_conversations(), 3);
  const std::vector<std::vector<int>> bins = {{0, 1}, {2}};
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<int32_t> tokens(seq + 1);
    std::vector<float> mask(seq);
    ds.sample(i, tokens, mask);
    Expect want;
    std::vector<int32_t> cu;
    for (int c : bins[i]) {
      cu.push_back(static_cast<int32_t>(want.tokens.size()));
      want.tokens.insert(want.tokens.end(), conv[c].tokens.begin(), conv[c].tokens.end());
      want.trained.insert(want.trained.end(), conv[c].trained.begin(), conv[c].trained.end());
    }
    const int64_t used = want.tokens.size();
    if (used < seq) cu.push_back(static_cast<int32_t>(used));  // the padding: a document of its own
    cu.push_back(static_cast<int32_t>(seq));
    want.tokens.resize(seq + 1, tok->eod());
    want.trained.resize(seq + 1, 0);
    EXPECT_EQ(tokens, want.tokens) << "bin " << i;
    EXPECT_EQ(ds.documents(i), cu) << "bin " << i;
    for (int64_t p = 0; p < seq; ++p) {
      bool same_doc = true;  // label p + 1 in input p's document
      for (int32_t st : cu) same_doc = same_doc && st != p + 1;
      EXPECT_EQ(mask[p], same_doc && p + 1 < used && want.trained[p + 1] ? 1.0f : 0.0f) << "bin " << i << " p " << p;
    }
  }
}

TEST(SFTDataset, SplitsLinesByMegatronBookends) {
  const auto tok = qwen3();
  std::vector<std::string> lines;
  for (int i = 0; i < 10; ++i)
    lines.push_back(R"({"prompt": "q)" + std::to_string(i) + R"(", "response": "a)" + std::to_string(i) + R"("})");
  const std::string path = write_jsonl("split", lines);
  // --split 8,2,0 of 10 lines: train lines 0..7, valid 8..9; a long seq_length packs each split in one bin
  SFTDataset train({.path = path, .split = "8,2,0", .split_index = 0, .seq_length = 1000, .prompt_format = "chatml",
                    .tokenizer = tok.get()});
  SFTDataset valid({.path = path, .split = "8,2,0", .split_index = 1, .seq_length = 1000, .prompt_format = "chatml",
                    .tokenizer = tok.get()});
  EXPECT_EQ(train.num_conversations(), 8);
  EXPECT_EQ(valid.num_conversations(), 2);
  EXPECT_THROW(SFTDataset({.path = path, .split = "8,2,0", .split_index = 2, .seq_length = 1000,
                           .prompt_format = "chatml", .tokenizer = tok.get()}),
               Error);
}

// Each bad line: an mcpp::Error naming file:line (and the field).
TEST(SFTDataset, BadLinesNameFileAndLine) {
  const auto tok = qwen3();
  const std::string good = R"({"prompt": "q", "response": "a"})";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not a JSON object"},
      {R"(["a list"])", "must be a JSON object"},
      {R"({"prompt": "q"})", "\"messages\""},
      {R"({"prompt": "q", "response": 3})", "\"response\" must be a string"},
      {R"({"messages": []})", "non-empty"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "unknown role 'robot'"},
      {R"({"messages": [{"role": "user"}]})", "missing \"content\""},
      {R"({"messages": [{"role": "assistant", "content": "x"}]})", "must follow a user or tool turn"},
  };
  for (const auto& [line, needle] : bad) {
    const std::string path = write_jsonl("bad", {good, good, line});
    try {
      SFTDataset({.path = path, .split = "1,0,0", .split_index = 0, .seq_length = 64, .prompt_format = "chatml",
                  .tokenizer = tok.get()});
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path + ":3"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(check_sft_prompt_format("default"), Error);
  EXPECT_THROW(check_sft_prompt_format("nosuch"), Error);
  EXPECT_THROW(SFTDataset({.path = "/nonexistent/sft.jsonl", .split = "1,0,0", .split_index = 0, .seq_length = 8,
                           .prompt_format = "chatml", .tokenizer = tok.get()}),
               Error);
}

}  // namespace
}  // namespace mcpp
