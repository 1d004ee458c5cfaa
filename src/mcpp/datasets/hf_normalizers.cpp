// tokenizer.json normalizers and the shared byte-level / UTF-8 helpers; the contract is in hf_components.h.
#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <array>

#include "mcpp/core/error.h"
#include "mcpp/datasets/hf_components.h"
#include "mcpp/datasets/hf_regex.h"

namespace mcpp::hf {
namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(const icu::Normalizer2* n, const std::string& where) : n_(n) {
    if (n_ == nullptr) fail("{}: ICU has no such normalizer", where);
  }
  void normalize(std::string& s) const override {
    UErrorCode st = U_ZERO_ERROR;
    if (n_->isNormalizedUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), st) && U_SUCCESS(st)) return;
    st = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
    n_->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink, nullptr, st);
    if (U_FAILURE(st)) fail("Unicode normalization failed: {}", u_errorName(st));
    s.swap(out);
  }

 private:
  const icu::Normalizer2* n_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }

 private:
  std::string p_;
};

// Replace: every match of a literal string or a regex becomes `content`.
class Replace final : public Normalizer {
 public:
  Replace(const nlohmann::json& j, const std::string& where) {
    const auto& pat = j.at("pattern");
    content_ = j.at("content").get<std::string>();
    if (pat.contains("String")) {
      literal_ = pat["String"].get<std::string>();
      if (literal_.empty()) fail("{}: Replace with an empty String pattern", where);
    } else if (pat.contains("Regex")) {
      regex_ = std::make_unique<Regex>(pat["Regex"].get<std::string>(), where);
    } else {
      fail("{}: Replace.pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    }
  }
  void normalize(std::string& s) const override {
    std::string out;
    if (regex_) {
      std::vector<Span> m;
      regex_->matches(s, m);
      if (m.empty()) return;
      size_t at = 0;
      for (auto [b, e] : m) {
        out.append(s, at, b - at);
        out += content_;
        at = e;
      }
      out.append(s, at);
    } else {
      size_t at = 0, f;
      if (s.find(literal_) == std::string::npos) return;
      while ((f = s.find(literal_, at)) != std::string::npos) {
        out.append(s, at, f - at);
        out += content_;
        at = f + literal_.size();
      }
      out.append(s, at);
    }
    s.swap(out);
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> regex_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> n) : n_(std::move(n)) {}
  void normalize(std::string& s) const override {
    for (const auto& n : n_) n->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> n_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: a normalizer must be an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  const std::string at = where + ": normalizer " + type;
  UErrorCode st = U_ZERO_ERROR;
  try {
    if (type == "NFC") return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFCInstance(st), at);
    if (type == "NFD") return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFDInstance(st), at);
    if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFKCInstance(st), at);
    if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(icu::Normalizer2::getNFKDInstance(st), at);
    if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
    if (type == "Replace") return std::make_unique<Replace>(j, at);
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Normalizer>> v;
      for (const auto& n : j.at("normalizers"))
        if (auto p = make_normalizer(n, where)) v.push_back(std::move(p));
      return std::make_unique<Sequence>(std::move(v));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", at, e.what());
  }
  fail("{}: normalizer type '{}' is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)", where, type);
}

const std::string& byte_level_char(unsigned char b) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      const int cp = printable ? c : 256 + n++;
      std::string u;
      if (cp < 0x80) {
        u.push_back(static_cast<char>(cp));
      } else {
        u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[static_cast<size_t>(c)] = u;
    }
    return t;
  }();
  return table[b];
}

int byte_level_byte(int32_t cp) {
  static const std::array<int, 324> inv = [] {
    std::array<int, 324> t;
    t.fill(-1);
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      t[static_cast<size_t>(printable ? c : 256 + n++)] = c;
    }
    return t;
  }();
  return cp >= 0 && cp < 324 ? inv[static_cast<size_t>(cp)] : -1;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = at(i);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    // The Unicode "maximal subpart" rule (Rust's from_utf8_lossy): the valid prefix of a sequence is one error.
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b >= 0xE0 && b <= 0xEF) need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    while (k <= need && i + k < s.size()) {
      const unsigned char c = at(i + k);
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
      ++k;
    }
    if (need > 0 && k == need + 1) {
      out.append(s.substr(i, k));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
    }
    i += need > 0 ? k : 1;
  }
  return out;
}

}  // namespace mcpp::hf
