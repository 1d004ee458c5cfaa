// TransformerConfig's MoE layer pattern (Megatron's --moe-layer-freq): the integer form and the Python list
// expression; contract in transformer_config.h (moe_layer_pattern / is_moe_layer / num_moe_layers).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

namespace {
// Megatron's --moe-layer-freq list form: a Python expression of lists of integers, '+' (concatenation), '*' by an
// integer (repetition, either side) and parentheses, evaluated by recursive descent.
class LayerFreqParser {
 public:
  explicit LayerFreqParser(const std::string& text) : s_(text) {}
  std::vector<int64_t> parse() {
    std::vector<int64_t> v = sum();
    skip();
    if (i_ != s_.size()) error("unexpected '{}'", s_[i_]);
    return v;
  }

 private:
  template <class... A> [[noreturn]] void error(fmt::format_string<A...> f, A&&... a) {
    fail("moe_layer_freq: '{}' is not an integer or a list expression such as \"([1]*3+[0])*2\" (at character "
         "{}: {})", s_, i_ + 1, fmt::format(f, std::forward<A>(a)...));
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  bool at_digit() {
    skip();
    return i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]));
  }
  int64_t integer() {
    if (!at_digit()) error("expected an integer");
    int64_t v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      v = v * 10 + (s_[i_++] - '0');
      if (v > 1'000'000) error("integer too large");
    }
    return v;
  }
  std::vector<int64_t> sum() {
    std::vector<int64_t> v = product();
    while (eat('+')) {
      std::vector<int64_t> w = product();
      v.insert(v.end(), w.begin(), w.end());
    }
    return v;
  }
  std::vector<int64_t> repeat(const std::vector<int64_t>& v, int64_t times) {
    if (static_cast<int64_t>(v.size()) * times > 1'000'000) error("the pattern is too long");
    std::vector<int64_t> out;
    for (int64_t t = 0; t < times; ++t) out.insert(out.end(), v.begin(), v.end());
    return out;
  }
  std::vector<int64_t> product() {
    std::vector<int64_t> v;
    if (at_digit()) {  // N * list
      const int64_t times = integer();
      if (!eat('*')) error("an integer alone is not a list");
      v = repeat(atom(), times);
    } else {
      v = atom();
    }
    while (eat('*')) v = repeat(v, integer());
    return v;
  }
  std::vector<int64_t> atom() {
    if (eat('(')) {
      std::vector<int64_t> v = sum();
      if (!eat(')')) error("expected ')'");
      return v;
    }
    if (!eat('[')) error("expected '[' or '('");
    std::vector<int64_t> v;
    if (eat(']')) return v;
    do v.push_back(integer());
    while (eat(','));
    if (!eat(']')) error("expected ',' or ']'");
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};
}  // namespace

std::vector<bool> TransformerConfig::moe_layer_pattern() const {
  std::vector<bool> pattern(static_cast<size_t>(std::max<int64_t>(num_layers, 0)), false);
  if (num_moe_experts <= 0) return pattern;
  std::string text = moe_layer_freq;
  text.erase(0, text.find_first_not_of(" \t"));
  text.erase(text.find_last_not_of(" \t") + 1);
  const bool integer = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (integer) {
    if (text.size() > 9 || std::stoll(text) < 1)
      fail("moe_layer_freq: '{}' must be a positive integer (every N-th layer is a MoE layer) or a list expression",
           moe_layer_freq);
    const int64_t every = std::stoll(text);
    for (int64_t i = 0; i < num_layers; ++i) pattern[static_cast<size_t>(i)] = i % every == 0;
    return pattern;
  }
  const std::vector<int64_t> v = LayerFreqParser(text).parse();
  if (static_cast<int64_t>(v.size()) != num_layers)
    fail("moe_layer_freq: the pattern '{}' has {} entries; it needs one per layer (num_layers {})", moe_layer_freq,
         v.size(), num_layers);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0 && v[i] != 1)
      fail("moe_layer_freq: entry {} of '{}' is {}; entries are 1 (MoE layer) or 0 (dense layer)", i, moe_layer_freq,
           v[i]);
    pattern[i] = v[i] == 1;
  }
  return pattern;
}

bool TransformerConfig::is_moe_layer(int64_t layer) const {
  const std::vector<bool> p = moe_layer_pattern();
  MCPP_CHECK(layer >= 0 && layer < static_cast<int64_t>(p.size()), "is_moe_layer: layer {} of {}", layer, p.size());
  return p[static_cast<size_t>(layer)];
}

int64_t TransformerConfig::num_moe_layers() const {
  const std::vector<bool> p = moe_layer_pattern();
  return std::count(p.begin(), p.end(), true);
}

}  // namespace mcpp
