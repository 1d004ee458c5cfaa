# Package libraries and the layering check (cmake/packages.cmake declares the packages; DESIGN.md).
#
# mcpp_package(<name> [DEPS <package>...]) makes mcpp_<name>, an OBJECT library of src/mcpp/<name>/**/*.cpp (the
# CUDA / cuDNN / NCCL folders excepted: cmake/cuda.cmake adds them), linked to mcpp_<dep> for each DEPS: its include
# paths, definitions and build order come from its dependencies only. Object libraries, gathered into the one
# static archive mcpp_lib, because the backend seam crosses the order at link time by design: core declares
# cuda_backend:: (core/device_memory.h) and kernels defines it (the CUDA backend or its stub) — separate static
# archives would need the reverse link edge.
#
# The check: scripts/check_layering.py runs as a custom command whose stamp every package library depends on, and
# again whenever a source, header, packages.cmake or the script changes; an upward include fails the build with
# one error per offending line.
# Debian's python3 when present (the tests' interpreter too), else whichever CMake finds; the checker needs only
# the standard library.
if(EXISTS /usr/bin/python3)
  set(MCPP_LAYERING_PYTHON /usr/bin/python3)
else()
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  set(MCPP_LAYERING_PYTHON ${Python3_EXECUTABLE})
endif()
file(GLOB_RECURSE MCPP_LAYERING_INPUTS CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/src/mcpp/*.h ${CMAKE_SOURCE_DIR}/src/mcpp/*.cpp ${CMAKE_SOURCE_DIR}/src/mcpp/*.cu
     ${CMAKE_SOURCE_DIR}/src/mcpp/*.cuh ${CMAKE_SOURCE_DIR}/src/mcpp/*.inc ${CMAKE_SOURCE_DIR}/apps/*.h
     ${CMAKE_SOURCE_DIR}/apps/*.cpp)
add_custom_command(
  OUTPUT ${CMAKE_BINARY_DIR}/layering.ok
  COMMAND ${MCPP_LAYERING_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/check_layering.py --root ${CMAKE_SOURCE_DIR}
          --stamp ${CMAKE_BINARY_DIR}/layering.ok
  DEPENDS ${MCPP_LAYERING_INPUTS} ${CMAKE_SOURCE_DIR}/cmake/packages.cmake ${CMAKE_SOURCE_DIR}/scripts/check_layering.py
  COMMENT "Checking the package layering (cmake/packages.cmake)"
  VERBATIM)
add_custom_target(mcpp_layering DEPENDS ${CMAKE_BINARY_DIR}/layering.ok)

set(MCPP_PACKAGE_TARGETS "")
function(mcpp_package name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/mcpp/${name}/*.cpp)
  list(FILTER sources EXCLUDE REGEX "/kernels/cud(a|nn)(_stub)?/|/comm/nccl(_stub)?/")  # cmake/cuda.cmake's
  set(target mcpp_${name})
  add_library(${target} OBJECT ${sources})
  target_compile_options(${target} PRIVATE ${MCPP_WARNINGS} $<$<COMPILE_LANGUAGE:CXX>:${MCPP_FP_FLAGS}>)
  target_link_libraries(${target} PUBLIC mcpp_thirdparty)
  foreach(dep ${ARG_DEPS})
    target_link_libraries(${target} PUBLIC mcpp_${dep})
  endforeach()
  add_dependencies(${target} mcpp_layering)
  set(MCPP_PACKAGE_TARGETS ${MCPP_PACKAGE_TARGETS} ${target} PARENT_SCOPE)
endfunction()
