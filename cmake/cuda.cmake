# CUDA backend glue. The only place where the build decides CPU-only vs CUDA (DESIGN.md: #ifdef lives in
# build glue). Without CUDA, src/mcpp/kernels/cuda_stub/ supplies the same symbols, reporting
# "built without CUDA" when called.
include(CheckLanguage)
set(MCPP_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO (if nvcc is found), ON, OFF")
set(MCPP_HAVE_CUDA OFF)
if(NOT MCPP_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MCPP_HAVE_CUDA ON)
    # enable_language must run at directory scope (inside a function its variables are lost).
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90 80)
    endif()
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag (the global CXX_STANDARD 20 also applies to CUDA): teach it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit REQUIRED)
  elseif(MCPP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MCPP_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "megatron-cpp CUDA backend: ${MCPP_HAVE_CUDA}")

# mcpp_add_cuda_backend(KERNELS <target> COMM <target> ARCHIVE <target>): the backends of the package libraries
# (cmake/packages.cmake). The CUDA sources build as their own OBJECT library (mcpp_cuda, part of the kernels package)
# so that the C++ flags (-Wall for g++, -march, C++20 compile features that CMake 3.25 cannot map to nvcc) stay off
# nvcc's command line; their objects go into ARCHIVE (mcpp_lib), and KERNELS carries cudart / cuBLASLt (and
# cuDNN's sources and library, or the stubs) to everything above it.
#
# NCCL backend (src/mcpp/comm/nccl, part of the comm package): its sources are added to COMM only when CUDA is on
# and nccl.h + libnccl are found (NCCL_ROOT or the CUDA toolkit's include/ and lib/). MCPP_HAVE_NCCL tells
# tests/nccl/tests.cmake. The library is linked by
# its SONAME (libnccl.so.2); at run time it must be on the loader path — on the device machines it lives
# in Python's site-packages (nvidia/nccl/lib), see docs/NCCL.md.
function(mcpp_add_cuda_backend)
  cmake_parse_arguments(ARG "" "KERNELS;COMM;ARCHIVE" "" ${ARGN})
  set(target ${ARG_KERNELS})
  file(GLOB nccl_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/mcpp/comm/nccl/*.cpp)
  set(MCPP_HAVE_NCCL OFF)
  if(MCPP_HAVE_CUDA AND nccl_sources)
    get_filename_component(cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} ${cuda_root}/include)
    find_library(NCCL_LIBRARY nccl HINTS $ENV{NCCL_ROOT}/lib ${cuda_root}/lib ${cuda_root}/lib64 ${CUDAToolkit_LIBRARY_DIR})
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(MCPP_HAVE_NCCL ON)
      target_sources(${ARG_COMM} PRIVATE ${nccl_sources})
      target_include_directories(${ARG_COMM} PRIVATE ${NCCL_INCLUDE_DIR})
      target_link_libraries(${ARG_COMM} PUBLIC ${NCCL_LIBRARY})
      target_compile_definitions(${ARG_COMM} PUBLIC MCPP_WITH_NCCL=1)
    endif()
  endif()
  if(NOT MCPP_HAVE_NCCL)  # init_nccl reports "built without NCCL"
    file(GLOB nccl_stub_sources ${CMAKE_SOURCE_DIR}/src/mcpp/comm/nccl_stub/*.cpp)
    target_sources(${ARG_COMM} PRIVATE ${nccl_stub_sources})
  endif()
  message(STATUS "megatron-cpp NCCL backend: ${MCPP_HAVE_NCCL} ${NCCL_LIBRARY}")
  set(MCPP_HAVE_NCCL ${MCPP_HAVE_NCCL} PARENT_SCOPE)

  file(GLOB_RECURSE cuda_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/mcpp/kernels/cuda/*.cu
                                                   ${CMAKE_SOURCE_DIR}/src/mcpp/kernels/cuda/*.cpp)
  if(MCPP_HAVE_CUDA AND cuda_sources)
    add_library(mcpp_cuda OBJECT ${cuda_sources})
    set_target_properties(mcpp_cuda PROPERTIES CUDA_ARCHITECTURES "90;80" CUDA_SEPARABLE_COMPILATION OFF
                                               CXX_STANDARD 20 POSITION_INDEPENDENT_CODE ON)
    target_include_directories(mcpp_cuda PRIVATE ${CMAKE_SOURCE_DIR}/src)
    # -lineinfo: source lines in compute-sanitizer / ncu reports at no runtime cost.
    target_compile_options(mcpp_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr
                                                                       -Xcompiler=-Wall>
                                             $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
    target_link_libraries(mcpp_cuda PRIVATE fmt::fmt CUDA::cudart CUDA::cublasLt)
    add_dependencies(mcpp_cuda mcpp_layering)
    target_sources(${ARG_ARCHIVE} PRIVATE $<TARGET_OBJECTS:mcpp_cuda>)
    target_compile_definitions(${target} PUBLIC MCPP_WITH_CUDA=1)
    target_link_libraries(${target} PUBLIC CUDA::cudart CUDA::cublasLt)
    # cuDNN's fused attention (src/mcpp/kernels/cudnn, backend API only) when cudnn.h + libcudnn are found
    # (CUDNN_ROOT or the CUDA toolkit); otherwise kernels/cudnn_stub (the attention ops keep the mcpp
    # kernels). Linked by SONAME (libcudnn.so.9): on the device machines it lives in Python's
    # site-packages (nvidia/cudnn/lib), which bench/gpu/env.sh puts on the loader path.
    get_filename_component(cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    find_path(CUDNN_INCLUDE_DIR cudnn_graph.h HINTS $ENV{CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} ${cuda_root}/include)
    find_library(CUDNN_LIBRARY cudnn HINTS $ENV{CUDNN_ROOT}/lib ${cuda_root}/lib ${cuda_root}/lib64 ${CUDAToolkit_LIBRARY_DIR})
    if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
      file(GLOB cudnn_sources ${CMAKE_SOURCE_DIR}/src/mcpp/kernels/cudnn/*.cpp)
      target_include_directories(${target} PRIVATE ${CUDNN_INCLUDE_DIR})
      target_link_libraries(${target} PUBLIC ${CUDNN_LIBRARY})
      set(MCPP_HAVE_CUDNN ON)
    else()
      file(GLOB cudnn_sources ${CMAKE_SOURCE_DIR}/src/mcpp/kernels/cudnn_stub/*.cpp)
      set(MCPP_HAVE_CUDNN OFF)
    endif()
    target_sources(${target} PRIVATE ${cudnn_sources})
    message(STATUS "megatron-cpp cuDNN fused attention: ${MCPP_HAVE_CUDNN} ${CUDNN_LIBRARY}")
  else()
    file(GLOB stub_sources ${CMAKE_SOURCE_DIR}/src/mcpp/kernels/cuda_stub/*.cpp)
    target_sources(${target} PRIVATE ${stub_sources})
  endif()
endfunction()
