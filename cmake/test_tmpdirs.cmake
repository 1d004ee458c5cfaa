# mcpp_isolate_test_tmpdirs(<tag>): every test added so far in the calling directory gets its own TMPDIR.
# Why: under `ctest -j`, concurrent mpiexec runs share Open MPI's session directory /tmp/ompi.<host>.<uid>;
# one run's cleanup can remove it while another creates its pid subdirectory ("A call to mkdir was unable to
# create the desired directory ... orte_session_dir failed"), failing an unrelated test at random. Python's
# tempfile and std::filesystem::temp_directory_path follow TMPDIR too, so script tests are isolated as well.
# The directories are short paths under /tmp (Open MPI keeps Unix sockets there: 108-character limit), named
# by a hash of the build directory and the test's index; a fixture test creates them before the tests run
# (they may not survive a reboot between configure and test). Tests discovered by gtest_discover_tests
# are not in the list (they run in one process, without mpiexec).
function(mcpp_isolate_test_tmpdirs tag)
  get_property(tests DIRECTORY PROPERTY TESTS)
  if(NOT tests)
    return()
  endif()
  string(MD5 hash "${CMAKE_BINARY_DIR}")
  string(SUBSTRING "${hash}" 0 8 hash)
  set(fixture mcpp_tmpdirs_${tag})
  set(dirs)
  set(i 0)
  foreach(t ${tests})
    set(d /tmp/mcpp-${hash}/${tag}${i})
    list(APPEND dirs ${d})
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "TMPDIR=${d}")
    set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED ${fixture})
    math(EXPR i "${i} + 1")
  endforeach()
  add_test(NAME ${fixture} COMMAND ${CMAKE_COMMAND} -E make_directory ${dirs})
  set_tests_properties(${fixture} PROPERTIES FIXTURES_SETUP ${fixture})
endfunction()
