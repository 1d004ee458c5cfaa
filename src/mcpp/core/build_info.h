// What this binary was built from (mcpp --version, the train banner, metrics and checkpoint provenance). Defined
// by a source cmake/build_info.cmake generates at every build (build/generated/build_info.cpp): the git commit
// of the checkout (and whether tracked files differed from it), the project version, build type and compiler.
#pragma once

namespace mcpp::build_info {

const char* version();     // the project's version (CMakeLists.txt project(VERSION)), e.g. "0.1.0"
const char* git_commit();  // the full commit hash; "unknown" when the tree had no git (or $MCPP_GIT_COMMIT)
bool git_dirty();          // tracked files differed from the commit at build time
const char* build_type();  // CMAKE_BUILD_TYPE, e.g. "Release"
const char* compiler();    // e.g. "GNU 12.2.0"

}  // namespace mcpp::build_info
