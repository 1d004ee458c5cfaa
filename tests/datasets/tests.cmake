# Script tests for the datasets and `mcpp data` (the gtests are indexed_dataset_test / gpt_dataset_test).
#   data.preprocess_megatron: `mcpp data preprocess` on .jsonl/.txt equals, byte for byte, Megatron's
#     layout written by an independent Python writer from Megatron's Encoder.encode logic; bad input
#     exits 2 with one line.
#   data.prepare_corpus: scripts/prepare_corpus.sh on a small fortunes dir (skips .dat/.u8/symlinks,
#     documents decode back to the fortunes, idempotent).
add_test(NAME data.preprocess_megatron
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/data/preprocess_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/data_preprocess_check)
add_test(NAME data.prepare_corpus
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/data/prepare_corpus_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/data_prepare_corpus_check)
#   data.samples: `mcpp data samples` equals the Python oracle of Megatron-Core's GPTDataset order on every split.
add_test(NAME data.samples
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/data/samples_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/data_samples_check)
