// TOML key-depth pre-scan; see toml_limits.h.
#include "mcpp/core/toml_limits.h"

#include <algorithm>

#include "mcpp/core/error.h"

namespace mcpp {
namespace {

bool bare_key_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '+';  // '+': exponents (1.5e+3) stay one token
}

// End (one past) of the string starting at text[i] (a quote), or text.size() when unterminated.
size_t skip_string(std::string_view text, size_t i) {
  const char q = text[i];
  const bool multi = text.substr(i, 3) == std::string_view(q == '"' ? "\"\"\"" : "'''");
  if (multi) {
    size_t j = i + 3;
    while (j < text.size()) {
      if (q == '"' && text[j] == '\\') {
        j += 2;
        continue;
      }
      if (text.substr(j, 3) == text.substr(i, 3)) {
        j += 3;
        while (j < text.size() && text[j] == q) ++j;  // up to two quotes of content may end the string
        return j;
      }
      ++j;
    }
    return text.size();
  }
  size_t j = i + 1;
  while (j < text.size() && text[j] != q && text[j] != '\n') {
    if (q == '"' && text[j] == '\\') ++j;
    ++j;
  }
  return std::min(j + 1, text.size());
}

}  // namespace

size_t toml_key_depth_error(std::string_view text, int max_components) {
  int chain = 0;         // components of the current dotted chain
  bool in_token = false;  // inside a bare token or right after a quoted one
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '#') {  // comment to end of line
      while (i < text.size() && text[i] != '\n') ++i;
      chain = 0, in_token = false;
      continue;
    }
    if (c == '"' || c == '\'') {
      if (!in_token) chain = chain > 0 ? chain : 1;
      in_token = true;
      i = skip_string(text, i);
      continue;
    }
    if (bare_key_char(c)) {
      if (!in_token && chain == 0) chain = 1;
      in_token = true;
      ++i;
      continue;
    }
    if (c == '.') {
      if (++chain > max_components) return i;
      in_token = false;
      ++i;
      continue;
    }
    if (c == ' ' || c == '\t') {  // whitespace around dots keeps the chain
      in_token = false;
      ++i;
      continue;
    }
    chain = 0, in_token = false;  // '=', brackets, commas, newlines end a chain
    ++i;
  }
  return std::string_view::npos;
}

void check_toml_text(std::string_view text, const std::string& what) {
  if (text.size() > kMaxTomlBytes)
    fail("{} has {} bytes, more than the {} a TOML recipe may have", what, text.size(), kMaxTomlBytes);
  const size_t at = toml_key_depth_error(text, kMaxTomlKeyComponents);
  if (at != std::string_view::npos)
    fail("{}:{}: a dotted key of more than {} components (refusing it: toml++ would nest that many tables)", what,
         1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'), kMaxTomlKeyComponents);
}

}  // namespace mcpp
