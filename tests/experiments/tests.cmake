# Experiments (experiments/, issue 34): the formulas library and the runner's checks on fixed inputs; every
# recipe's CPU tier (3 repeats, seconds) with its oracle passing, and its oracle failing on the recipe's
# deliberately broken input; REPORT.md regenerated from those results. Results go to the build dir.
# A recipe with SMOKE shapes also runs its gpu / gpu-multi tier's code on CPU ranks (--smoke, 1 repeat): the same
# commands, parsers and oracle with small shapes (device-memory / MFU checks n/a) must pass, and fail on its
# broken input — what the device would otherwise find first.
set(MCPP_EXPERIMENTS ${CMAKE_SOURCE_DIR}/experiments)
set(MCPP_EXP_RESULTS ${CMAKE_CURRENT_BINARY_DIR}/experiment_results)
add_test(NAME experiments.lib
         COMMAND ${MCPP_PY} -m unittest discover -s ${MCPP_EXPERIMENTS}/lib -p test_*.py)
file(GLOB MCPP_EXP_RECIPES CONFIGURE_DEPENDS ${MCPP_EXPERIMENTS}/E*-*/recipe.py)
set(_exp_tests "")
foreach(recipe ${MCPP_EXP_RECIPES})
  get_filename_component(_dir ${recipe} DIRECTORY)
  get_filename_component(_name ${_dir} NAME)
  string(REGEX MATCH "^E[0-9]+" exp ${_name})
  add_test(NAME experiments.${exp}_cpu
           COMMAND ${MCPP_PY} ${MCPP_EXPERIMENTS}/run ${exp} --tier cpu --repeats 3 --mcpp ${MCPP_BIN}
                   --results ${MCPP_EXP_RESULTS})
  add_test(NAME experiments.${exp}_oracle_fails
           COMMAND ${MCPP_PY} ${MCPP_EXPERIMENTS}/lib/check_broken.py ${exp} ${MCPP_BIN} ${MCPP_EXP_RESULTS})
  set_tests_properties(experiments.${exp}_cpu experiments.${exp}_oracle_fails PROPERTIES TIMEOUT 300)
  list(APPEND _exp_tests experiments.${exp}_cpu)
  file(STRINGS ${recipe} _smoke REGEX "^SMOKE = ")
  if(_smoke)
    foreach(tier gpu gpu-multi)
      string(REPLACE "-" "_" _t ${tier})
      add_test(NAME experiments.${exp}_${_t}_smoke
               COMMAND ${MCPP_PY} ${MCPP_EXPERIMENTS}/run ${exp} --tier ${tier} --smoke --repeats 1 --mcpp ${MCPP_BIN}
                       --results ${MCPP_EXP_RESULTS})
      add_test(NAME experiments.${exp}_${_t}_smoke_oracle_fails
               COMMAND ${MCPP_PY} ${MCPP_EXPERIMENTS}/lib/check_broken.py ${exp} ${MCPP_BIN} ${MCPP_EXP_RESULTS}
                       --tier ${tier} --smoke)
      set_tests_properties(experiments.${exp}_${_t}_smoke experiments.${exp}_${_t}_smoke_oracle_fails
                           PROPERTIES TIMEOUT 300)
    endforeach()
  endif()
endforeach()
# E06's oracle compares the measured steps of two layouts (the proposal must beat the even split): a test running
# beside it on a 2-core machine can invert them (seen once under ctest -j2: 54.2 vs 36.4 ms), so it runs alone.
set_tests_properties(experiments.E06_cpu PROPERTIES RUN_SERIAL TRUE)
add_test(NAME experiments.gpu_commands
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/experiments/gpu_commands_check.py ${MCPP_BIN})
add_test(NAME experiments.report COMMAND ${MCPP_PY} ${MCPP_EXPERIMENTS}/run report --results ${MCPP_EXP_RESULTS})
set_tests_properties(experiments.report PROPERTIES DEPENDS "${_exp_tests}")

# The regression gate's CI part (bench/regress counters): deterministic counters equal the stored baseline, and a
# deliberate extra all-reduce (one more gradient bucket) is caught by name.
add_test(NAME bench.regress_counters COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/bench/regress counters --mcpp ${MCPP_BIN})
add_test(NAME bench.regress_counters_catch
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/experiments/regress_catch_check.py ${MCPP_BIN})
# The device part's rule and run (bench/regress timings), on CPU: a deliberate steady slowdown (a sleep at every
# step) is caught and its timeline kept.
add_test(NAME bench.regress_timings
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/experiments/regress_timings_check.py ${MCPP_BIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/regress_timings)
set_tests_properties(bench.regress_counters bench.regress_counters_catch bench.regress_timings PROPERTIES TIMEOUT 300)
