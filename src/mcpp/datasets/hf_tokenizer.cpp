// HuggingFaceTokenizer: loading tokenizer.json and the encode / decode pipeline; the contract is in
// hf_tokenizer.h, the stages in hf_components.h and hf_bpe.h.
#include "mcpp/datasets/hf_tokenizer.h"

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/datasets/gpt2_pretokenizer.h"
#include "mcpp/datasets/hf_bpe.h"
#include "mcpp/datasets/hf_components.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;

struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
  std::string match;  // what is looked for: the content, normalized when `normalized` (as `tokenizers` does)
};

// Added-token matching: per first byte, the candidates longest first (leftmost-longest, as aho-corasick's).
class AddedMatcher {
 public:
  void add(const AddedToken* t) {
    if (t->match.empty()) return;
    auto& b = buckets_[static_cast<unsigned char>(t->match[0])];
    b.push_back(t);
    std::stable_sort(b.begin(), b.end(), [](auto* x, auto* y) { return x->content.size() > y->content.size(); });
    any_ = true;
  }
  bool empty() const { return !any_; }

  struct Split {
    size_t b, e;
    int32_t id;  // -1: text
  };
  // `tokenizers`' AddedVocabulary::find_matches over one string.
  std::vector<Split> split(std::string_view s) const {
    std::vector<Split> out;
    size_t start_offset = 0;
    for (size_t i = 0; i < s.size();) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : buckets_[static_cast<unsigned char>(s[i])])
        if (s.compare(i, t->match.size(), t->match) == 0) {
          hit = t;
          break;
        }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + hit->match.size();
      i = stop;
      if (hit->single_word && !(boundary_before(s, start) && boundary_after(s, stop))) continue;
      if (hit->lstrip) start = std::max(leftmost_space(s, start), start_offset);
      if (hit->rstrip) stop = rightmost_space(s, stop);
      if (start_offset < start) out.push_back({start_offset, start, -1});
      out.push_back({start, stop, hit->id});
      start_offset = stop;
    }
    if (start_offset < s.size() || out.empty()) out.push_back({start_offset, s.size(), -1});
    return out;
  }

 private:
  static bool is_word(int32_t cp) {  // Rust's char::is_alphanumeric, or '_'
    return cp == '_' || u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_charType(cp) == U_DECIMAL_DIGIT_NUMBER ||
           u_charType(cp) == U_LETTER_NUMBER || u_charType(cp) == U_OTHER_NUMBER;
  }
  static int32_t last_cp(std::string_view s, size_t end, size_t* start) {
    size_t b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    int32_t cp;
    gpt2::decode_utf8(s, b, cp);
    if (start) *start = b;
    return cp;
  }
  static bool boundary_before(std::string_view s, size_t at) { return at == 0 || !is_word(last_cp(s, at, nullptr)); }
  static bool boundary_after(std::string_view s, size_t at) {
    if (at >= s.size()) return true;
    int32_t cp;
    gpt2::decode_utf8(s, at, cp);
    return !is_word(cp);
  }
  static bool is_space(int32_t cp) { return u_hasBinaryProperty(cp, UCHAR_WHITE_SPACE); }
  static size_t leftmost_space(std::string_view s, size_t at) {
    while (at > 0) {
      size_t b;
      if (!is_space(last_cp(s, at, &b))) break;
      at = b;
    }
    return at;
  }
  static size_t rightmost_space(std::string_view s, size_t at) {
    while (at < s.size()) {
      int32_t cp;
      const int len = gpt2::decode_utf8(s, at, cp);
      if (!is_space(cp)) break;
      at += static_cast<size_t>(len);
    }
    return at;
  }
  std::array<std::vector<const AddedToken*>, 256> buckets_;
  bool any_ = false;
};

// Regular files only, depth- and size-bounded (core/json_limits.h): a FIFO or a 100,000-deep file is one error.
nlohmann::json parse_json(const std::string& path, const std::string& what) {
  return read_json_file(path, what);  // errors: "<what> <path> is not valid JSON (...)"
}

// tokenizer_config.json's "eos_token": "</s>" or {"content": "</s>", ...}; empty when absent or null.
std::string config_token(const nlohmann::json& cfg, const char* key, const std::string& path) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  fail("tokenizer_config.json '{}': {} must be a string or {{\"content\": ...}}", path, key);
}

size_t invalid_utf8_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    const int len = gpt2::decode_utf8(s, i, cp);
    if (cp < 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

}  // namespace

struct HuggingFaceTokenizer::Impl {
  std::string path;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  AddedMatcher raw_matcher, normalized_matcher;
  std::unique_ptr<hf::Normalizer> normalizer;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer;
  std::unique_ptr<hf::BpeModel> model;
  hf::PostProcessor post;
  std::unique_ptr<hf::Decoder> decoder;
  int32_t eod = -1, bos = -1;
  int64_t vocab_size = 0;

  void encode_piece(hf::Piece piece, std::vector<int32_t>& out) const {
    std::vector<hf::Piece> words{std::move(piece)};
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(words);
    for (const hf::Piece& w : words) model->encode_word(w.text, out);
  }
};

std::unique_ptr<HuggingFaceTokenizer> HuggingFaceTokenizer::from_path(const std::string& model) {
  if (model.empty()) fail("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a directory with tokenizer.json)");
  std::error_code ec;
  const bool dir = fs::is_directory(model, ec);
  const std::string json_path = dir ? (fs::path(model) / "tokenizer.json").string() : model;
  if (!fs::exists(json_path, ec))
    fail("--tokenizer-model '{}': {} not found", model, dir ? "tokenizer.json" : "file");
  auto impl = std::make_unique<Impl>();
  impl->path = json_path;
  const std::string where = "tokenizer.json '" + json_path + "'";
  const nlohmann::json j = parse_json(json_path, "tokenizer.json");
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    fail("{}: no \"model\" object (is this a Hugging Face tokenizer.json?)", where);
  const std::string mtype = j["model"].value("type", std::string("BPE"));
  if (mtype != "BPE") fail("{}: model type '{}' is not supported (BPE only)", where, mtype);
  if (j.contains("truncation") && !j["truncation"].is_null())
    fail("{}: \"truncation\" is set; Megatron tokenizes whole documents (set it to null)", where);
  impl->model = std::make_unique<hf::BpeModel>(j["model"], where);
  impl->normalizer = hf::make_normalizer(j.value("normalizer", nlohmann::json()), where);
  impl->pre_tokenizer = hf::make_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()), where);
  impl->decoder = hf::make_decoder(j.value("decoder", nlohmann::json()), where);
  impl->post = hf::make_post_processor(j.value("post_processor", nlohmann::json()), where);

  int64_t max_id = impl->model->max_id();
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) fail("{}: added_tokens must be a list", where);
    try {
      for (const auto& t : j["added_tokens"]) {
        AddedToken a{t.at("id").get<int32_t>(),          t.at("content").get<std::string>(),
                     t.value("single_word", false),      t.value("lstrip", false),
                     t.value("rstrip", false),           t.value("normalized", false),
                     t.value("special", false), {}};
        if (a.id < 0 || a.content.empty()) fail("{}: added token '{}' has id {} (or no content)", where, a.content, a.id);
        if (invalid_utf8_at(a.content) != std::string_view::npos) fail("{}: added token is not valid UTF-8", where);
        impl->added.push_back(std::move(a));
      }
    } catch (const nlohmann::json::exception& e) {
      fail("{}: added_tokens: {}", where, e.what());
    }
  }
  for (AddedToken& a : impl->added) {
    a.match = a.content;
    if (a.normalized && impl->normalizer) impl->normalizer->normalize(a.match);
    impl->added_by_id[a.id] = &a;
    impl->added_by_content[a.content] = a.id;
    (a.normalized ? impl->normalized_matcher : impl->raw_matcher).add(&a);
    max_id = std::max<int64_t>(max_id, a.id);
  }
  impl->vocab_size = max_id + 1;
  for (const auto& item : impl->post.single)
    for (int32_t id : item.ids)
      if (id < 0 || id > max_id) fail("{}: post_processor special token id {} is outside the vocabulary", where, id);

  std::unique_ptr<HuggingFaceTokenizer> tok(new HuggingFaceTokenizer(std::move(impl)));
  Impl& m = *tok->impl_;
  const std::string cfg_path = (fs::path(json_path).parent_path() / "tokenizer_config.json").string();
  if (fs::exists(cfg_path, ec)) {
    const nlohmann::json cfg = parse_json(cfg_path, "tokenizer_config.json");
    if (!cfg.is_object()) fail("tokenizer_config.json '{}' must be a JSON object", cfg_path);
    for (auto [key, dst] : {std::pair{"eos_token", &m.eod}, std::pair{"bos_token", &m.bos}}) {
      const std::string name = config_token(cfg, key, cfg_path);
      if (name.empty()) continue;
      *dst = tok->token_to_id(name);
      if (*dst < 0) fail("tokenizer_config.json '{}': {} '{}' is not in {}", cfg_path, key, name, where);
    }
  }
  if (m.eod < 0) {
    for (const char* name : {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"}) {
      auto it = m.added_by_content.find(name);
      if (it != m.added_by_content.end() && m.added_by_id[it->second]->special) {
        m.eod = it->second;
        break;
      }
    }
  }
  if (m.eod < 0)
    fail("{}: no end-of-document token: give eos_token in a tokenizer_config.json beside it", where);
  return tok;
}

HuggingFaceTokenizer::HuggingFaceTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

std::vector<int32_t> HuggingFaceTokenizer::tokenize(std::string_view text) const { return encode(text, true); }
std::vector<int32_t> HuggingFaceTokenizer::tokenize_text(std::string_view text) const { return encode(text, false); }

std::vector<int32_t> HuggingFaceTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
    fail("HuggingFaceTokenizer: the text is not valid UTF-8 (byte {} of {})", bad, text.size());
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const AddedMatcher::Split& s : m.raw_matcher.split(text)) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    std::string piece(text.substr(s.b, s.e - s.b));
    if (m.normalizer) m.normalizer->normalize(piece);
    if (piece.empty()) continue;
    if (m.normalized_matcher.empty()) {
      m.encode_piece({std::move(piece), s.b == 0}, ids);
      continue;
    }
    for (const AddedMatcher::Split& n : m.normalized_matcher.split(piece)) {
      if (n.id >= 0) ids.push_back(n.id);
      else if (n.e > n.b) m.encode_piece({piece.substr(n.b, n.e - n.b), s.b == 0 && n.b == 0}, ids);
    }
  }
  if (add_special_tokens) m.post.apply(ids);
  return ids;
}

std::string HuggingFaceTokenizer::detokenize(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto a = m.added_by_id.find(id);
    if (a != m.added_by_id.end()) {
      tokens.push_back(a->second->match);  // `tokenizers` decodes a normalized added token as its normalized form
      continue;
    }
    const std::string* t = m.model->id_to_token(id);
    if (t == nullptr) fail("cannot decode token id {}: {} has no such id", id, m.path);
    tokens.push_back(*t);
  }
  if (!m.decoder) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  m.decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int32_t HuggingFaceTokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

int64_t HuggingFaceTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t HuggingFaceTokenizer::eod() const { return impl_->eod; }
int32_t HuggingFaceTokenizer::bos() const { return impl_->bos; }

}  // namespace mcpp
