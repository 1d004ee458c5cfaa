// SentencePieceTokenizer over libsentencepiece; the contract is in sentencepiece_tokenizer.h.
#include "mcpp/datasets/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "mcpp/core/error.h"

namespace mcpp {

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_file(const std::string& model) {
  if (model.empty())
    fail("--tokenizer-type SentencePieceTokenizer needs --tokenizer-model (a SentencePiece tokenizer.model)");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model, ec))
    fail("--tokenizer-model '{}': no such file (SentencePieceTokenizer wants a tokenizer.model)", model);
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto st = sp->Load(model);
  if (!st.ok()) fail("SentencePiece model '{}' cannot be loaded: {}", model, st.ToString());
  if (sp->GetPieceSize() <= 0) fail("SentencePiece model '{}' has no pieces", model);
  if (sp->eos_id() < 0)
    fail("SentencePiece model '{}' has no EOS piece (eos_id -1): Megatron's end-of-document id is eos_id", model);
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(model, std::move(sp)));
}

SentencePieceTokenizer::SentencePieceTokenizer(std::string path, std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
    : path_(std::move(path)), sp_(std::move(sp)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::tokenize(std::string_view text) const {
  std::vector<int> ids;
  const auto st = sp_->Encode(absl::string_view(text.data(), text.size()), &ids);
  if (!st.ok()) fail("SentencePiece ({}): cannot encode: {}", path_, st.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::detokenize(const std::vector<int32_t>& ids) const {
  const int n = sp_->GetPieceSize();
  for (int32_t id : ids)
    if (id < 0 || id >= n) fail("cannot decode token id {}: SentencePiece model '{}' has ids [0, {})", id, path_, n);
  std::string out;
  const auto st = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  if (!st.ok()) fail("SentencePiece ({}): cannot decode: {}", path_, st.ToString());
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t SentencePieceTokenizer::eod() const { return sp_->eos_id(); }
int32_t SentencePieceTokenizer::bos() const { return sp_->bos_id(); }

}  // namespace mcpp
