// Config's JSON and math fingerprint, generated from the field tables (core/config_fields.h; for_each_field_table
// in config.h); contract in config.h.
#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/training/config.h"

namespace mcpp {

namespace {
// The JSON sections in order, each once ("model", "parallel", ...; two tables share "parallel").
std::vector<std::string> sections() {
  std::vector<std::string> out;
  const Config c;
  for_each_field_table(c, [&](const auto& table, const auto&) {
    if (std::find(out.begin(), out.end(), table.section) == out.end()) out.push_back(table.section);
  });
  return out;
}
}  // namespace

nlohmann::json Config::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const std::string& s : sections()) j[s] = nlohmann::json::object();
  for_each_field_table(*this,
                       [&](const auto& table, const auto& part) { config::write_json(table, part, j[table.section]); });
  return j;
}

Config Config::from_json(const nlohmann::json& j) {
  Config c;
  if (!j.is_object()) fail("config: expected a JSON object, got {}", j.type_name());
  const std::vector<std::string> known_sections = sections();
  for (const std::string& section : known_sections) {
    auto it = j.find(section);
    if (it == j.end()) continue;
    if (!it->is_object()) fail("{}: expected a table of fields, got {}", section, it->dump());
    for (const auto& item : it->items()) {
      const std::string key = item.key();  // a named copy: lambdas cannot capture structured bindings (clang 14)
      bool known = false;
      for_each_field_table(c, [&](const auto& table, const auto&) {
        known = known || (table.section == section && config::has_key(table, key));
      });
      if (!known) fail("{}.{}: unknown field", section, key);
    }
    for_each_field_table(c, [&](const auto& table, auto& part) {
      if (table.section == section) config::read_json(table, part, *it);
    });
  }
  std::string expected;
  for (const std::string& s : known_sections) expected += (expected.empty() ? "" : "|") + s;
  for (const auto& [key, _] : j.items())
    if (std::find(known_sections.begin(), known_sections.end(), key) == known_sections.end())
      fail("{}: unknown section (expected {})", key, expected);
  return c;
}

nlohmann::json Config::math_fields() const {
  nlohmann::json j = nlohmann::json::object();
  for_each_field_table(*this, [&](const auto& table, const auto& part) { config::add_math_fields(table, part, j); });
  return j;
}

std::string Config::fingerprint() const {
  std::string s = math_fields().dump();
  return fmt::format("{:016x}", static_cast<uint64_t>(XXH3_64bits(s.data(), s.size())));
}

std::vector<std::string> diff_math_fields(const nlohmann::json& a, const nlohmann::json& b) {
  std::set<std::string> keys;
  for (const auto& [k, _] : a.items()) keys.insert(k);
  for (const auto& [k, _] : b.items()) keys.insert(k);
  std::vector<std::string> out;
  for (const auto& k : keys) {
    bool in_a = a.contains(k), in_b = b.contains(k);
    if (in_a && in_b && a[k] == b[k]) continue;
    out.push_back(fmt::format("{}: {} vs {}", k, in_a ? a[k].dump() : "<absent>", in_b ? b[k].dump() : "<absent>"));
  }
  return out;
}

}  // namespace mcpp
