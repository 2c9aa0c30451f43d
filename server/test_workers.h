// Test helpers for the daemon's tests that run real worker processes: shell scripts standing in
// for ithaca-worker, in the test's temporary directory.
#pragma once

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"

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

// A real byte-level token file (admission opens the data as the workers will): `documents`
// documents of about 100 tokens, enough windows for the tiny model at seq_len 64.
inline std::string WriteCorpus(const std::string& path, int documents = 40) {
  std::string text;
  for (int d = 0; d < documents; ++d) {
    text += "document " + std::to_string(d) + ": the quick brown fox jumps over the lazy dog, ";
    text += "and over the fence, " + std::string(24, 'a' + d % 26) + "\n\n";
  }
  const std::vector<uint32_t> tokens = ByteTokenize(text);
  if (!WriteTokenFileV2(path, tokens, ByteTokenMeta(tokens)).ok()) std::abort();
  return path;
}

}  // namespace ithaca
