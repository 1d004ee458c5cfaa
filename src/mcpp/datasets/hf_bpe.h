// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}), as Hugging Face `tokenizers` runs it.
//
// Contract: encode_word(word) appends the ids of one pre-tokenized word:
//   - ignore_merges (Llama 3): a word that is itself in the vocabulary is that one id;
//   - otherwise the word starts as one symbol per character (continuing_subword_prefix before every character
//     but the first, end_of_word_suffix after the last); a character not in the vocabulary becomes its UTF-8 bytes
//     as <0xXX> tokens with byte_fallback, else unk_token (consecutive unknowns fused into one with fuse_unk), else
//     it is dropped (as `tokenizers` does without an unk token);
//   - then the merges apply as `tokenizers`' Word::merge_all: a priority queue of adjacent pairs by merge rank,
//     ties to the leftmost, each merge re-queuing the pairs it forms with its neighbours (O(n log n) a word).
// Merges are "a b" strings or ["a", "b"] pairs; a merge's parts and result must be in the vocabulary (as
// `tokenizers` requires), a later duplicate replaces an earlier one.
// Thread safety: encode_word is const and thread-safe (a sharded, mutex-guarded word cache).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mcpp::hf {

class BpeModel {
 public:
  // `where` names the file for errors ("tokenizer.json '<path>'").
  BpeModel(const nlohmann::json& model, const std::string& where);
  ~BpeModel();

  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  // The model's token of an id, or nullptr.
  const std::string* id_to_token(int32_t id) const;
  int64_t max_id() const { return static_cast<int64_t>(id_to_token_.size()) - 1; }

 private:
  struct Cache;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t char_id(std::string_view ch, bool first, bool last) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // [max id + 1]; holes are empty
  std::vector<bool> has_id_;
  std::unordered_map<int32_t, int32_t> char_ids_;  // code point -> id of the one-character token (no affixes)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a, b) -> (rank, merged id)
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> tokens (byte_fallback)
  std::string prefix_, suffix_;          // continuing_subword_prefix, end_of_word_suffix
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::unique_ptr<Cache> cache_;
};

}  // namespace mcpp::hf
