# training.cli_end_to_end: mcpp data preprocess -> train (save, resume bit-exact) -> forward (vs float64
# torch from the checkpoint bytes) -> generate; bad inputs exit 2 with one error line.
add_test(NAME training.cli_end_to_end
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/oracle/cli/train_cli_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/train_cli_check)
