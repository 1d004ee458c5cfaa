// Scanners for the common pre-tokenizer regexes; the contract is in hf_fast_patterns.h. Each alternative of
// the pattern is tried in order at the current code point, as the backtracking regex would (leftmost-first).
#include "mcpp/datasets/hf_fast_patterns.h"

#include <unicode/uchar.h>

#include "mcpp/datasets/gpt2_pretokenizer.h"

namespace mcpp::hf {
namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum Cls : uint8_t { L, N, S, O };

Cls classify(int32_t cp) {
  if (cp < 128) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return L;
    if (cp >= '0' && cp <= '9') return N;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return S;
    return O;
  }
  if (cp == 0x85) return S;
  switch (u_charType(cp)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return L;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return N;
    case U_SPACE_SEPARATOR:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
      return S;
    default:
      return O;
  }
}

struct Units {
  std::vector<uint32_t> off;  // [n + 1] byte offset of each code point, off[n] = text size
  std::vector<int32_t> cp;    // [n]
  std::vector<Cls> cls;       // [n]
  size_t n = 0;
};

void scan(std::string_view text, Units& u) {
  u.off.clear();
  u.cp.clear();
  u.cls.clear();
  for (size_t i = 0; i < text.size();) {
    int32_t cp;
    const int len = gpt2::decode_utf8(text, i, cp);
    u.off.push_back(static_cast<uint32_t>(i));
    u.cp.push_back(cp);
    u.cls.push_back(classify(cp));
    i += static_cast<size_t>(len);
  }
  u.n = u.cls.size();
  u.off.push_back(static_cast<uint32_t>(text.size()));
}

size_t run_end(const Units& u, size_t j, Cls c) {
  while (j < u.n && u.cls[j] == c) ++j;
  return j;
}

// Contractions 's 't 're 've 'm 'll 'd at unit i (all one code point a letter): length in units, or 0.
// Case-insensitive as (?i:...) in Unicode: a letter matches its simple case folds (s: S, U+017F long s).
size_t contraction(const Units& u, size_t i, bool ignore_case) {
  if (u.cp[i] != '\'' || i + 1 >= u.n) return 0;
  auto is = [&](size_t k, char lower) {
    if (k >= u.n) return false;
    const int32_t c = u.cp[k];
    if (c == lower) return true;
    if (!ignore_case) return false;
    if (c == lower - 'a' + 'A') return true;
    return lower == 's' && c == 0x17F;
  };
  if (is(i + 1, 's') || is(i + 1, 't')) return 2;
  if ((is(i + 1, 'r') || is(i + 1, 'v')) && is(i + 2, 'e')) return 3;
  if (is(i + 1, 'm')) return 2;
  if (is(i + 1, 'l') && is(i + 2, 'l')) return 3;
  if (is(i + 1, 'd')) return 2;
  return 0;
}

bool is_crlf(const Units& u, size_t j) { return u.cp[j] == '\r' || u.cp[j] == '\n'; }

// \s+(?!\S) then \s+ at a whitespace unit i: the run, less its last unit when a non-space follows it.
size_t spaces(const Units& u, size_t i) {
  size_t j = run_end(u, i, S);
  if (j < u.n && j - i >= 2) --j;
  return j;
}

void gpt2(const Units& u, std::vector<Span>& out) {
  size_t i = 0;
  while (i < u.n) {
    size_t j;
    if (size_t len = contraction(u, i, false)) {
      j = i + len;
    } else {
      const Cls c = u.cls[i];
      const bool lead = u.cp[i] == ' ' && i + 1 < u.n;
      const Cls next = lead ? u.cls[i + 1] : S;
      if (c == L || (lead && next == L)) j = run_end(u, c == L ? i : i + 1, L);
      else if (c == N || (lead && next == N)) j = run_end(u, c == N ? i : i + 1, N);
      else if (c == O || (lead && next == O)) j = run_end(u, c == O ? i : i + 1, O);
      else j = spaces(u, i);
    }
    out.emplace_back(u.off[i], u.off[j]);
    i = j;
  }
}

void llama3(const Units& u, size_t max_digits, std::vector<Span>& out) {
  size_t i = 0;
  while (i < u.n) {
    size_t j = 0;
    const Cls c = u.cls[i];
    if (size_t len = contraction(u, i, true)) {
      j = i + len;  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    } else if (c == L) {
      j = run_end(u, i, L);  // [^\r\n\p{L}\p{N}]?\p{L}+ without the optional unit
    } else if (c != N && !is_crlf(u, i) && i + 1 < u.n && u.cls[i + 1] == L) {
      j = run_end(u, i + 1, L);  // ... with it
    } else if (c == N) {
      j = i + 1;  // \p{N}{1,3} or \p{N}
      while (j < u.n && j - i < max_digits && u.cls[j] == N) ++j;
    } else if (c == O || (u.cp[i] == ' ' && i + 1 < u.n && u.cls[i + 1] == O)) {
      j = run_end(u, c == O ? i : i + 1, O);  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      while (j < u.n && is_crlf(u, j)) ++j;
    } else {  // whitespace: \s*[\r\n]+ takes the run up to its last CR / LF; without one, \s+(?!\S) or \s+
      size_t last_crlf = run_end(u, i, S);
      while (last_crlf > i && !is_crlf(u, last_crlf - 1)) --last_crlf;
      j = last_crlf > i ? last_crlf : spaces(u, i);
    }
    out.emplace_back(u.off[i], u.off[j]);
    i = j;
  }
}

}  // namespace

FastPattern fast_pattern_of(std::string_view pattern) {
  if (pattern == kGpt2Pattern) return FastPattern::kGpt2;
  if (pattern == kLlama3Pattern) return FastPattern::kLlama3;
  if (pattern == kQwen2Pattern) return FastPattern::kQwen2;
  return FastPattern::kNone;
}

void fast_pattern_matches(FastPattern p, std::string_view text, std::vector<Span>& out) {
  thread_local Units u;
  scan(text, u);
  if (p == FastPattern::kGpt2) gpt2(u, out);
  else llama3(u, p == FastPattern::kLlama3 ? 3 : 1, out);
}

}  // namespace mcpp::hf
