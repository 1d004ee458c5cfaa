// HuggingFaceTokenizer and SentencePieceTokenizer against oracles we did not write:
//   - tests/oracle/tokenizer/hf/<family>/: small tokenizer.json files in each family's exact configuration with
//     the ids and decodes of Hugging Face `tokenizers` (npm, the Rust library; make_hf_fixtures.js) for three
//     texts (many scripts, whitespace runs, special tokens, emoji, random code points);
//   - tests/oracle/tokenizer/spm/: spm_train models with python3-sentencepiece's ids (make_spm_fixtures.sh);
//   - the hand-written regex scanners against ICU's engine on the same texts;
// and bad files / flags as one named mcpp::Error. Real vocabularies on large texts: ctest -R tokenizer.hf_oracle.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/datasets/hf_regex.h"
#include "mcpp/datasets/hf_tokenizer.h"
#include "mcpp/datasets/megatron_tokenizer.h"
#include "mcpp/datasets/sentencepiece_tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

const std::string kOracle = std::string(MCPP_SOURCE_DIR) + "/tests/oracle/tokenizer";
const std::vector<std::string> kTexts = {"varied.txt", "multilingual.txt", "fuzz_hf.txt"};
const std::vector<std::string> kFamilies = {"llama3", "qwen3", "mistral-nemo", "gpt-neox", "byte-level-options",
                                            "llama2", "mistral-7b", "metaspace-split"};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string text(const std::string& name) { return slurp(kOracle + "/texts/" + name); }

mcpp::TokenizerOptions opts(const std::string& type, const std::string& model = "", const std::string& vocab_file = "",
                            int64_t vocab_size = 0) {
  mcpp::TokenizerOptions o;
  o.tokenizer_type = type;
  o.tokenizer_model = model;
  o.vocab_file = vocab_file;
  o.vocab_size = vocab_size;
  return o;
}

std::unique_ptr<mcpp::MegatronTokenizer> hf(const std::string& family) {
  return mcpp::build_tokenizer(opts("HuggingFaceTokenizer", kOracle + "/hf/" + family));
}

TEST(HuggingFaceTokenizer, IdsAndDecodeEqualHuggingFaceTokenizersOnEveryFamily) {
  for (const auto& family : kFamilies) {
    const auto tok = hf(family);
    const auto expected = nlohmann::json::parse(slurp(kOracle + "/hf/" + family + "/expected.json"));
    for (const auto& t : kTexts) {
      SCOPED_TRACE(family + " / " + t);
      const Ids want = expected[t]["ids"].get<Ids>();
      const Ids got = tok->tokenize(text(t));
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(got, want);
      EXPECT_EQ(tok->detokenize(want), expected[t]["decoded"].get<std::string>());
    }
  }
}

TEST(HuggingFaceTokenizer, EodBosAndVocabSizeFromTheFiles) {
  const auto llama3 = hf("llama3");
  auto* h = dynamic_cast<mcpp::HuggingFaceTokenizer*>(llama3.get());
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(llama3->eod(), h->token_to_id("<|end_of_text|>"));
  EXPECT_EQ(llama3->bos(), h->token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(llama3->vocab_size(), h->token_to_id("<|eot_id|>") + 1);  // the last added token
  EXPECT_EQ(llama3->tokenize("")[0], llama3->bos());                // the template's BOS even for ""
  const auto qwen = hf("qwen3");
  EXPECT_EQ(qwen->bos(), -1);  // bos_token null
  EXPECT_EQ(qwen->eod(), dynamic_cast<mcpp::HuggingFaceTokenizer&>(*qwen).token_to_id("<|endoftext|>"));
  EXPECT_TRUE(qwen->tokenize("").empty());
  const auto llama2 = hf("llama2");
  EXPECT_EQ(llama2->eod(), 2);  // </s>
  EXPECT_EQ(llama2->bos(), 1);  // <s>
  EXPECT_EQ(llama2->vocab_size(), 2000);
  // A tokenizer.json path works too; without tokenizer_config.json the EOD is the special </s>
  const fs::path dir = fs::temp_directory_path() / "mcpp_hf_noconfig";
  fs::create_directories(dir);
  fs::copy_file(kOracle + "/hf/llama2/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  const auto bare = mcpp::build_tokenizer(opts("HuggingFaceTokenizer", (dir / "tokenizer.json").string()));
  EXPECT_EQ(bare->eod(), 2);
  EXPECT_EQ(bare->bos(), -1);
  fs::remove_all(dir);
}

TEST(HuggingFaceTokenizer, ConcurrentTokenizeAgrees) {
  const auto tok = hf("llama3");
  const std::string t = text("multilingual.txt") + text("varied.txt");
  const Ids want = tok->tokenize(t);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < got.size(); ++k) threads.emplace_back([&, k] { got[k] = tok->tokenize(t); });
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

TEST(HuggingFaceTokenizer, InvalidUtf8AndUnknownIdsAreErrors) {
  const auto tok = hf("qwen3");
  try {
    tok->tokenize(std::string("ok \xC3\x28 bad"));
    FAIL() << "no error";
  } catch (const mcpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok->detokenize({static_cast<int32_t>(tok->vocab_size()) + 5}), mcpp::Error);
}

// The scanners for the GPT-2 / Llama 3 / Qwen2 patterns equal ICU's regex engine on the same texts.
TEST(HfRegex, FastScannersEqualTheIcuEngine) {
  const std::vector<std::string> patterns = {
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  const std::vector<std::string> extra = {"", " ", "  ", "a  b", " \n\n x", "x \r\n\t y", "'S'LL'ſ", "12345 ½",
                                          "a\u0085 b\u000b\u00a0c", "!!\n\n?? ", "\t\t", "end  "};
  for (const auto& p : patterns) {
    const mcpp::hf::Regex fast(p, "test"), icu(p, "test", /*use_fast_path=*/false);
    ASSERT_TRUE(fast.fast());
    ASSERT_FALSE(icu.fast());
    std::vector<std::string> inputs = extra;
    for (const auto& t : kTexts) inputs.push_back(text(t));
    for (const auto& in : inputs) {
      std::vector<mcpp::hf::Span> a, b;
      fast.matches(in, a);
      icu.matches(in, b);
      EXPECT_EQ(a, b) << p << " on '" << in.substr(0, 40) << "'";
    }
  }
}

TEST(HfRegex, OnigurumaWhitespaceIsTranslated) {
  EXPECT_EQ(mcpp::hf::translate_onig_pattern(R"(\s+(?!\S))"),
            R"([\t\n\x{0B}\f\r\x{85}\p{Z}]+(?![^\t\n\x{0B}\f\r\x{85}\p{Z}]))");
  EXPECT_EQ(mcpp::hf::translate_onig_pattern(R"([^\s\p{L}])"), R"([^\t\n\x{0B}\f\r\x{85}\p{Z}\p{L}])");
  EXPECT_EQ(mcpp::hf::translate_onig_pattern(R"(\\s)"), R"(\\s)");  // an escaped backslash, then 's'
}

// Writes `json` as DIR/tokenizer.json and expects build_tokenizer to throw naming the file and `needle`.
void expect_bad_json(const std::string& json, const std::string& needle) {
  const fs::path dir = fs::temp_directory_path() / "mcpp_hf_bad";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json;
  try {
    mcpp::build_tokenizer(opts("HuggingFaceTokenizer", dir.string()));
    ADD_FAILURE() << "no error for " << json.substr(0, 80);
  } catch (const mcpp::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((dir / "tokenizer.json").string()), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  }
  fs::remove_all(dir);
}

TEST(HuggingFaceTokenizer, MalformedFilesAreNamedErrors) {
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "</s>": 3}, "merges": ["a b"]})";
  const std::string specials = R"("added_tokens": [{"id": 3, "content": "</s>", "special": true}])";
  expect_bad_json("{\"model\": {\"type\": \"BPE\"", "not valid JSON");
  expect_bad_json("{\"version\": \"1.0\"}", "no \"model\"");
  expect_bad_json(R"({"model": {"type": "Unigram", "vocab": []}})", "model type 'Unigram' is not supported");
  expect_bad_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})", "'c' is not in model.vocab");
  expect_bad_json(R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "must be a non-negative integer");
  expect_bad_json("{" + model + ", " + specials + R"(, "pre_tokenizer": {"type": "Whitespace"}})",
                  "pre_tokenizer type 'Whitespace' is not supported");
  expect_bad_json("{" + model + ", " + specials + R"(, "normalizer": {"type": "BertNormalizer"}})",
                  "normalizer type 'BertNormalizer' is not supported");
  expect_bad_json("{" + model + ", " + specials + R"(, "decoder": {"type": "WordPiece"}})",
                  "decoder type 'WordPiece' is not supported");
  expect_bad_json("{" + model + ", " + specials +
                      R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"}})",
                  "invalid regex '(a'");
  expect_bad_json("{" + model + ", " + specials +
                      R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {}}})",
                  "special token '<s>' is not in special_tokens");
  expect_bad_json("{" + model + "}", "no end-of-document token");
  try {
    mcpp::build_tokenizer(opts("HuggingFaceTokenizer", "/nonexistent/dir"));
    ADD_FAILURE();
  } catch (const mcpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir"), std::string::npos) << e.what();
  }
}

TEST(SentencePieceTokenizer, IdsAndDecodeEqualTheLibrarysPythonBinding) {
  for (const std::string name : {"bpe", "unigram"}) {
    const auto tok = mcpp::build_tokenizer(opts("SentencePieceTokenizer", kOracle + "/spm/" + name + ".model"));
    const auto expected = nlohmann::json::parse(slurp(kOracle + "/spm/" + name + ".expected.json"));
    EXPECT_EQ(tok->vocab_size(), expected["meta"]["vocab_size"].get<int64_t>());
    EXPECT_EQ(tok->eod(), expected["meta"]["eos_id"].get<int32_t>());
    EXPECT_EQ(tok->bos(), expected["meta"]["bos_id"].get<int32_t>());
    for (const auto& t : kTexts) {
      SCOPED_TRACE(name + " / " + t);
      const Ids want = expected[t]["ids"].get<Ids>();
      EXPECT_EQ(tok->tokenize(text(t)), want);
      EXPECT_EQ(tok->detokenize(want), expected[t]["decoded"].get<std::string>());
    }
  }
}

TEST(MegatronTokenizer, BadFlagsAndFilesNameTheProblem) {
  auto expect_error = [](const mcpp::TokenizerOptions& o, const std::string& needle) {
    try {
      mcpp::build_tokenizer(o);
      ADD_FAILURE() << "no error, wanted " << needle;
    } catch (const mcpp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(opts("BertWordPieceLowerCase"), "--tokenizer-type 'BertWordPieceLowerCase' is not supported");
  expect_error(opts("HuggingFaceTokenizer"), "needs --tokenizer-model");
  expect_error(opts("SentencePieceTokenizer"), "needs --tokenizer-model");
  expect_error(opts("SentencePieceTokenizer", kOracle + "/hf/llama2/tokenizer.json"), "cannot be loaded");
  expect_error(opts("GPT2BPETokenizer", "x"), "--tokenizer-model belongs to");
  expect_error(opts("HuggingFaceTokenizer", "x", "v"), "--vocab-file / --merge-file belong to GPT2BPETokenizer");
  expect_error(opts("NullTokenizer"), "needs --vocab-size");
  const auto null = mcpp::build_tokenizer(opts("NullTokenizer", "", "", 100));
  EXPECT_EQ(null->tokenize("3 1  4\n"), (Ids{3, 1, 4}));
  EXPECT_EQ(null->detokenize({3, 1, 4}), "3 1 4");
  EXPECT_EQ(null->eod(), 99);
  EXPECT_THROW(null->tokenize("3 x"), mcpp::Error);
}

}  // namespace
