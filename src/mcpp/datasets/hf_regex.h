// Regular expressions of tokenizer.json (Hugging Face `tokenizers` compiles them with Oniguruma) run on UTF-8
// text through ICU, plus hand-written scanners for the patterns the supported families ship.
//
// Contract: matches(text) returns the [begin, end) byte ranges of the successive leftmost non-overlapping
// matches of the pattern, as Oniguruma's find_iter returns them (empty matches dropped).
// Oniguruma -> ICU: the patterns are Perl-style in both; the one difference these tokenizers meet is `\s`,
// which in Oniguruma's Unicode mode is U+0009..U+000D, U+0085 and the separators Zs / Zl / Zp, while ICU's
// `\s` lacks U+000B and U+0085. translate_onig_pattern rewrites `\s` / `\S` (in and out of brackets) to the
// explicit set. Character properties (\p{L}, \p{N}, ...) are ICU's (Unicode 15 for ICU 72).
// Fast paths: the GPT-2 / ByteLevel pattern and the Llama 3 / Qwen2 ("cl100k") pattern family are recognized by
// their exact text and scanned by hand (datasets/hf_fast_patterns.cpp, tests equal to the ICU path); any other
// pattern runs on ICU (~6 MB/s).
// Thread safety: matches() is const and thread-safe (ICU matchers come from a mutex-guarded pool).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mcpp::hf {

using Span = std::pair<size_t, size_t>;  // [begin, end) in bytes

std::string translate_onig_pattern(std::string_view onig);

class Regex {
 public:
  // Throws mcpp::Error "<where>: invalid regex '<pattern>': <ICU's reason>". use_fast_path = false forces ICU
  // (tests compare the two).
  Regex(std::string pattern, const std::string& where, bool use_fast_path = true);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  void matches(std::string_view text, std::vector<Span>& out) const;
  const std::string& pattern() const { return pattern_; }
  bool fast() const { return fast_ != 0; }

 private:
  struct Icu;
  std::string pattern_;
  int fast_ = 0;  // 0: ICU; else a FastPattern id (hf_fast_patterns.h)
  std::unique_ptr<Icu> icu_;
};

}  // namespace mcpp::hf
