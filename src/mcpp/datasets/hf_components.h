// The pipeline stages of tokenizer.json around the model, each as Hugging Face `tokenizers` defines it:
//   normalizer      NFC | NFD | NFKC | NFKD (ICU), Prepend, Replace (String or Regex), Sequence
//   pre_tokenizer   Split (String or Regex; Isolated | Removed | MergedWithPrevious | MergedWithNext | Contiguous;
//                   invert), ByteLevel (add_prefix_space, use_regex: the GPT-2 pattern; bytes -> GPT-2's byte
//                   alphabet), Metaspace (replacement, prepend_scheme always | first | never, split), Digits
//                   (individual_digits), Sequence
//   decoder         ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence (on the list of token
//                   strings, as `tokenizers`' decode_chain); no decoder joins the tokens with spaces
//   post_processor  TemplateProcessing (single), ByteLevel (no-op on ids), Sequence
// Any other type is an mcpp::Error naming the file, the JSON path and the supported types.
// A Piece is one split of the text between added tokens; `at_start` marks the split that begins at offset 0 of
// the original text (Metaspace's prepend_scheme "first" prepends only there).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mcpp::hf {

struct Piece {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;  // splits / rewrites pieces; drops empty ones
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// TemplateProcessing's "single" template (no pair: Megatron tokenizes one sequence at a time).
struct PostProcessor {
  struct Item {
    bool sequence = false;    // the sequence itself ($A)
    std::vector<int32_t> ids;  // a special token's ids
  };
  std::vector<Item> single;  // empty: ids unchanged
  void apply(std::vector<int32_t>& ids) const;
};

// `where` names the file for errors. A null JSON value gives nullptr (the stage is absent).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);
PostProcessor make_post_processor(const nlohmann::json& j, const std::string& where);

// GPT-2's byte-level alphabet: byte -> the UTF-8 of its code point, and back (-1: not in the alphabet).
const std::string& byte_level_char(unsigned char b);
int byte_level_byte(int32_t cp);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace mcpp::hf
