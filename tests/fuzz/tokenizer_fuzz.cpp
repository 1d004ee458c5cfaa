// libFuzzer target: GPT-2 tokenizer files (the input is "<vocab.json>\n--\n<merges.txt>\n--\n<text>"):
// GPT2Tokenizer::from_files loads and cross-checks them; an accepted pair then encodes the text and decodes it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mcpp/datasets/gpt2_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string vocab = mcpp::fuzz::scratch("vocab.json"), merges = mcpp::fuzz::scratch("merges.txt");
  const auto parts = mcpp::fuzz::split(data, size, 3);
  if (!mcpp::fuzz::write_file(vocab, parts[0]) || !mcpp::fuzz::write_file(merges, parts[1])) return 0;
  MCPP_FUZZ_CALL({
    const mcpp::GPT2Tokenizer t = mcpp::GPT2Tokenizer::from_files(vocab, merges);
    t.decode(t.encode(std::string(parts[2])));
  });
  return 0;
}
