// Config fields declared once (DESIGN.md decision 6). Each config struct (TransformerConfig, ParallelConfig,
// DistributedDataParallelConfig, TrainingConfig, OptimizerConfig, DataConfig) has ONE table,
//   static const config::FieldTable<S>& fields();
// whose rows name, per member: its JSON / TOML key (the member's name), its Megatron flag (or why it has none) and
// help, the flag's kind, a natural range for floats, whether and how it enters the checkpoint's math fingerprint,
// and whether --use-checkpoint-args copies it. From these tables are generated: the CLI11 flags
// (training/arguments.cpp), to_json / from_json (unknown keys and wrong types named "section.key"; TOML goes
// through JSON), the --print-config listing, Config::math_fields() / fingerprint() and --use-checkpoint-args
// (training/config.cpp). tests/core/config_fields_test.cpp walks every table (each member covered, each row
// decided) and round-trips the JSON.
//
// ADDING A FIELD: one member line in the struct (with its default and a comment) and one row in the struct's
// fields() table, in the same position, e.g.
//   MCPP_FIELD(moe_router_topk).flag("--moe-router-topk", "experts per token").fingerprint_when(has_experts)
//       .checkpoint_arg(),
// plus its validation in the struct's validate() when it has rules beyond the row's range. Rows:
//   MCPP_FIELD(m)                   bool, int64_t, float, double, std::string, std::vector<std::string|int64_t>
//   MCPP_ENUM_FIELD(m, to_s, parse) an enum written as Megatron's strings (to_s(v), parse(s, field))
//   .flag(f, help) | .store_true(f, help) | .store_false(f, help) | .no_flag(why)   exactly one
//   .repeatable()  list flag whose repeats append (--data-path a --data-path b); .nargs(n): exactly n values
//   .range(Range::...)   floats: checked (with finiteness, which every float gets) by validate() / check_fields
//   .fingerprint() | .no_fingerprint() | .fingerprint_when(pred) | .fingerprint_as(key, value, pred)   exactly
//       one, unless the table's default decides (Config's non-model tables: nothing outside the model changes
//       the function a checkpoint computes). A field added to the fingerprint must be absent at its default
//       (fingerprint_when) so that older checkpoints keep their fingerprint.
//   .checkpoint_arg() | .checkpoint_arg_when(pred on the checkpoint's config)   --use-checkpoint-args copies it
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace mcpp::config {

// How a field's command-line flag takes its value.
enum class FlagKind {
  Value,       // --flag VALUE (a list field: --flag V1 V2 ...); a repeated flag: the last one wins (argparse)
  StoreTrue,   // --flag sets the bool true
  StoreFalse,  // --flag sets the bool false (--disable-bias-linear -> add_bias_linear = false)
  None,        // no flag (Field::no_flag says why)
};

// Whether a field enters the checkpoint's math fingerprint (Config::math_fields).
enum class Fingerprint {
  Undecided,  // no decision yet: a table error (ConfigFields tests)
  Never,
  Always,
  When,  // Field::fingerprint_when / fingerprint_as: only when the rule holds
};

// A natural range of a float field ("must be positive", "must be in [0, 1)").
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false, max_open = false;
  static Range positive() { return {0.0, std::numeric_limits<double>::infinity(), true, false}; }
  static Range non_negative() { return {0.0, std::numeric_limits<double>::infinity(), false, false}; }
  static Range unit_open() { return {0.0, 1.0, false, true}; }       // [0, 1): dropout, Adam's betas
  static Range unit_closed() { return {0.0, 1.0, false, false}; }    // [0, 1]
  static Range unit_left_open() { return {0.0, 1.0, true, false}; }  // (0, 1]
  bool contains(double v) const { return (min_open ? v > min : v >= min) && (max_open ? v < max : v <= max); }
  std::string describe() const;  // "positive", ">= 0", "in [0, 1)"
};

// One row of a FieldTable<S>: a member of S, type-erased for the generators.
template <class S>
struct Field {
  // The member, for binding a CLI11 option to it (enums: enum_from_string instead).
  using Member = std::variant<std::monostate, bool S::*, int64_t S::*, float S::*, double S::*, std::string S::*,
                              std::vector<std::string> S::*, std::vector<int64_t> S::*>;
  std::string key;  // JSON / TOML key: the member's name
  Member member;
  bool is_float = false;  // float or double (finite, range)
  bool is_int = false;    // int64_t or std::vector<int64_t> (int64 range of flag values)
  std::function<nlohmann::json(const S&)> to_json;
  // Reads a JSON value into the member: errors (mcpp::Error) name `where` ("section.key").
  std::function<void(S&, const nlohmann::json&, const std::string& where)> from_json;
  std::function<void(S& to, const S& from)> copy;
  std::function<double(const S&)> number;                        // floats: the value (range checks)
  std::function<void(S&, const std::string&)> enum_from_string;  // enums: the flag's string (errors name key)

  FlagKind flag_kind = FlagKind::None;
  std::string flag_name;  // "--num-layers"
  std::string help_text;  // the flag's help ("" = none)
  std::string no_flag_reason;
  bool repeatable_ = false;  // list flag: repeats append (CLI11's TakeAll) instead of the last one winning
  int nargs_ = 0;            // list flag: exactly this many values (0 = any)
  std::optional<Range> range_;

  Fingerprint fingerprint_rule = Fingerprint::Undecided;
  std::function<bool(const S&)> fingerprint_if;               // Fingerprint::When
  std::string fingerprint_key;                                // "" = key (a derived entry: "qkv_bias")
  std::function<nlohmann::json(const S&)> fingerprint_value;  // null = to_json

  bool from_checkpoint = false;                            // --use-checkpoint-args copies it ...
  std::function<bool(const S& saved)> from_checkpoint_if;  // ... when this holds (null = always)

  // ---- row builders (chained on the temporary MCPP_FIELD returns)
  Field&& flag_(FlagKind k, std::string f, std::string h) && {
    flag_kind = k;
    flag_name = std::move(f);
    help_text = std::move(h);
    return std::move(*this);
  }
  Field&& flag(std::string f, std::string h = "") && { return std::move(*this).flag_(FlagKind::Value, f, h); }
  Field&& store_true(std::string f, std::string h = "") && { return std::move(*this).flag_(FlagKind::StoreTrue, f, h); }
  Field&& store_false(std::string f, std::string h = "") && {
    return std::move(*this).flag_(FlagKind::StoreFalse, f, h);
  }
  Field&& no_flag(std::string why) && {
    flag_kind = FlagKind::None;
    no_flag_reason = std::move(why);
    return std::move(*this);
  }
  Field&& repeatable() && {
    repeatable_ = true;
    return std::move(*this);
  }
  Field&& nargs(int n) && {
    nargs_ = n;
    return std::move(*this);
  }
  Field&& range(Range r) && {
    range_ = r;
    return std::move(*this);
  }
  Field&& fingerprint() && {
    fingerprint_rule = Fingerprint::Always;
    return std::move(*this);
  }
  Field&& no_fingerprint() && {
    fingerprint_rule = Fingerprint::Never;
    return std::move(*this);
  }
  Field&& fingerprint_when(std::function<bool(const S&)> pred) && {
    fingerprint_rule = Fingerprint::When;
    fingerprint_if = std::move(pred);
    return std::move(*this);
  }
  // A derived entry: `name` = value(s), when pred holds (null: always).
  Field&& fingerprint_as(std::string name, std::function<nlohmann::json(const S&)> value,
                         std::function<bool(const S&)> pred = nullptr) && {
    fingerprint_rule = pred ? Fingerprint::When : Fingerprint::Always;
    fingerprint_if = std::move(pred);
    fingerprint_key = std::move(name);
    fingerprint_value = std::move(value);
    return std::move(*this);
  }
  Field&& checkpoint_arg() && {
    from_checkpoint = true;
    return std::move(*this);
  }
  Field&& checkpoint_arg_when(std::function<bool(const S&)> pred) && {
    from_checkpoint = true;
    from_checkpoint_if = std::move(pred);
    return std::move(*this);
  }
};

// A struct's rows, in declaration order. section: its JSON / TOML section ("model"); default_fingerprint:
// the decision of rows that make none (Undecided: every row must decide).
template <class S>
struct FieldTable {
  std::string section;
  Fingerprint default_fingerprint = Fingerprint::Undecided;
  std::vector<Field<S>> rows;
  Fingerprint fingerprint_of(const Field<S>& f) const {
    return f.fingerprint_rule == Fingerprint::Undecided ? default_fingerprint : f.fingerprint_rule;
  }
};

// ---------------------------------------------------------------- JSON values
// Floats go out as the double nearest their shortest decimal form (1e-05, not 9.99999974e-06): the JSON
// reads as written and still converts back to the identical float.
nlohmann::json json_of_float(float x);
// The readers (errors name `where`, one line): the JSON type, int64 range, finiteness.
bool read_bool(const nlohmann::json& x, const std::string& where);
int64_t read_int(const nlohmann::json& x, const std::string& where);
double read_number(const nlohmann::json& x, const std::string& where);  // finite
float read_float(const nlohmann::json& x, const std::string& where);    // finite as a float too
std::string read_string(const nlohmann::json& x, const std::string& where);
std::vector<std::string> read_strings(const nlohmann::json& x, const std::string& where);  // a string: [it]
std::vector<int64_t> read_ints(const nlohmann::json& x, const std::string& where);
// value: the field's JSON value (a float's shortest decimal), printed as "1", "0.1", "-0.5"
[[noreturn]] void fail_range(const std::string& key, const Range& r, double value);
[[noreturn]] void fail_not_finite(const std::string& key, double v);

template <class S, class T>
Field<S> field(T S::*m, const char* key) {
  Field<S> f;
  f.key = key;
  f.member = m;
  f.copy = [m](S& to, const S& from) { to.*m = from.*m; };
  if constexpr (std::is_same_v<T, float>) {
    f.is_float = true;
    f.to_json = [m](const S& s) { return json_of_float(s.*m); };
    f.from_json = [m](S& s, const nlohmann::json& x, const std::string& w) { s.*m = read_float(x, w); };
    f.number = [m](const S& s) { return static_cast<double>(s.*m); };
  } else if constexpr (std::is_same_v<T, double>) {
    f.is_float = true;
    f.to_json = [m](const S& s) { return nlohmann::json(s.*m); };
    f.from_json = [m](S& s, const nlohmann::json& x, const std::string& w) { s.*m = read_number(x, w); };
    f.number = [m](const S& s) { return s.*m; };
  } else {
    f.to_json = [m](const S& s) { return nlohmann::json(s.*m); };
    if constexpr (std::is_same_v<T, bool>) {
      f.from_json = [m](S& s, const nlohmann::json& x, const std::string& w) { s.*m = read_bool(x, w); };
    } else if constexpr (std::is_same_v<T, int64_t>) {
      f.is_int = true;
      f.from_json = [m](S& s, const nlohmann::json& x, const std::string& w) { s.*m = read_int(x, w); };
    } else if constexpr (std::is_same_v<T, std::string>) {
      f.from_json = [m](S& s, const nlohmann::json& x, const std::string& w) { s.*m = read_string(x, w); };
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      f.from_json = [m](S& s, const nlohmann::json& x, const std::string& w) { s.*m = read_strings(x, w); };
    } else {
      static_assert(std::is_same_v<T, std::vector<int64_t>>, "config field of an unsupported type");
      f.is_int = true;
      f.from_json = [m](S& s, const nlohmann::json& x, const std::string& w) { s.*m = read_ints(x, w); };
    }
  }
  return f;
}

// An enum written as a string: to_s(value), parse(string, field name) (throws mcpp::Error naming the field).
template <class S, class E>
Field<S> enum_field(E S::*m, const char* key, std::string (*to_s)(E),
                    E (*parse)(const std::string&, std::string_view)) {
  static_assert(std::is_enum_v<E>);
  Field<S> f;
  f.key = key;
  f.copy = [m](S& to, const S& from) { to.*m = from.*m; };
  f.to_json = [m, to_s](const S& s) { return nlohmann::json(to_s(s.*m)); };
  f.from_json = [m, parse](S& s, const nlohmann::json& x, const std::string& w) { s.*m = parse(read_string(x, w), w); };
  const std::string name = key;
  f.enum_from_string = [m, parse, name](S& s, const std::string& v) { s.*m = parse(v, name); };
  return f;
}

// The integer rules every validate() shares: one mcpp::Error naming the field ("seed must be >= 0, got -1").
void require_positive(int64_t v, const char* field);
void require_non_negative(int64_t v, const char* field);

// ---------------------------------------------------------------- generators over one table
// Writes every field into j[key].
template <class S>
void write_json(const FieldTable<S>& t, const S& s, nlohmann::json& j) {
  for (const Field<S>& f : t.rows) j[f.key] = f.to_json(s);
}
// Reads the keys of `obj` that are fields of the table (the caller rejects the others); errors name "section.key".
template <class S>
void read_json(const FieldTable<S>& t, S& s, const nlohmann::json& obj) {
  for (const Field<S>& f : t.rows) {
    auto it = obj.find(f.key);
    if (it != obj.end()) f.from_json(s, *it, t.section + "." + f.key);
  }
}
template <class S>
bool has_key(const FieldTable<S>& t, const std::string& key) {
  for (const Field<S>& f : t.rows)
    if (f.key == key) return true;
  return false;
}
// Every float finite and in its row's range; mcpp::Error "hidden_dropout must be in [0, 1), got 1.5".
template <class S>
void check_fields(const FieldTable<S>& t, const S& s) {
  for (const Field<S>& f : t.rows) {
    if (!f.is_float) continue;
    const double v = f.number(s);
    if (!std::isfinite(v)) fail_not_finite(f.key, v);
    if (f.range_ && !f.range_->contains(v)) fail_range(f.key, *f.range_, f.to_json(s).template get<double>());
  }
}
// The fingerprint entries of the table's fields (Config::math_fields).
template <class S>
void add_math_fields(const FieldTable<S>& t, const S& s, nlohmann::json& j) {
  for (const Field<S>& f : t.rows) {
    const Fingerprint rule = t.fingerprint_of(f);
    if (rule == Fingerprint::Never || rule == Fingerprint::Undecided) continue;
    if (rule == Fingerprint::When && f.fingerprint_if && !f.fingerprint_if(s)) continue;
    j[f.fingerprint_key.empty() ? f.key : f.fingerprint_key] =
        f.fingerprint_value ? f.fingerprint_value(s) : f.to_json(s);
  }
}
// --use-checkpoint-args: the rows marked checkpoint_arg, from the checkpoint's `saved` into `s`.
template <class S>
void copy_checkpoint_args(const FieldTable<S>& t, S& s, const S& saved) {
  for (const Field<S>& f : t.rows)
    if (f.from_checkpoint && (!f.from_checkpoint_if || f.from_checkpoint_if(saved))) f.copy(s, saved);
}

// ---------------------------------------------------------------- coverage (tests)
// The number of members of an aggregate (brace-initialization with as many convertible-to-anything values as
// it takes): a table's rows must cover every member.
namespace detail {
struct AnyValue {
  template <class T>
  operator T() const;  // never defined: unevaluated only
};
template <class T, class... A>
consteval size_t count_members() {
  if constexpr (requires { T{A{}..., AnyValue{}}; })
    return count_members<T, A..., AnyValue>();
  else
    return sizeof...(A);
}
}  // namespace detail
template <class T>
consteval size_t member_count() {
  static_assert(std::is_aggregate_v<T>, "a config struct must be an aggregate");
  return detail::count_members<T>();
}

}  // namespace mcpp::config

// A row for member `m` of the table's struct (a `using Self = <struct>;` in scope): the JSON key is the name.
#define MCPP_FIELD(m) ::mcpp::config::field(&Self::m, #m)
#define MCPP_ENUM_FIELD(m, to_s, parse) ::mcpp::config::enum_field(&Self::m, #m, to_s, parse)
