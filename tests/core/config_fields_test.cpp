// The config field tables (core/config_fields.h) over every config struct: each member has exactly one row, each
// row a JSON key, a flag or a reason for none, and a fingerprint decision; every key round-trips through the JSON
// and every flag sets its own field; the fingerprints of configs written before the tables existed are unchanged
// (the checkpoints' guard); non-finite, out-of-range and mistyped values are refused naming the field.
#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "mcpp/core/config_fields.h"
#include "core/core_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/training/arguments.h"
#include "mcpp/training/config.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;

// Calls f(table, part) for the tables of a default Config (the same walk the generators use).
template <class F>
void each_table(F&& f) {
  Config c;
  for_each_field_table(c, f);
}

// A value of the same JSON type that differs from v (enums: another of the values its help lists).
template <class S>
nlohmann::json other_value(const config::Field<S>& f, const nlohmann::json& v) {
  if (f.enum_from_string) {
    std::string list = f.help_text, item;
    std::vector<std::string> values;
    for (char ch : list + "|") {
      if (ch == '|')
        values.push_back(item), item.clear();
      else
        item += ch;
    }
    for (const std::string& s : values)
      if (s != v.get<std::string>()) return s;
    ADD_FAILURE() << f.key << ": no other value in its help '" << f.help_text << "'";
    return v;
  }
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() + 3;
  if (v.is_number()) return v.get<double>() == 0.0 ? 0.5 : v.get<double>() / 2;  // floats exact in a float
  if (v.is_string()) return v.get<std::string>() + "x";
  if (v.is_array() && f.is_int) return nlohmann::json::array({4, 2, 16});
  if (v.is_array()) return nlohmann::json::array({"a", "b"});
  ADD_FAILURE() << f.key << ": unexpected JSON " << v.dump();
  return v;
}

// The keys where two configs' JSON differ, as "section.key".
std::set<std::string> changed_keys(const nlohmann::json& a, const nlohmann::json& b) {
  std::set<std::string> out;
  for (const auto& [section, fields] : a.items())
    for (const auto& [key, value] : fields.items())
      if (b.at(section).at(key) != value) out.insert(section + "." + key);
  return out;
}

TEST(ConfigFields, TablesCoverEveryMember) {
  EXPECT_EQ(TransformerConfig::fields().rows.size(), config::member_count<TransformerConfig>());
  EXPECT_EQ(ParallelConfig::fields().rows.size(), config::member_count<ParallelConfig>());
  EXPECT_EQ(DistributedDataParallelConfig::fields().rows.size(), config::member_count<DistributedDataParallelConfig>());
  EXPECT_EQ(TrainingConfig::fields().rows.size(), config::member_count<TrainingConfig>());
  EXPECT_EQ(OptimizerConfig::fields().rows.size(), config::member_count<OptimizerConfig>());
  EXPECT_EQ(DataConfig::fields().rows.size(), config::member_count<DataConfig>());
  // and the combined Config is its six parts
  EXPECT_EQ(config::member_count<Config>(), 6u);
}

TEST(ConfigFields, EveryRowHasAKeyAFlagOrReasonAndAFingerprintDecision) {
  std::set<std::string> keys, flags;
  size_t rows = 0;
  each_table([&](const auto& table, const auto& part) {
    for (const auto& f : table.rows) {
      ++rows;
      SCOPED_TRACE(table.section + "." + f.key);
      EXPECT_FALSE(f.key.empty());
      EXPECT_TRUE(keys.insert(table.section + "." + f.key).second) << "key declared twice";
      if (f.flag_kind == config::FlagKind::None) {
        EXPECT_FALSE(f.no_flag_reason.empty()) << "no flag and no reason for it";
      } else {
        EXPECT_TRUE(f.flag_name.starts_with("--") && f.flag_name.size() > 2) << f.flag_name;
        EXPECT_TRUE(flags.insert(f.flag_name).second) << f.flag_name << " declared twice";
        // a bool is switched by its flag alone (store_true / store_false); everything else takes a value
        const bool is_bool = f.to_json(part).is_boolean();
        EXPECT_EQ(is_bool, f.flag_kind != config::FlagKind::Value) << f.flag_name;
      }
      EXPECT_NE(table.fingerprint_of(f), config::Fingerprint::Undecided) << "no fingerprint decision";
      if (f.range_) EXPECT_TRUE(f.is_float) << "a range on a non-float field";
      EXPECT_TRUE(f.to_json && f.from_json && f.copy);
    }
  });
  EXPECT_EQ(rows, Config{}.to_json()["model"].size() + Config{}.to_json()["parallel"].size() +
                      Config{}.to_json()["training"].size() + Config{}.to_json()["optimizer"].size() +
                      Config{}.to_json()["data"].size());
}

// Each key changed alone in the JSON: from_json -> to_json gives back exactly that change (the row reads and writes
// the same member, and no other).
TEST(ConfigFields, EveryKeyRoundTripsThroughJson) {
  const nlohmann::json base = Config{}.to_json();
  each_table([&](const auto& table, const auto&) {
    for (const auto& f : table.rows) {
      nlohmann::json j = base;
      j[table.section][f.key] = other_value(f, base[table.section][f.key]);
      const nlohmann::json back = Config::from_json(j).to_json();
      EXPECT_EQ(back, j) << table.section << "." << f.key;
      EXPECT_EQ(changed_keys(base, back), std::set<std::string>{table.section + "." + f.key});
    }
  });
}

// Each flag given alone sets its own field (and only it) to the value given.
TEST(ConfigFields, EveryFlagSetsItsField) {
  const nlohmann::json base = Config{}.to_json();
  each_table([&](const auto& table, const auto&) {
    for (const auto& f : table.rows) {
      if (f.flag_kind == config::FlagKind::None) continue;
      const nlohmann::json want = f.flag_kind == config::FlagKind::Value ? other_value(f, base[table.section][f.key])
                                  : f.flag_kind == config::FlagKind::StoreTrue ? nlohmann::json(true)
                                                                               : nlohmann::json(false);
      std::vector<std::string> args{f.flag_name};
      if (f.flag_kind == config::FlagKind::Value) {
        if (want.is_array())
          for (const auto& e : want) args.push_back(e.is_string() ? e.get<std::string>() : e.dump());
        else
          args.push_back(want.is_string() ? want.get<std::string>() : want.dump());
      }
      Config cfg;
      std::string config_file;
      CLI::App app{"test"};
      add_train_flags(app, cfg, config_file);
      std::vector<std::string> rev(args.rbegin(), args.rend());
      app.parse(rev);
      const nlohmann::json got = cfg.to_json();
      EXPECT_EQ(got[table.section][f.key], want) << f.flag_name;
      EXPECT_EQ(changed_keys(base, got), std::set<std::string>{table.section + "." + f.key}) << f.flag_name;
    }
  });
}

// The math fingerprints of configs as the build before the field tables computed them (commit c2ba0fb): what
// existing checkpoints store. A change here makes those checkpoints refuse to load.
TEST(ConfigFields, FingerprintsOfExistingCheckpointsUnchanged) {
  const std::string root = MCPP_SOURCE_DIR;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "903ddb7970bb29ce"},
      {{"--config", root + "/configs/demo.toml"}, "8f756213dd4bf62c"},
      {{"--config", root + "/configs/llama-tiny.toml"}, "912019639c8387b7"},
      {{"--config", root + "/configs/qwen3-tiny.toml"}, "72ea73990a59e317"},
      {{"--config", root + "/configs/deepseek-v3-tiny.toml"}, "4140e10665387e03"},
      {{"--position-embedding-type", "rope", "--swiglu", "--normalization", "RMSNorm",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias", "--group-query-attention",
        "--num-query-groups", "2"},
       "2fd686956f6d3a72"},
      {{"--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor", "32", "--rotary-percent",
        "0.5", "--rotary-base", "500000"},
       "dd290a806b954f11"},
      {{"--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", "4"}, "6fbae34996562c5c"},
      {{"--position-embedding-type", "none", "--max-position-embeddings", "128"}, "16e5224e9aa94f6e"},
      {{"--position-embedding-type", "rope", "--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank", "32",
        "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16"},
       "c4a8a43b9bcebd3e"},
      {{"--position-embedding-type", "rope", "--multi-latent-attention", "--rope-type", "rope",
        "--rotary-scaling-factor", "2", "--mscale-all-dim", "1"},
       "43e299fd78a389dc"},
      {{"--position-embedding-type", "rope", "--multi-latent-attention", "--rope-type", "yarn", "--mscale", "0.7",
        "--beta-fast", "16", "--beta-slow", "2", "--original-max-position-embeddings", "32", "--qk-layernorm"},
       "e85019807875a65a"},
      {{"--qk-layernorm"}, "13cfecc329b0a27f"},
      {{"--position-embedding-type", "rope", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"},
       "3bb9f85cef33feb5"},
      {{"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-router-pre-softmax",
        "--moe-aux-loss-coeff", "0.01"},
       "ef17188d92d4aa93"},
      {{"--num-experts", "4", "--moe-layer-freq", "[0,1]", "--moe-shared-expert-intermediate-size", "64",
        "--moe-shared-expert-gate", "--moe-router-topk-scaling-factor", "2.5"},
       "d83181cd4826b3f1"},
      {{"--num-experts", "8", "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-num-groups", "4", "--moe-router-group-topk", "2", "--moe-expert-capacity-factor", "1.5",
        "--moe-token-drop-policy", "position", "--moe-pad-expert-input-to-capacity"},
       "0092dc8e23affa96"},
      {{"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn", "--moe-router-topk", "1"},
       "e0c4ef2eb84c36f4"},
      {{"--num-experts", "4", "--moe-layer-freq", "2", "--moe-router-dtype", "fp32", "--moe-per-layer-logging",
        "--moe-input-jitter-eps", "0.01", "--moe-router-force-load-balancing", "--moe-router-bias-update-rate", "0.01"},
       "00ff8067beacc0aa"},
      {{"--attention-impl",
        "unfused",
        "--deterministic-mode",
        "--apply-query-key-layer-scaling",
        "--calculate-per-token-loss",
        "--hidden-dropout",
        "0",
        "--attention-dropout",
        "0.2",
        "--init-method-std",
        "0.01",
        "--make-vocab-size-divisible-by",
        "64",
        "--kv-channels",
        "32",
        "--ffn-hidden-size",
        "100",
        "--seq-length",
        "32",
        "--max-position-embeddings",
        "64",
        "--norm-epsilon",
        "1e-6"},
       "7772294553f79508"},
      // nothing outside the model enters it
      {{"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer",
        "--overlap-grad-reduce", "--overlap-param-gather", "--no-overwrite-main-grad", "--micro-batch-size", "2",
        "--lr", "3e-4", "--lr-decay-style", "cosine", "--split", "90,5,5"},
       "903ddb7970bb29ce"},
  };
  for (const auto& [args, fp] : cases) {
    std::string line;
    for (const auto& a : args) line += a + " ";
    EXPECT_EQ(parse_train_args(args).fingerprint(), fp) << line;
  }
}

// What a flag value must be: a finite number, an integer within int64; else one named error (CLI::ParseError, which
// the CLI prints as one "error:" line and exit code 2).
TEST(ConfigFields, RefusesNonFiniteAndOutOfRangeFlagValues) {
  const auto parse_error = [](const std::vector<std::string>& args) -> std::string {
    try {
      parse_train_args(args);
    } catch (const CLI::ParseError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a ParseError: ") + e.what();
    }
    return "no error";
  };
  for (const char* v : {"inf", "-inf", "nan", "1e400"}) {
    EXPECT_EQ(parse_error({"--adam-eps", v}), std::string("--adam-eps: ") + v + " is not a finite number");
    EXPECT_EQ(parse_error({"--init-method-std", v}),
              std::string("--init-method-std: ") + v + " is not a finite number");
  }
  EXPECT_EQ(parse_error({"--norm-epsilon", "1e39"}), "--norm-epsilon: 1e39 is not a finite number");  // > FLT_MAX
  EXPECT_EQ(parse_error({"--moe-expert-capacity-factor", "1e400"}),
            "--moe-expert-capacity-factor: 1e400 is not a finite number");  // a double field
  EXPECT_EQ(parse_error({"--hidden-size", "99999999999999999999"}),
            "--hidden-size: 99999999999999999999 is out of range (a 64-bit integer)");
  EXPECT_EQ(parse_error({"--seed", "-99999999999999999999"}),
            "--seed: -99999999999999999999 is out of range (a 64-bit integer)");
  EXPECT_EQ(parse_error({"--rampup-batch-size", "1", "99999999999999999999", "3"}),
            "--rampup-batch-size: 99999999999999999999 is out of range (a 64-bit integer)");
  EXPECT_EQ(parse_error({"--num-layers", "two"}), "Could not convert: --num-layers = two");  // CLI11's own
}

// The mcpp::Error message of parse_train_args(args), or "" when it parses.
std::string error(const std::vector<std::string>& args) {
  return mcpp::testing::error_of([&] { parse_train_args(args); });
}

// The declared ranges (validate), by name: "hidden_dropout must be in [0, 1), got 1".
TEST(ConfigFields, FloatsOutsideTheirRangeNameTheField) {
  EXPECT_EQ(error({"--hidden-dropout", "1"}), "hidden_dropout must be in [0, 1), got 1");
  EXPECT_EQ(error({"--attention-dropout", "-0.5"}), "attention_dropout must be in [0, 1), got -0.5");
  EXPECT_EQ(error({"--norm-epsilon", "0"}), "norm_epsilon must be positive, got 0");
  EXPECT_EQ(error({"--init-method-std", "-0.02"}), "init_method_std must be positive, got -0.02");
  EXPECT_EQ(error({"--adam-eps", "0"}), "adam_eps must be positive, got 0");
  EXPECT_EQ(error({"--adam-beta2", "1"}), "adam_beta2 must be in [0, 1), got 1");
  EXPECT_EQ(error({"--weight-decay", "-1"}), "weight_decay must be >= 0, got -1");
  EXPECT_EQ(error({"--lr-warmup-fraction", "1.5"}), "lr_warmup_fraction must be in [0, 1], got 1.5");
  EXPECT_EQ(error({"--rotary-percent", "0"}), "rotary_percent must be in (0, 1], got 0");
  EXPECT_EQ(error({"--distributed-timeout-minutes", "0"}), "distributed_timeout_minutes must be positive, got 0");
  EXPECT_EQ(error({"--moe-aux-loss-coeff", "-0.1"}), "moe_aux_loss_coeff must be >= 0, got -0.1");
  // and a programmatic config (no flag, no JSON) gets the same check
  Config c;
  c.finalize();
  c.optimizer.adam_eps = std::numeric_limits<float>::infinity();
  EXPECT_THROW(c.validate(), Error);
}

fs::path temp_file(const std::string& name, const std::string& text) {
  fs::path dir = fs::temp_directory_path() / "mcpp_config_fields_test";
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p) << text;
  return p;
}

// TOML and JSON values: finite numbers, integers within int64, the right type — each refused naming
// "section.key", never a raw library message.
TEST(ConfigFields, TomlAndJsonValuesAreCheckedByName) {
  const std::string inf = temp_file("inf.toml", "[optimizer]\nlr = inf\n").string();
  EXPECT_EQ(error({"--config", inf}), inf + ": optimizer.lr: expected a finite number, got inf");
  const std::string nan = temp_file("nan.toml", "[model]\nhidden_dropout = nan\n").string();
  EXPECT_EQ(error({"--config", nan}), nan + ": model.hidden_dropout: expected a finite number, got nan");
  const std::string big = temp_file("big.toml", "[model]\nnorm_epsilon = 1e300\n").string();
  EXPECT_EQ(error({"--config", big}), big + ": model.norm_epsilon: 1e+300 is out of range for a float");
  const std::string type = temp_file("type.toml", "[training]\nseed = \"7\"\n").string();
  EXPECT_EQ(error({"--config", type}), type + ": training.seed: expected an integer, got \"7\"");
  // a JSON integer beyond int64 (nlohmann keeps it unsigned): refused, not wrapped to a negative value
  nlohmann::json j = Config{}.to_json();
  j["model"]["hidden_size"] = uint64_t{18446744073709551615ull};
  try {
    Config::from_json(j);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "model.hidden_size: 18446744073709551615 is out of range (a 64-bit integer)");
  }
  j = Config{}.to_json();
  j["training"]["rampup_batch_size"] = nlohmann::json::array({1, "2", 3});
  try {
    Config::from_json(j);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "training.rampup_batch_size: expected a list of integers, got [1,\"2\",3]");
  }
  // --config must name a regular file
  const fs::path dir = fs::temp_directory_path() / "mcpp_config_fields_test";
  EXPECT_EQ(error({"--config", dir.string()}), "--config file " + dir.string() + " is a directory, not a regular file");
}

}  // namespace
}  // namespace mcpp
