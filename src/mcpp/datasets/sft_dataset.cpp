// SFTDataset; contract in sft_dataset.h.
#include "mcpp/datasets/sft_dataset.h"

#include <algorithm>
#include <fstream>

#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt_dataset.h"
#include "mcpp/datasets/sft_conversation.h"

namespace mcpp {
namespace {

struct Line {
  int64_t number;  // 1-based, for errors
  std::string text;
};

std::vector<Line> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("sft: cannot open the JSONL file '{}'", path);
  std::vector<Line> out;
  std::string s;
  for (int64_t n = 1; std::getline(in, s); ++n)
    if (s.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back({n, std::move(s)});
  if (in.bad()) fail("sft: reading '{}' failed", path);
  return out;
}

}  // namespace

SFTDataset::SFTDataset(const SFTDatasetOptions& opt) : path_(opt.path), seq_length_(opt.seq_length) {
  MCPP_CHECK(opt.tokenizer, "sft: no tokenizer");
  if (opt.seq_length < 1) fail("sft: seq_length {} must be >= 1", opt.seq_length);
  if (opt.split_index < 0 || opt.split_index > 2) fail("sft: split_index {} must be 0, 1 or 2", opt.split_index);
  check_sft_prompt_format(opt.prompt_format);
  const std::vector<Line> lines = read_lines(opt.path);
  const std::array<int64_t, 4> bounds = split_indices(opt.split, static_cast<int64_t>(lines.size()));
  const int64_t begin = bounds[static_cast<size_t>(opt.split_index)],
                end = bounds[static_cast<size_t>(opt.split_index) + 1];
  if (begin >= end)
    fail("sft: the {} split of '{}' holds no conversations ({} lines, --split {})", split_name(opt.split_index),
         opt.path, lines.size(), opt.split);
  const auto cap = static_cast<size_t>(opt.seq_length + 1);
  const int32_t pad = opt.tokenizer->eod();
  Bin cur;
  auto close = [&] {
    if (cur.tokens.empty()) return;
    if (cur.tokens.size() < cap) {  // the padding: a document of its own, never trained
      cur.starts.push_back(static_cast<int32_t>(cur.tokens.size()));
      cur.trained.resize(cap, 0);
      cur.tokens.resize(cap, pad);
    }
    bins_.push_back(std::move(cur));
    cur = {};
  };
  for (int64_t l = begin; l < end; ++l) {
    const Line& line = lines[static_cast<size_t>(l)];
    const std::string where = fmt::format("{}:{}", opt.path, line.number);
    for (const SftConversation& conv : parse_sft_line(line.text, where)) {
      SftTokens t = tokenize_sft_conversation(conv, opt.prompt_format, *opt.tokenizer);
      ++num_conversations_;
      if (cur.tokens.size() + t.tokens.size() > cap) close();
      if (t.tokens.size() > cap) {  // truncated on the right, a bin of its own
        t.tokens.resize(cap);
        t.trained.resize(cap);
        ++num_truncated_;
      }
      cur.starts.push_back(static_cast<int32_t>(cur.tokens.size()));
      cur.tokens.insert(cur.tokens.end(), t.tokens.begin(), t.tokens.end());
      cur.trained.insert(cur.trained.end(), t.trained.begin(), t.trained.end());
    }
  }
  close();
}

const SFTDataset::Bin& SFTDataset::bin(int64_t i) const {
  MCPP_CHECK(i >= 0 && i < size(), "sft: sample {} outside [0, {})", i, size());
  return bins_[static_cast<size_t>(i)];
}

void SFTDataset::sample(int64_t i, std::span<int32_t> tokens, std::span<float> loss_mask) const {
  const Bin& b = bin(i);
  MCPP_CHECK(static_cast<int64_t>(tokens.size()) == seq_length_ + 1 && static_cast<int64_t>(loss_mask.size()) == seq_length_,
             "sft: sample buffers must hold {} tokens and {} mask entries", seq_length_ + 1, seq_length_);
  std::copy(b.tokens.begin(), b.tokens.end(), tokens.begin());
  size_t doc = 0;  // the document of input position p
  for (int64_t p = 0; p < seq_length_; ++p) {
    while (doc + 1 < b.starts.size() && b.starts[doc + 1] <= p) ++doc;
    const bool next_in_doc = doc + 1 >= b.starts.size() || b.starts[doc + 1] > p + 1;  // label p + 1's document
    loss_mask[static_cast<size_t>(p)] = next_in_doc && b.trained[static_cast<size_t>(p + 1)] ? 1.0f : 0.0f;
  }
}

std::vector<int32_t> SFTDataset::documents(int64_t i) const {
  std::vector<int32_t> cu;
  for (int32_t st : bin(i).starts)
    if (st < seq_length_) cu.push_back(st);
  cu.push_back(static_cast<int32_t>(seq_length_));
  return cu;
}

}  // namespace mcpp
