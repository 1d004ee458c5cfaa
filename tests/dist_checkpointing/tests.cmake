# mcpp ckpt end to end against the independent Python oracle (tests/oracle/ckpt/read_safetensors.py:
# struct + json + numpy + python3-xxhash): import, verify, info, export, byte-flip detection.
add_test(NAME ckpt_cli_oracle
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/oracle/ckpt/ckpt_cli_test.sh ${MCPP_BIN} ${MCPP_PY}
                 ${CMAKE_BINARY_DIR}/ckpt_cli_test_work)
