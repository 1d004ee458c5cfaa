// Bounded JSON parsing; see json_limits.h.
#include "mcpp/core/json_limits.h"

#include "mcpp/core/error.h"
#include "mcpp/core/regular_file.h"

namespace mcpp {

size_t json_depth_error(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

nlohmann::json parse_json_limited(std::string_view text, const std::string& what, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    fail("{} has {} bytes of JSON, more than the {} any such file may have (damaged?)", what, text.size(),
         limits.max_bytes);
  const size_t at = json_depth_error(text, limits.max_depth);
  if (at != std::string_view::npos)
    fail("{}: JSON nests deeper than {} levels (at byte {}); refusing it (damaged or not ours)", what,
         limits.max_depth, at);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 3: syntax error ..." — or
    // out_of_range.406 for a number past double's range (1e99999: found by the manifest fuzzer)
    std::string msg = e.what();
    const size_t p = msg.find("] ");
    fail("{} is not valid JSON ({})", what, p == std::string::npos ? msg : msg.substr(p + 2));
  }
}

nlohmann::json read_json_file(const std::string& path, const std::string& what, const JsonLimits& limits) {
  const std::string text = read_regular_file(path, what, limits.max_bytes);
  return parse_json_limited(text, fmt::format("{} {}", what, path), limits);
}

std::string json_type_name(const nlohmann::json& j) { return j.type_name(); }

}  // namespace mcpp
