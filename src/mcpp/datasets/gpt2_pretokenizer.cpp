// GPT-2 pre-tokenization scanner; the contract is in gpt2_pretokenizer.h.
#include "mcpp/datasets/gpt2_pretokenizer.h"

#include <unicode/uchar.h>

#include <array>

namespace mcpp::gpt2 {
namespace {

constexpr std::array<CharClass, 128> make_ascii_table() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      t[c] = CharClass::kLetter;
    } else if (c >= '0' && c <= '9') {
      t[c] = CharClass::kNumber;
    } else if (c == ' ' || (c >= 0x09 && c <= 0x0D)) {  // JS \s in ASCII: \t \n \v \f \r and space
      t[c] = CharClass::kSpace;
    } else {
      t[c] = CharClass::kOther;
    }
  }
  return t;
}
constexpr std::array<CharClass, 128> kAscii = make_ascii_table();

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// One code point of the text: its byte offset and class.
struct Units {
  std::vector<uint32_t> off;  // [n + 1], off[n] = text.size()
  std::vector<CharClass> cls;  // [n]
};

Units scan_units(std::string_view text) {
  Units u;
  u.off.reserve(text.size() + 1);
  u.cls.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    int32_t cp;
    int len = decode_utf8(text, i, cp);
    u.off.push_back(static_cast<uint32_t>(i));
    u.cls.push_back(classify(cp));
    i += static_cast<size_t>(len);
  }
  u.off.push_back(static_cast<uint32_t>(text.size()));
  return u;
}

// Length in bytes of a contraction ('s 't 're 've 'm 'll 'd, lowercase ASCII only) at byte p, or 0.
size_t contraction_len(std::string_view text, size_t p) {
  if (text[p] != '\'' || p + 1 >= text.size()) return 0;
  char a = text[p + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (p + 2 >= text.size()) return 0;
  char b = text[p + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

CharClass classify(int32_t cp) {
  if (cp < 0) return CharClass::kOther;  // invalid byte: the JS would see U+FFFD (So)
  if (cp < 128) return kAscii[cp];
  if (cp == 0xFEFF || cp == 0x2028 || cp == 0x2029) return CharClass::kSpace;
  switch (u_charType(cp)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    case U_SPACE_SEPARATOR:
      return CharClass::kSpace;
    default:
      return CharClass::kOther;
  }
}

int decode_utf8(std::string_view s, size_t i, int32_t& cp) {
  auto b0 = static_cast<unsigned char>(s[i]);
  size_t left = s.size() - i;
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  cp = -1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left < 2 || !is_cont(at(1))) return 1;
    cp = ((b0 & 0x1F) << 6) | (at(1) & 0x3F);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 3 || !is_cont(at(1)) || !is_cont(at(2))) return 1;
    if (b0 == 0xE0 && at(1) < 0xA0) return 1;  // overlong
    if (b0 == 0xED && at(1) > 0x9F) return 1;  // UTF-16 surrogate
    cp = ((b0 & 0x0F) << 12) | ((at(1) & 0x3F) << 6) | (at(2) & 0x3F);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 4 || !is_cont(at(1)) || !is_cont(at(2)) || !is_cont(at(3))) return 1;
    if (b0 == 0xF0 && at(1) < 0x90) return 1;  // overlong
    if (b0 == 0xF4 && at(1) > 0x8F) return 1;  // > U+10FFFF
    cp = ((b0 & 0x07) << 18) | ((at(1) & 0x3F) << 12) | ((at(2) & 0x3F) << 6) | (at(3) & 0x3F);
    return 4;
  }
  return 1;  // continuation byte without lead, or 0xC0/0xC1/0xF5..0xFF
}

void pretokenize(std::string_view text, std::vector<std::string_view>& out) {
  if (text.empty()) return;
  Units u = scan_units(text);
  const size_t n = u.cls.size();
  auto run_end = [&](size_t j, CharClass c) {
    while (j < n && u.cls[j] == c) ++j;
    return j;
  };
  size_t i = 0;
  while (i < n) {
    size_t p = u.off[i];
    if (size_t len = contraction_len(text, p)) {  // 's 't 're 've 'm 'll 'd
      out.push_back(text.substr(p, len));
      i += len;  // contractions are ASCII: one unit per byte
      continue;
    }
    CharClass c = u.cls[i];
    bool lead_space = text[p] == ' ' && i + 1 < n;
    CharClass next = lead_space ? u.cls[i + 1] : CharClass::kSpace;
    size_t j;
    if (c == CharClass::kLetter || (lead_space && next == CharClass::kLetter)) {  // ' ?\p{L}+'
      j = run_end(c == CharClass::kLetter ? i : i + 1, CharClass::kLetter);
    } else if (c == CharClass::kNumber || (lead_space && next == CharClass::kNumber)) {  // ' ?\p{N}+'
      j = run_end(c == CharClass::kNumber ? i : i + 1, CharClass::kNumber);
    } else if (c == CharClass::kOther || (lead_space && next == CharClass::kOther)) {  // ' ?[^\s\p{L}\p{N}]+'
      j = run_end(c == CharClass::kOther ? i : i + 1, CharClass::kOther);
    } else {  // whitespace: '\s+(?!\S)' keeps the last space for the next word, else '\s+'
      j = run_end(i, CharClass::kSpace);
      if (j < n && j - i >= 2) --j;
    }
    out.push_back(text.substr(p, u.off[j] - p));
    i = j;
  }
}

}  // namespace mcpp::gpt2
