// A bound on TOML key nesting before toml++ sees the text: toml++ limits nested values (arrays, inline tables) to
// 256 but builds one table per component of a dotted key (`a.b.c = 1`, `[a.b.c]`) recursively, so a key of 100,000
// components crashes the parser (stack overflow). check_toml_text refuses such a text with one error.
//
// Contract: toml_key_depth_error(text, max_components) scans the text once, skipping comments and strings (basic,
//   literal, multi-line), and returns the byte offset of the first dotted chain of more than max_components
//   components (bare or quoted key parts joined by '.', whitespace allowed around the dots), or npos. Numbers
//   such as 1.5 are chains of two and never trip a bound >= 2.
// check_toml_text(text, what): that scan with kMaxTomlKeyComponents (64; Megatron recipes use 2), and a size
//   bound; an mcpp::Error naming `what` and the line otherwise.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace mcpp {

inline constexpr int kMaxTomlKeyComponents = 64;
inline constexpr uint64_t kMaxTomlBytes = uint64_t{16} << 20;

size_t toml_key_depth_error(std::string_view text, int max_components);
void check_toml_text(std::string_view text, const std::string& what);

}  // namespace mcpp
