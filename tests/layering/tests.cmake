# layering.checker: scripts/check_layering.py passes on this tree, and refuses a deliberately upward include
# (core -> training: exit 2, one error naming file:line and both packages), an undeclared package, a declaration
# cycle and a file include cycle; --check-doc accepts docs/ARCHITECTURE.md's package graph and refuses a stale copy.
# The same checker runs as a build step (cmake/packages.cmake).
add_test(NAME layering.checker
         COMMAND ${MCPP_PY} ${CMAKE_SOURCE_DIR}/tests/layering/check_layering_test.py ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/layering_check)
