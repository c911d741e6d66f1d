// qlinear's version and the commit it was built from, for --version, the start-up log, the
// ListKernels response and the qlinear_build_info metric.
#pragma once

#include <string>

namespace qlinear {

// The project's version (CMakeLists.txt): "0.1.0".
const char* version();
// git's 12-digit short hash of the source built, "-dirty" where tracked files differed from it;
// where the source had no git (the container build), $QLINEAR_BUILD_COMMIT at build time; else
// "unknown". Generated at every build (common/version.cmake).
const char* build_commit();
// "0.1.0 (commit 0123456789ab)".
std::string version_string();

}  // namespace qlinear
