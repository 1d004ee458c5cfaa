// SFT conversations; contract in sft_conversation.h.
#include "mcpp/datasets/sft_conversation.h"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

#include "mcpp/core/error.h"

namespace mcpp {
namespace {

constexpr std::array<const char*, 4> kFormats = {"nemotron-h-aligned", "nemotron-nano-v2", "identity", "chatml"};
constexpr std::array<const char*, 4> kRoles = {"system", "user", "assistant", "tool"};

std::string strip(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

std::string replace_all(std::string s, std::string_view from) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p)) s.erase(p, from.size());
  return s;
}

std::string string_field(const nlohmann::json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) fail("{}: missing \"{}\"", where, key);
  if (!it->is_string()) fail("{}: \"{}\" must be a string, got {}", where, key, it->type_name());
  return it->get<std::string>();
}

// One turn's text in `format`, and how many of its leading tokens stay untrained when the turn is the assistant's
// (-1: the header text is tokenized on its own: `header` holds it).
struct Rendered {
  std::string header;  // untrained prefix text of an assistant turn (chatml)
  std::string text;
  int64_t untrained_prefix_tokens = 0;
};

Rendered render(const SftTurn& t, const std::string& format) {
  const bool sys = t.role == "system", user = t.role == "user", asst = t.role == "assistant";
  if (format == "identity") return {"", t.content, 0};
  if (format == "chatml") {
    const std::string head = "<|im_start|>" + t.role + "\n";
    if (asst) return {head, t.content + "<|im_end|>\n", 0};
    return {"", head + t.content + "<|im_end|>\n", 0};
  }
  if (format == "nemotron-h-aligned") {
    if (sys) return {"", "<SPECIAL_10>System\n" + strip(t.content) + "\n", 0};
    if (user) return {"", "<SPECIAL_11>User\n" + strip(t.content) + "\n<SPECIAL_11>Assistant\n", 0};
    if (asst) return {"", strip(t.content) + "\n", 0};
    return {"", "", 0};  // tool: no branch in the template
  }
  // nemotron-nano-v2
  const std::string c = replace_all(replace_all(t.content, "/think"), "/no_think");
  if (sys) return {"", "<SPECIAL_10>System\n" + strip(c) + "\n", 0};
  if (user) return {"", "<SPECIAL_11>User\n" + strip(c) + "\n", 0};
  if (asst) return {"", "<SPECIAL_11>Assistant\n" + strip(t.content) + "\n<SPECIAL_12>\n", 3};
  return {"", "", 0};
}

}  // namespace

const char* sft_prompt_formats() { return "nemotron-h-aligned|nemotron-nano-v2|identity|chatml"; }

void check_sft_prompt_format(const std::string& format) {
  if (std::find(kFormats.begin(), kFormats.end(), format) != kFormats.end()) return;
  if (format == "default")
    fail("sft_tokenizer_prompt_format: 'default' applies the tokenizer's Jinja chat_template, which mcpp does not "
         "run; use one of {}",
         sft_prompt_formats());
  fail("sft_tokenizer_prompt_format: unknown format '{}' (expected {})", format, sft_prompt_formats());
}

std::vector<SftConversation> parse_sft_line(std::string_view line, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a JSON object ({})", where, e.what());
  }
  if (!j.is_object()) fail("{}: a line must be a JSON object, got {}", where, j.type_name());
  if (!j.contains("messages")) {
    if (!j.contains("prompt") || !j.contains("response"))
      fail("{}: a line needs \"messages\" (a list of {{role, content}}) or \"prompt\" and \"response\"", where);
    SftConversation c{{"user", string_field(j, "prompt", where)}, {"assistant", string_field(j, "response", where)}};
    if (c[1].content.empty()) fail("{}: empty \"response\"", where);
    return {c};
  }
  const nlohmann::json& msgs = j["messages"];
  if (!msgs.is_array() || msgs.empty()) fail("{}: \"messages\" must be a non-empty list", where);
  std::vector<SftConversation> out;
  for (size_t k = 0; k < msgs.size(); ++k) {
    const std::string w = fmt::format("{}: messages[{}]", where, k);
    if (!msgs[k].is_object()) fail("{}: must be an object {{role, content}}", w);
    SftTurn t{string_field(msgs[k], "role", w), string_field(msgs[k], "content", w)};
    if (std::find(kRoles.begin(), kRoles.end(), t.role) == kRoles.end())
      fail("{}: unknown role '{}' (expected system, user, assistant or tool)", w, t.role);
    if (t.role == "system" || out.empty()) out.emplace_back();  // Megatron: a system message starts a conversation
    if (t.role == "assistant") {
      if (t.content.empty()) fail("{}: empty assistant turn", w);
      const SftConversation& cur = out.back();
      if (cur.empty() || (cur.back().role != "user" && cur.back().role != "tool"))
        fail("{}: an assistant turn must follow a user or tool turn", w);
    }
    out.back().push_back(std::move(t));
  }
  return out;
}

SftTokens tokenize_sft_conversation(const SftConversation& conv, const std::string& format,
                                    const MegatronTokenizer& tokenizer) {
  check_sft_prompt_format(format);
  SftTokens out;
  auto append = [&](const std::string& text, bool trained, int64_t untrained_prefix) {
    if (text.empty()) return;
    const std::vector<int32_t> ids = tokenizer.tokenize_text(text);
    for (size_t i = 0; i < ids.size(); ++i) {
      out.tokens.push_back(ids[i]);
      out.trained.push_back(trained && static_cast<int64_t>(i) >= untrained_prefix ? 1 : 0);
    }
  };
  for (const SftTurn& t : conv) {
    const Rendered r = render(t, format);
    const bool asst = t.role == "assistant";
    append(r.header, false, 0);
    append(r.text, asst, r.untrained_prefix_tokens);
  }
  out.tokens.push_back(tokenizer.eod());
  out.trained.push_back(1);
  return out;
}

}  // namespace mcpp
