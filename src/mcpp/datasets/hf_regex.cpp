// tokenizer.json regexes on ICU (and the hand-written fast paths); the contract is in hf_regex.h.
#include "mcpp/datasets/hf_regex.h"

#include <unicode/regex.h>
#include <unicode/utext.h>

#include <mutex>

#include "mcpp/core/error.h"
#include "mcpp/datasets/hf_fast_patterns.h"

namespace mcpp::hf {

namespace {
constexpr const char* kOnigSpace = "\\t\\n\\x{0B}\\f\\r\\x{85}\\p{Z}";  // Oniguruma's Unicode \s
}

std::string translate_onig_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  int depth = 0;  // bracket nesting: inside a character class when > 0
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      ++i;
      if (n == 's') {
        out += depth > 0 ? std::string(kOnigSpace) : "[" + std::string(kOnigSpace) + "]";
      } else if (n == 'S') {
        out += "[^" + std::string(kOnigSpace) + "]";  // a nested set inside brackets: ICU unions it
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (c == '[') {
      ++depth;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is a literal
      continue;
    }
    if (c == ']' && depth > 0) --depth;
    out += c;
  }
  return out;
}

struct Regex::Icu {
  std::unique_ptr<icu::RegexPattern> pattern;
  mutable std::mutex mu;
  mutable std::vector<std::unique_ptr<icu::RegexMatcher>> pool;
};

Regex::Regex(std::string pattern, const std::string& where, bool use_fast_path) : pattern_(std::move(pattern)) {
  if (use_fast_path) fast_ = static_cast<int>(fast_pattern_of(pattern_));
  if (fast_ != 0) return;
  icu_ = std::make_unique<Icu>();
  UErrorCode st = U_ZERO_ERROR;
  UParseError pe{};
  const std::string translated = translate_onig_pattern(pattern_);
  icu_->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(translated), 0, pe, st));
  if (U_FAILURE(st))
    fail("{}: invalid regex '{}': {} at offset {}", where, pattern_, u_errorName(st), pe.offset);
}

Regex::~Regex() = default;

void Regex::matches(std::string_view text, std::vector<Span>& out) const {
  if (fast_ != 0) {
    fast_pattern_matches(static_cast<FastPattern>(fast_), text, out);
    return;
  }
  std::unique_ptr<icu::RegexMatcher> m;
  UErrorCode st = U_ZERO_ERROR;
  {
    std::lock_guard<std::mutex> lock(icu_->mu);
    if (!icu_->pool.empty()) {
      m = std::move(icu_->pool.back());
      icu_->pool.pop_back();
    }
  }
  if (!m) m.reset(icu_->pattern->matcher(st));
  if (U_FAILURE(st)) fail("regex '{}': cannot make a matcher: {}", pattern_, u_errorName(st));
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &st);
  m->reset(ut);
  while (m->find(st)) {
    const auto b = static_cast<size_t>(m->start64(st));
    const auto e = static_cast<size_t>(m->end64(st));
    if (e > b) out.emplace_back(b, e);
  }
  m->reset(icu::UnicodeString());  // drop the UText before closing it
  utext_close(ut);
  if (U_FAILURE(st)) fail("regex '{}': matching failed: {}", pattern_, u_errorName(st));
  std::lock_guard<std::mutex> lock(icu_->mu);
  icu_->pool.push_back(std::move(m));
}

}  // namespace mcpp::hf
