// Test helpers for the daemon's tests that run real worker processes: shell scripts standing in
// for ithaca-worker, in the test's temporary directory.
#pragma once

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace ithaca {

inline std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// An executable shell script standing in for ithaca-worker.
inline std::string Script(const std::string& name, const std::string& body) {
  const std::string path = TmpDir() + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

}  // namespace ithaca
