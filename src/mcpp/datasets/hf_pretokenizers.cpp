// tokenizer.json pre-tokenizers; the contract is in hf_components.h. Splitting follows `tokenizers`'
// NormalizedString::split: the pattern yields (span, is_match) pairs tiling the piece, the behavior merges or
// drops them, empty results are dropped.
#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include <functional>

#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt2_pretokenizer.h"
#include "mcpp/datasets/hf_components.h"
#include "mcpp/datasets/hf_regex.h"

namespace mcpp::hf {
namespace {

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct Part {
  size_t b, e;
  bool match;
};

// Tiles [0, n) with the matches and the gaps between them (Pattern::find_matches).
std::vector<Part> tile(const std::vector<Span>& m, size_t n) {
  std::vector<Part> out;
  size_t prev = 0;
  for (auto [b, e] : m) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev != n) out.push_back({prev, n, false});
  return out;
}

std::vector<Span> apply_behavior(std::vector<Part> parts, Behavior behavior) {
  std::vector<Span> out;
  bool prev_match = false;
  switch (behavior) {
    case Behavior::Isolated:
      for (const Part& p : parts) out.emplace_back(p.b, p.e);
      break;
    case Behavior::Removed:
      for (const Part& p : parts)
        if (!p.match) out.emplace_back(p.b, p.e);
      break;
    case Behavior::MergedWithPrevious:
      for (const Part& p : parts) {
        if (p.match && !prev_match && !out.empty()) out.back().second = p.e;
        else out.emplace_back(p.b, p.e);
        prev_match = p.match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !prev_match && !out.empty()) out.back().first = it->b;
        else out.emplace_back(it->b, it->e);
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::Contiguous:
      for (const Part& p : parts) {
        if (p.match == prev_match && !out.empty()) out.back().second = p.e;
        else out.emplace_back(p.b, p.e);
        prev_match = p.match;
      }
      break;
  }
  return out;
}

// Replaces each piece by its splits; a split keeps at_start when it begins at the piece's offset 0.
void split_pieces(std::vector<Piece>& pieces, const std::function<std::vector<Span>(const std::string&)>& split) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  for (Piece& p : pieces) {
    for (auto [b, e] : split(p.text))
      if (e > b) out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
  }
  pieces.swap(out);
}

// A per-character pattern (`tokenizers`' Fn(char) -> bool): every matching character is its own match.
std::vector<Span> char_matches(const std::string& s, const std::function<bool(int32_t)>& pred) {
  std::vector<Span> m;
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    const auto len = static_cast<size_t>(gpt2::decode_utf8(s, i, cp));
    if (pred(cp)) m.emplace_back(i, i + len);
    i += len;
  }
  return m;
}

Behavior parse_behavior(const nlohmann::json& j, const std::string& where) {
  const std::string b = j.get<std::string>();
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "Removed") return Behavior::Removed;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail("{}: unknown split behavior '{}'", where, b);
}

class Split final : public PreTokenizer {
 public:
  Split(const nlohmann::json& j, const std::string& where)
      : behavior_(parse_behavior(j.at("behavior"), where)), invert_(j.value("invert", false)) {
    const auto& pat = j.at("pattern");
    if (pat.contains("String")) literal_ = pat["String"].get<std::string>();
    else if (pat.contains("Regex")) regex_ = std::make_unique<Regex>(pat["Regex"].get<std::string>(), where);
    else fail("{}: Split.pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const std::string& s) {
      std::vector<Span> m;
      if (regex_) {
        regex_->matches(s, m);
      } else if (!literal_.empty()) {
        for (size_t f = s.find(literal_); f != std::string::npos; f = s.find(literal_, f + literal_.size()))
          m.emplace_back(f, f + literal_.size());
      }
      std::vector<Part> parts = tile(m, s.size());
      if (invert_)
        for (Part& p : parts) p.match = !p.match;
      return apply_behavior(std::move(parts), behavior_);
    });
  }

 private:
  Behavior behavior_;
  bool invert_;
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(const nlohmann::json& j, const std::string& where)
      : add_prefix_space_(j.value("add_prefix_space", true)), use_regex_(j.value("use_regex", true)) {
    if (use_regex_)
      regex_ = std::make_unique<Regex>(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                                       where);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
    if (use_regex_)
      split_pieces(pieces, [&](const std::string& s) {
        std::vector<Span> m;
        regex_->matches(s, m);
        return apply_behavior(tile(m, s.size()), Behavior::Isolated);
      });
    for (Piece& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (char c : p.text) mapped += byte_level_char(static_cast<unsigned char>(c));
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> regex_;
};

enum class Prepend { Always, First, Never };

Prepend parse_prepend(const nlohmann::json& j, const std::string& where) {
  if (j.contains("prepend_scheme")) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return Prepend::Always;
    if (s == "first") return Prepend::First;
    if (s == "never") return Prepend::Never;
    fail("{}: Metaspace prepend_scheme '{}' (expected always, first or never)", where, s);
  }
  return j.value("add_prefix_space", true) ? Prepend::Always : Prepend::Never;  // older tokenizer.json
}

std::string replacement_of(const nlohmann::json& j, const std::string& where) {
  const std::string r = j.value("replacement", std::string("\xE2\x96\x81"));
  int32_t cp;
  if (r.empty() || static_cast<size_t>(gpt2::decode_utf8(r, 0, cp)) != r.size() || cp < 0)
    fail("{}: Metaspace replacement must be one character", where);
  return r;
}

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(const nlohmann::json& j, const std::string& where)
      : rep_(replacement_of(j, where)), prepend_(parse_prepend(j, where)), split_(j.value("split", true)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& p : pieces) {
      std::string t;
      t.reserve(p.text.size() + 8);
      for (char c : p.text) {
        if (c == ' ') t += rep_;
        else t.push_back(c);
      }
      const bool starts = t.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && p.at_start))) t.insert(0, rep_);
      p.text.swap(t);
    }
    if (!split_) return;
    split_pieces(pieces, [&](const std::string& s) {
      std::vector<Span> m;
      for (size_t f = s.find(rep_); f != std::string::npos; f = s.find(rep_, f + rep_.size()))
        m.emplace_back(f, f + rep_.size());
      return apply_behavior(tile(m, s.size()), Behavior::MergedWithNext);
    });
  }

 private:
  std::string rep_;
  Prepend prepend_;
  bool split_;
};

bool is_numeric(int32_t cp) {  // Rust's char::is_numeric: Nd, Nl, No
  const auto t = u_charType(cp);
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

class Digits final : public PreTokenizer {
 public:
  explicit Digits(const nlohmann::json& j) : individual_(j.value("individual_digits", false)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const std::string& s) {
      return apply_behavior(tile(char_matches(s, is_numeric), s.size()),
                            individual_ ? Behavior::Isolated : Behavior::Contiguous);
    });
  }

 private:
  bool individual_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> p) : p_(std::move(p)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : p_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> p_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: a pre_tokenizer must be an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  const std::string at = where + ": pre_tokenizer " + type;
  try {
    if (type == "Split") return std::make_unique<Split>(j, at);
    if (type == "ByteLevel") return std::make_unique<ByteLevel>(j, at);
    if (type == "Metaspace") return std::make_unique<Metaspace>(j, at);
    if (type == "Digits") return std::make_unique<Digits>(j);
    if (type == "Sequence") {
      std::vector<std::unique_ptr<PreTokenizer>> v;
      for (const auto& p : j.at("pretokenizers"))
        if (auto q = make_pre_tokenizer(p, where)) v.push_back(std::move(q));
      return std::make_unique<Sequence>(std::move(v));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", at, e.what());
  }
  fail("{}: pre_tokenizer type '{}' is not supported (Split, ByteLevel, Metaspace, Digits, Sequence)", where, type);
}

}  // namespace mcpp::hf
