// SFT conversations (Megatron-LM's SFTLowLevelDataset + SFTTokenizer, megatron/training/datasets/sft_dataset.py and
// megatron/core/tokenizers/text/libraries/sft_tokenizer.py): one JSONL line -> conversations -> tokens with a loss
// target mask.
//
// A line is a JSON object, either
//   {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}   (Megatron's form: a new
//      conversation starts at each system message, so a line may pack several), or
//   {"prompt": "...", "response": "..."}   (one conversation: a user turn, then an assistant turn).
// An assistant turn must follow a user or tool turn and must not be empty (Megatron's checks). Anything else —
// not JSON, neither form, a missing / non-string field, an unknown role — is an mcpp::Error naming the file, line
// and field.
//
// Rendering (--sft-tokenizer-prompt-format, Megatron's names; its Jinja templates written out, no Jinja engine):
//   nemotron-h-aligned (Megatron's default)  system: "<SPECIAL_10>System\n" + strip(c) + "\n";
//                                            user: "<SPECIAL_11>User\n" + strip(c) + "\n<SPECIAL_11>Assistant\n";
//                                            assistant: strip(c) + "\n"
//   nemotron-nano-v2   system / user as above without the assistant header (and "/think", "/no_think" removed);
//                      assistant: "<SPECIAL_11>Assistant\n" + strip(c) + "\n<SPECIAL_12>\n", its first 3 tokens
//                      untrained (Megatron's assistant_prefix_len)
//   identity           the content as is
//   chatml             (mcpp's; Qwen's template without tools) "<|im_start|>" + role + "\n" + c + "<|im_end|>\n";
//                      the assistant header "<|im_start|>assistant\n" untrained
// ("default", the tokenizer's own Jinja chat_template, is refused by name.) strip() removes ASCII whitespace at both
// ends (Python's str.strip() on ASCII text). A tool turn renders as nothing in the nemotron formats (their
// templates have no branch for it) and as its content otherwise.
// Tokens: each turn's text through tokenize_text (no special tokens added, as apply_chat_template's tokenize), the
// turns concatenated — Megatron tokenizes the whole rendered conversation and masks by the per-turn lengths, which
// is the same wherever tokenization does not merge across a turn boundary (what its masking assumes). System, user
// and tool turns are untrained (Megatron's IGNORE_INDEX targets); assistant turns are trained but for the prefix
// above. After each conversation the tokenizer's EOD, trained — the model learns to stop (NeMo / Megatron-Bridge's
// SFT datasets add EOS after the answer; Megatron-LM's templates leave it to their end markers).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mcpp/datasets/megatron_tokenizer.h"

namespace mcpp {

struct SftTurn {
  std::string role;  // system | user | assistant | tool
  std::string content;
};
using SftConversation = std::vector<SftTurn>;

// One JSONL line (`where`: "file:line" for errors) -> its conversations (at least one).
std::vector<SftConversation> parse_sft_line(std::string_view line, const std::string& where);

// "nemotron-h-aligned|nemotron-nano-v2|identity|chatml" (help text); an unknown name is an mcpp::Error.
const char* sft_prompt_formats();
void check_sft_prompt_format(const std::string& format);

struct SftTokens {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // per token: 1 where the token is a training target (its label position has loss)
};
// A conversation rendered in `format` and tokenized, EOD appended (see the header).
SftTokens tokenize_sft_conversation(const SftConversation& conv, const std::string& format,
                                    const MegatronTokenizer& tokenizer);

}  // namespace mcpp
