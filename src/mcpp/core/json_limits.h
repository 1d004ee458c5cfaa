// Bounded JSON parsing: every JSON text the program reads from a file or a peer goes through here, so no
// file can drive a recursive walk (copy, dump, from_json, a visitor) past a fixed depth or make the parser
// hold more than a fixed number of bytes.
//
// Contract:
//   json_depth_error(text, max_depth)  scans the text once (outside strings, honouring escapes) and returns
//                                      the byte offset where nesting first exceeds max_depth, or npos. The
//                                      scan counts '[' and '{' exactly as a JSON parser nests, so a text that
//                                      passes parses (nlohmann's parser is iterative) into a value of depth
//                                      <= max_depth.
//   parse_json_limited(text, what, limits)   the depth scan, then nlohmann::json::parse; every failure is ONE
//                                      mcpp::Error naming `what` ("manifest /x/manifest.json"): "nests deeper
//                                      than 64 levels (at byte 1234)", "is not valid JSON (syntax error at
//                                      byte 17)", "has N bytes, more than M".
//   read_json_file(path, what, limits)  read_regular_file (regular files only: a FIFO is refused, not waited
//                                      on) + parse_json_limited.
// Limits: kMaxJsonDepth = 64 (the deepest JSON this program writes or reads — manifest meta, HF configs,
// tokenizer.json — nests under 10); max_bytes per call site.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mcpp {

inline constexpr int kMaxJsonDepth = 64;

struct JsonLimits {
  uint64_t max_bytes = uint64_t{256} << 20;  // 256 MiB
  int max_depth = kMaxJsonDepth;
};

size_t json_depth_error(std::string_view text, int max_depth);
nlohmann::json parse_json_limited(std::string_view text, const std::string& what, const JsonLimits& limits = {});
nlohmann::json read_json_file(const std::string& path, const std::string& what, const JsonLimits& limits = {});

// The JSON type name of j ("string", "number", "object", ...), for errors that name a field's wrong type.
std::string json_type_name(const nlohmann::json& j);

}  // namespace mcpp
