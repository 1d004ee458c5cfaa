// Training arguments: TOML recipe -> Config, then Megatron-named CLI11 flags written straight into the
// same Config (CLI11 writes a bound variable only when its flag is given, so flags override the file). The flags
// are generated from the config structs' field tables (core/config_fields.h; Config's for_each_field_table).
#include "mcpp/training/arguments.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <type_traits>
#include <utility>
#include <variant>

#include "mcpp/core/error.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/core/toml_limits.h"
#include "mcpp/dist_checkpointing/checkpoint.h"

namespace mcpp {

namespace {
// TOML value -> JSON value (tables, arrays, strings, integers, floats, booleans); dates are refused.
nlohmann::json toml_to_json(const toml::node& node, const std::string& path, const std::string& key) {
  if (const auto* t = node.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : *t) j[std::string(k.str())] = toml_to_json(v, path, std::string(k.str()));
    return j;
  }
  if (const auto* a = node.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : *a) j.push_back(toml_to_json(v, path, key));
    return j;
  }
  if (const auto* s = node.as_string()) return s->get();
  if (const auto* i = node.as_integer()) return i->get();
  if (const auto* f = node.as_floating_point()) return f->get();
  if (const auto* b = node.as_boolean()) return b->get();
  fail("{}: {}: unsupported TOML value type (dates/times)", path, key);
}
}  // namespace

std::set<std::string> load_toml_config(const std::string& path, Config& cfg) {
  toml::table tbl;
  // A regular file (a FIFO or directory is refused by name), its dotted keys bounded before toml++ nests them.
  const std::string text = read_regular_file(path, "--config file", kMaxTomlBytes);
  check_toml_text(text, path);
  try {
    tbl = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    fail("{}:{}:{}: {}", path, src.begin.line, src.begin.column, e.description());
  }
  nlohmann::json j = toml_to_json(tbl, path, "");
  // from_json starts from defaults; merge: overlay the file's keys onto the current cfg's JSON.
  nlohmann::json base = cfg.to_json();
  for (const auto& [section, fields] : j.items()) {
    if (!fields.is_object() || !base.contains(section)) {
      base[section] = fields;  // from_json reports the unknown section / non-table
      continue;
    }
    for (const auto& [key, value] : fields.items()) base[section][key] = value;
  }
  try {
    cfg = Config::from_json(base);
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  std::set<std::string> training_keys;
  if (j.contains("training") && j["training"].is_object())
    for (const auto& [key, value] : j["training"].items()) training_keys.insert(key);
  return training_keys;
}

std::string find_config_flag(const std::vector<std::string>& args) {
  std::string found;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) found = args[i + 1];
    else if (args[i].rfind("--config=", 0) == 0) found = args[i].substr(9);
  }
  return found;
}

namespace {
// Flag values CLI11 would silently saturate or pass on: an integer beyond int64 (CLI11 converts with strtoll,
// which saturates) and a float that is not finite (inf, nan, or out of range like 1e400) are refused, naming the
// flag ("--hidden-size: 99999999999999999999 is out of range (a 64-bit integer)"). Text that is no number at all is
// left to CLI11's own conversion error.
CLI::Validator int64_values() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        errno = 0;
        char* end = nullptr;
        (void)std::strtoll(v.c_str(), &end, 0);
        if (errno == ERANGE) return v + " is out of range (a 64-bit integer)";
        return "";
      },
      "");
}
template <class T>
CLI::Validator finite_values() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        const double d = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0') return "";  // not a number: CLI11's conversion error
        if (!std::isfinite(static_cast<T>(d))) return v + " is not a finite number";
        return "";
      },
      "");
}

// One CLI11 option per row of a field table, written straight into `part` (CLI11 writes only given flags).
template <class S>
void add_flags(CLI::App& app, const config::FieldTable<S>& table, S& part) {
  for (const config::Field<S>& f : table.rows) {
    if (f.flag_kind == config::FlagKind::None) continue;
    if (f.enum_from_string) {  // Megatron's strings; errors (mcpp::Error) name the field
      app.add_option_function<std::string>(
          f.flag_name, [&part, set = f.enum_from_string](const std::string& v) { set(part, v); }, f.help_text);
      continue;
    }
    std::visit(
        [&](auto member) {
          using M = decltype(member);
          if constexpr (std::is_same_v<M, std::monostate>) {
            fail("config field {}: no member to bind its flag {} to", f.key, f.flag_name);
          } else {
            auto& value = part.*member;
            using T = std::remove_reference_t<decltype(value)>;
            if constexpr (std::is_same_v<T, bool>) {
              if (f.flag_kind == config::FlagKind::StoreTrue) app.add_flag(f.flag_name, value, f.help_text);
              else if (f.flag_kind == config::FlagKind::StoreFalse)
                app.add_flag_callback(f.flag_name, [&value] { value = false; }, f.help_text);
              else fail("config field {}: a bool's flag {} must be store_true or store_false", f.key, f.flag_name);
            } else {
              CLI::Option* opt = app.add_option(f.flag_name, value, f.help_text);
              if (f.repeatable_) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
              if (f.nargs_ > 0) opt->expected(f.nargs_);
              if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::vector<int64_t>>)
                opt->check(int64_values());
              if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) opt->check(finite_values<T>());
            }
          }
        },
        f.member);
  }
}
}  // namespace

void add_train_flags(CLI::App& app, Config& cfg, std::string& config_file) {
  app.add_option("--config", config_file, "TOML recipe; flags given on the command line override it");
  for_each_field_table(cfg, [&](const auto& table, auto& part) { add_flags(app, table, part); });
}

namespace {
// Megatron's --use-checkpoint-args: the architecture fields (the model table's checkpoint_arg rows) from the config
// stored in the latest checkpoint under --load, over what the flags and the config file said; the vocabulary stays
// the tokenizer's (a mismatch is the load's named fingerprint error). No checkpoint there yet: the given arguments
// stand (as Megatron's).
void use_checkpoint_args(Config& cfg) {
  const std::string& dir = cfg.training.load;
  if (dir.empty()) fail("--use-checkpoint-args needs --load (the checkpoint whose model arguments to use)");
  if (dist_checkpointing::latest_iteration(dir) < 0 && dist_checkpointing::list_iterations(dir).empty()) return;
  const dist_checkpointing::CheckpointReader reader(dir);
  if (!reader.meta().contains("config"))
    fail("--use-checkpoint-args: checkpoint '{}' stores no config (manifest meta.config)", reader.dir());
  cfg.use_checkpoint_model_args(Config::from_json(reader.meta()["config"]).model);
}
}  // namespace

Config parse_train_args(const std::vector<std::string>& args) {
  Config cfg;
  std::string config_file = find_config_flag(args);
  std::set<std::string> file_training;
  if (!config_file.empty()) file_training = load_toml_config(config_file, cfg);
  CLI::App app{"mcpp train"};
  app.allow_extras(false);
  // A flag given twice takes its last value, as Megatron-LM's argparse does (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_train_flags(app, cfg, config_file);
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());  // `mcpp train --help`: the caller's catch of CLI::Success exits 0
    throw;
  }
  // A file value of lr_warmup_iters must not block a --lr-warmup-fraction on the command line (and
  // vice versa): the flag that is given wins (Megatron accepts only one of the two).
  if (app.count("--lr-warmup-fraction") && !app.count("--lr-warmup-iters")) cfg.optimizer.lr_warmup_iters = 0;
  if (app.count("--lr-warmup-iters") && !app.count("--lr-warmup-fraction")) cfg.optimizer.lr_warmup_fraction = 0;
  // Iteration- or sample-based training (Megatron accepts one): a flag overrides the file's other key; both flags, or
  // both keys in the file, are an error. Sample-based, train_iters is derived (Config::apply_world_size).
  const bool iters_flag = app.count("--train-iters") > 0, samples_flag = app.count("--train-samples") > 0;
  if (iters_flag && samples_flag)
    fail("--train-iters and --train-samples are both given; give one (iteration- or sample-based training)");
  if (iters_flag) cfg.training.train_samples = 0;
  if (cfg.training.train_samples > 0) {
    if (!samples_flag && file_training.count("train_iters"))
      fail("{}: train_iters and train_samples are both set; give one (iteration- or sample-based training)",
           config_file);
    cfg.training.train_iters = 0;
  }
  if (cfg.training.use_checkpoint_args) use_checkpoint_args(cfg);
  cfg.finalize();
  cfg.validate();
  return cfg;
}

std::string format_args(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> rows;
  nlohmann::json j = cfg.to_json();
  for (const auto& [section, fields] : j.items()) {
    for (const auto& [key, value] : fields.items()) {
      std::string text;
      if (value.is_string()) text = value.get<std::string>();
      else if (value.is_boolean()) text = value.get<bool>() ? "True" : "False";
      else text = value.dump();
      rows.emplace_back(key, text);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    std::string la = a.first, lb = b.first;
    std::transform(la.begin(), la.end(), la.begin(), ::tolower);
    std::transform(lb.begin(), lb.end(), lb.begin(), ::tolower);
    return la < lb;
  });
  std::string out = "------------------------ arguments ------------------------\n";
  for (const auto& [name, text] : rows) {
    size_t ndots = name.size() < 48 ? 48 - name.size() : 1;
    out += fmt::format("  {} {} {}\n", name, std::string(ndots, '.'), text);
  }
  out += "-------------------- end of arguments ---------------------\n";
  return out;
}

}  // namespace mcpp
