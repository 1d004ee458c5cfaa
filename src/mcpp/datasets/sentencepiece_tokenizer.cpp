// SentencePieceTokenizer over libsentencepiece; the contract is in sentencepiece_tokenizer.h.
#include "mcpp/datasets/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <functional>
#include <string_view>

#include "mcpp/core/error.h"

namespace mcpp {

namespace {
// Protobuf's wire format over `b`: f(field, wire type, varint value, length-delimited bytes) per field; false on
// malformed input. Enough to read the few ModelProto fields below (Debian ships no generated ModelProto header).
bool read_fields(std::string_view b, const std::function<void(int, int, uint64_t, std::string_view)>& f) {
  size_t i = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && i < b.size(); shift += 7) {
      const auto c = static_cast<uint8_t>(b[i++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return true;
    }
    return false;
  };
  while (i < b.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(key)) return false;
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    std::string_view bytes;
    if (wire == 0) {
      if (!varint(v)) return false;
    } else if (wire == 2) {
      if (!varint(v) || v > b.size() - i) return false;
      bytes = b.substr(i, v);
      i += v;
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      if (n > b.size() - i) return false;
      i += n;
    } else {
      return false;
    }
    f(field, wire, v, bytes);
  }
  return true;
}

// Whether every segmentation of a text breaks before each of its whitespaces, so that chunks cut there encode to the
// whole text's optimum (sentencepiece_tokenizer.h): a unigram model (trainer_spec.model_type, field 2.3), a built-in
// normalizer (normalizer_spec.name, 3.1) with the dummy prefix, extra-whitespace removal and whitespace escaping on
// (3.3 / 3.4 / 3.5, default true), and "\u2581" only as the first character of a piece.
bool whitespace_chunks_exact(const sentencepiece::SentencePieceProcessor& sp) {
  int64_t model_type = 1;  // UNIGRAM, the default
  std::string_view name;
  bool prefix = true, remove = true, escape = true;
  const std::string proto = sp.serialized_model_proto();
  const bool ok = read_fields(proto, [&](int field, int wire, uint64_t, std::string_view bytes) {
    if (wire != 2) return;
    if (field == 2)
      read_fields(bytes, [&](int f, int w, uint64_t v, std::string_view) {
        if (f == 3 && w == 0) model_type = static_cast<int64_t>(v);
      });
    if (field == 3)
      read_fields(bytes, [&](int f, int w, uint64_t v, std::string_view str) {
        if (f == 1 && w == 2) name = str;
        if (w != 0) return;
        if (f == 3) prefix = v != 0;
        if (f == 4) remove = v != 0;
        if (f == 5) escape = v != 0;
      });
  });
  const bool builtin = name == "nmt_nfkc" || name == "nfkc" || name == "nmt_nfkc_cf" || name == "nfkc_cf" ||
                       name == "identity";
  if (!ok || model_type != 1 || !builtin || !prefix || !remove || !escape) return false;
  for (int id = 0; id < sp.GetPieceSize(); ++id)
    if (sp.IdToPiece(id).find("\u2581", 1) != std::string::npos) return false;
  return true;
}

bool ascii_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
}  // namespace

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
    : path_(std::move(path)), sp_(std::move(sp)), chunked_(whitespace_chunks_exact(*sp_)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::tokenize(std::string_view text) const {
  std::vector<int32_t> out;
  auto encode = [&](std::string_view part) {
    std::vector<int> ids;
    const auto st = sp_->Encode(absl::string_view(part.data(), part.size()), &ids);
    if (!st.ok()) fail("SentencePiece ({}): cannot encode: {}", path_, st.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (!chunked_ || text.size() <= kChunkBytes) {
    encode(text);
    return out;
  }
  size_t begin = 0;  // each chunk ends before the first cut point kChunkBytes / 2 or more bytes in (or at the end)
  while (begin < text.size()) {
    size_t end = text.size();
    for (size_t k = begin + kChunkBytes / 2; k + 1 < text.size(); ++k)
      if (text[k] == ' ' && ascii_alnum(text[k - 1]) && ascii_alnum(text[k + 1])) {
        end = k;
        break;
      }
    encode(text.substr(begin, end - begin));
    begin = end;
  }
  return out;
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
