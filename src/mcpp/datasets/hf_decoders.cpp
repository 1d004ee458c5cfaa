// tokenizer.json decoders and the post-processor; the contract is in hf_components.h. Decoders work on the
// list of token strings as `tokenizers`' decode_chain: each may rewrite, split or fuse the list.
#include <nlohmann/json.hpp>

#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt2_pretokenizer.h"
#include "mcpp/datasets/hf_components.h"
#include "mcpp/datasets/hf_regex.h"

namespace mcpp::hf {
namespace {

// Byte-level tokens -> bytes (a token with a character outside the alphabet keeps its UTF-8), lossy UTF-8.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        int32_t cp;
        i += static_cast<size_t>(gpt2::decode_utf8(t, i, cp));
        const int b = byte_level_byte(cp);
        if (b < 0) ok = false;
        else raw.push_back(static_cast<char>(b));
      }
      bytes += ok ? raw : t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// The replacement character becomes a space; in the first token (unless prepend_scheme is never) it is dropped.
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, bool strip_first) : rep_(std::move(rep)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (size_t f = 0; f < t.size();) {
        if (t.compare(f, rep_.size(), rep_) == 0) {
          if (!(k == 0 && strip_first_)) out.push_back(' ');
          f += rep_.size();
        } else {
          out.push_back(t[f++]);
        }
      }
      tokens[k].swap(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_;
};

// Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t nbytes = 0;
    auto flush = [&] {
      if (nbytes == 0) return;
      if (utf8_lossy(bytes) == bytes) {
        out.push_back(bytes);
      } else {
        for (size_t k = 0; k < nbytes; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      nbytes = 0;
    };
    for (std::string& t : tokens) {
      int v = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
        const int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) v = hi * 16 + lo;
      }
      if (v >= 0) {
        bytes.push_back(static_cast<char>(v));
        ++nbytes;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

// Strips up to `start` leading and `stop` trailing `content` characters from every token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : c_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, c_.size(), c_) == 0 && b < e; ++k) b += c_.size();
      for (size_t k = 0; k < stop_ && e >= b + c_.size() && t.compare(e - c_.size(), c_.size(), c_) == 0; ++k)
        e -= c_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string c_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(const nlohmann::json& j, const std::string& where) {
    content_ = j.at("content").get<std::string>();
    const auto& pat = j.at("pattern");
    if (pat.contains("String")) literal_ = pat["String"].get<std::string>();
    else if (pat.contains("Regex")) regex_ = std::make_unique<Regex>(pat["Regex"].get<std::string>(), where);
    else fail("{}: Replace.pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    if (!regex_ && literal_.empty()) fail("{}: Replace with an empty String pattern", where);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<Span> m;
      if (regex_) {
        regex_->matches(t, m);
      } else {
        for (size_t f = t.find(literal_); f != std::string::npos; f = t.find(literal_, f + literal_.size()))
          m.emplace_back(f, f + literal_.size());
      }
      if (m.empty()) continue;
      std::string out;
      size_t at = 0;
      for (auto [b, e] : m) {
        out.append(t, at, b - at);
        out += content_;
        at = e;
      }
      out.append(t, at);
      t.swap(out);
    }
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> regex_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> d) : d_(std::move(d)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& d : d_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> d_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: a decoder must be an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  const std::string at = where + ": decoder " + type;
  try {
    if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
    if (type == "Metaspace") {
      std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
      const bool never = j.contains("prepend_scheme") ? j["prepend_scheme"].get<std::string>() == "never"
                                                       : !j.value("add_prefix_space", true);
      return std::make_unique<MetaspaceDecoder>(std::move(rep), !never);
    }
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
    if (type == "Fuse") return std::make_unique<FuseDecoder>();
    if (type == "Strip")
      return std::make_unique<StripDecoder>(j.at("content").get<std::string>(), j.value("start", size_t{0}),
                                            j.value("stop", size_t{0}));
    if (type == "Replace") return std::make_unique<ReplaceDecoder>(j, at);
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Decoder>> v;
      for (const auto& d : j.at("decoders"))
        if (auto q = make_decoder(d, where)) v.push_back(std::move(q));
      return std::make_unique<SequenceDecoder>(std::move(v));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", at, e.what());
  }
  fail("{}: decoder type '{}' is not supported (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence)",
       where, type);
}

void PostProcessor::apply(std::vector<int32_t>& ids) const {
  if (single.empty()) return;
  std::vector<int32_t> out;
  out.reserve(ids.size() + 4);
  for (const Item& it : single) {
    if (it.sequence) out.insert(out.end(), ids.begin(), ids.end());
    else out.insert(out.end(), it.ids.begin(), it.ids.end());
  }
  ids.swap(out);
}

PostProcessor make_post_processor(const nlohmann::json& j, const std::string& where) {
  PostProcessor pp;
  if (j.is_null()) return pp;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: post_processor must be an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  const std::string at = where + ": post_processor " + type;
  try {
    if (type == "ByteLevel") return pp;  // offsets only
    if (type == "Sequence") {
      for (const auto& p : j.at("processors")) {
        PostProcessor q = make_post_processor(p, where);
        if (!q.single.empty()) {
          if (!pp.single.empty()) fail("{}: more than one TemplateProcessing in the Sequence", at);
          pp = std::move(q);
        }
      }
      return pp;
    }
    if (type == "TemplateProcessing") {
      const auto& specials = j.at("special_tokens");
      bool has_sequence = false;
      for (const auto& item : j.at("single")) {
        PostProcessor::Item it;
        if (item.contains("Sequence")) {
          it.sequence = true;
          has_sequence = true;
        } else if (item.contains("SpecialToken")) {
          const std::string name = item["SpecialToken"].at("id").get<std::string>();
          if (!specials.contains(name)) fail("{}: special token '{}' is not in special_tokens", at, name);
          it.ids = specials[name].at("ids").get<std::vector<int32_t>>();
        } else {
          fail("{}: a template item must be a Sequence or a SpecialToken", at);
        }
        pp.single.push_back(std::move(it));
      }
      if (!has_sequence) fail("{}: the single template has no Sequence", at);
      return pp;
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", at, e.what());
  }
  fail("{}: post_processor type '{}' is not supported (TemplateProcessing, ByteLevel, Sequence)", where, type);
}

}  // namespace mcpp::hf
