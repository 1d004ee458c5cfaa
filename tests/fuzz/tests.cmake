# fuzz.parsers: every libFuzzer target of tests/fuzz (manifest, safetensors header, config JSON, TOML recipe, .idx,
# HF config.json, tokenizer files; clang, ASan + UBSan) built and run for 5 s each over its seeds and committed
# corpus — the smoke; `make fuzz` runs each for 10 million executions (docs/FUZZING.md) in build/fuzz, a directory of
# its own (a smoke run beside a long one must not truncate its logs). Skipped (77) without clang++.
add_test(NAME fuzz.parsers
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh ${CMAKE_BINARY_DIR}/fuzz_smoke smoke 5)
set_tests_properties(fuzz.parsers PROPERTIES TIMEOUT 3600 SKIP_RETURN_CODE 77)
