# Script tests of the config flags through the real CLI (they live here because the config helper owns
# this file; move to tests/training/ if that directory gets a tests.cmake).
#   config.cli_unknown_flag: `mcpp train --no-such-flag` exits 2 with exactly one line "error: ...".
#   config.cli_invalid_value: `mcpp train --hidden-size 66` exits 2 with one line naming hidden_size.
add_test(NAME config.cli_unknown_flag
         COMMAND bash -c "out=$(\"$0\" train --no-such-flag 2>&1 >/dev/null); rc=$?; echo \"$out\"; \
[ $rc -eq 2 ] && [ $(printf '%s\\n' \"$out\" | wc -l) -eq 1 ] && [[ $out == error:*no-such-flag* ]]" ${MCPP_BIN})
add_test(NAME config.cli_invalid_value
         COMMAND bash -c "out=$(\"$0\" train --hidden-size 66 2>&1 >/dev/null); rc=$?; echo \"$out\"; \
[ $rc -eq 2 ] && [ $(printf '%s\\n' \"$out\" | wc -l) -eq 1 ] && [[ $out == error:*hidden_size* ]]" ${MCPP_BIN})
