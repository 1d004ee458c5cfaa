// JSON readers and range messages of the config field tables; contract in config_fields.h.
#include "mcpp/core/config_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>

#include "mcpp/core/error.h"

namespace mcpp::config {

namespace {
[[noreturn]] void bad_type(const std::string& where, const char* want, const nlohmann::json& got) {
  fail("{}: expected {}, got {}", where, want, got.dump());
}
// An integer JSON value as int64 (nlohmann keeps integers above INT64_MAX as unsigned: refused, never wrapped).
int64_t int_of(const nlohmann::json& x, const std::string& where, const char* want, const nlohmann::json& whole) {
  if (!x.is_number_integer()) bad_type(where, want, whole);
  if (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail("{}: {} is out of range (a 64-bit integer)", where, x.dump());
  return x.get<int64_t>();
}
}  // namespace

std::string Range::describe() const {
  const bool upper = std::isfinite(max), lower = std::isfinite(min);
  if (lower && !upper) {
    if (min == 0.0 && min_open) return "positive";
    return fmt::format("{} {}", min_open ? ">" : ">=", min);
  }
  if (upper && !lower) return fmt::format("{} {}", max_open ? "<" : "<=", max);
  return fmt::format("in {}{}, {}{}", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
}

nlohmann::json json_of_float(float x) { return std::stod(fmt::format("{}", x)); }

bool read_bool(const nlohmann::json& x, const std::string& where) {
  if (!x.is_boolean()) bad_type(where, "true/false", x);
  return x.get<bool>();
}

int64_t read_int(const nlohmann::json& x, const std::string& where) { return int_of(x, where, "an integer", x); }

double read_number(const nlohmann::json& x, const std::string& where) {
  if (!x.is_number()) bad_type(where, "a number", x);
  const double v = x.get<double>();
  if (!std::isfinite(v)) fail("{}: expected a finite number, got {}", where, v);
  return v;
}

float read_float(const nlohmann::json& x, const std::string& where) {
  const double v = read_number(x, where);
  const auto f = static_cast<float>(v);
  if (!std::isfinite(f)) fail("{}: {} is out of range for a float", where, v);
  return f;
}

std::string read_string(const nlohmann::json& x, const std::string& where) {
  if (!x.is_string()) bad_type(where, "a string", x);
  return x.get<std::string>();
}

std::vector<std::string> read_strings(const nlohmann::json& x, const std::string& where) {
  if (x.is_string()) return {x.get<std::string>()};
  if (!x.is_array()) bad_type(where, "a list of strings", x);
  std::vector<std::string> out;
  for (const auto& e : x) {
    if (!e.is_string()) bad_type(where, "a list of strings", x);
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<int64_t> read_ints(const nlohmann::json& x, const std::string& where) {
  if (!x.is_array()) bad_type(where, "a list of integers", x);
  std::vector<int64_t> out;
  for (const auto& e : x) out.push_back(int_of(e, where, "a list of integers", x));
  return out;
}

void fail_range(const std::string& key, const Range& r, double value) {
  fail("{} must be {}, got {}", key, r.describe(), value);
}

void fail_not_finite(const std::string& key, double v) { fail("{} must be a finite number, got {}", key, v); }

void require_positive(int64_t v, const char* field) {
  if (v <= 0) fail("{} must be positive, got {}", field, v);
}

void require_non_negative(int64_t v, const char* field) {
  if (v < 0) fail("{} must be >= 0, got {}", field, v);
}

}  // namespace mcpp::config
