// Hand-written scanners for the pre-tokenizer regexes the common tokenizer.json families ship, equal to the
// general ICU path of hf_regex.h on them (tests/datasets/hf_regex_test.cpp) at several times its speed:
//   kGpt2     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//             (ByteLevel's use_regex: GPT-2, GPT-NeoX, ...)
//   kLlama3   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2    the same with \p{N} (one digit a piece): Qwen2 / Qwen2.5 / Qwen3
// Classes are Oniguruma's in Unicode mode: \p{L} = Lu Ll Lt Lm Lo, \p{N} = Nd Nl No (ICU u_charType),
// \s = U+0009..U+000D, U+0085, Zs, Zl, Zp. The text must be valid UTF-8 (the tokenizer checks it first).
#pragma once
#include <string_view>
#include <vector>

#include "mcpp/datasets/hf_regex.h"

namespace mcpp::hf {

enum class FastPattern : int { kNone = 0, kGpt2 = 1, kLlama3 = 2, kQwen2 = 3 };

FastPattern fast_pattern_of(std::string_view pattern);
void fast_pattern_matches(FastPattern p, std::string_view text, std::vector<Span>& out);

}  // namespace mcpp::hf
