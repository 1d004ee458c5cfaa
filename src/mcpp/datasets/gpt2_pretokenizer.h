// GPT-2 pre-tokenization: splits UTF-8 text into the pieces that BPE then encodes one by one.
//
// Contract: the pieces are exactly the matches of OpenAI's pattern as the JS reference encoder (npm
// gpt-3-encoder) runs it with the /u flag:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// implemented by hand as a scanner over code points (std::regex has no \p{..}). Classes:
//   \p{L} = general categories Lu Ll Lt Lm Lo, \p{N} = Nd Nl No (ICU u_charType),
//   \s    = JS WhiteSpace + LineTerminator: U+0009..U+000D, U+FEFF, U+2028, U+2029 and category Zs.
// The pieces tile the input: concatenated they give back the input byte for byte.
// Invalid UTF-8: each offending byte is one unit of class "other" (what the JS sees as U+FFFD, which is
// category So); it stays a raw byte in its piece, so byte-level BPE still encodes and decodes it.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace mcpp::gpt2 {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// Class of one Unicode code point (cp < 0 marks an invalid UTF-8 byte -> kOther).
CharClass classify(int32_t cp);

// Decodes one UTF-8 code point starting at s[i]; returns its byte length (>= 1) and sets cp
// (cp = -1 for an invalid byte: bad lead, bad continuation, overlong, surrogate, > U+10FFFF).
int decode_utf8(std::string_view s, size_t i, int32_t& cp);

// Appends the pieces of `text` (views into it) to `out`, in order.
void pretokenize(std::string_view text, std::vector<std::string_view>& out);

}  // namespace mcpp::gpt2
