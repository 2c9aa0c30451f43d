// ithaca-tokenize (C++): the built-in byte-level tokenizer. Turns a plain-text corpus into a
// version 2 token file (token_file.h), e.g.
//   ithaca-tokenize --input corpus.txt --output data.tok
// Documents are separated by blank lines; each starts with BOS (see ByteTokenize). A model's own
// tokenizer (tokenizer.json) is the Python tool's job: tools/tokenize/ithaca-tokenize.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/core/file_util.h"
#include "engine/data/token_file.h"

ABSL_FLAG(std::string, input, "", "UTF-8 / plain-text corpus; documents separated by blank lines");
ABSL_FLAG(std::string, output, "", "token file to write (atomically)");
ABSL_FLAG(std::string, tokenizer, "byte",
          "\"byte\" (the only tokenizer built in here; for a tokenizer.json use "
          "tools/tokenize/ithaca-tokenize)");

namespace ithaca {
namespace {

int Run(const std::string& input, const std::string& output, const std::string& tokenizer) {
  if (tokenizer != "byte" && !tokenizer.empty()) {
    std::fprintf(stderr,
                 "ithaca-tokenize: --tokenizer %s: this binary has only the built-in byte-level "
                 "tokenizer; tokenize with a model's tokenizer with tools/tokenize/ithaca-tokenize "
                 "--tokenizer %s\n",
                 tokenizer.c_str(), tokenizer.c_str());
    return 2;
  }
  if (input.empty() || output.empty()) {
    std::fprintf(stderr, "ithaca-tokenize: both --input and --output are required\n%s\n",
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  absl::StatusOr<std::string> text = ReadFileToString(input);
  if (!text.ok()) {
    std::fprintf(stderr, "ithaca-tokenize: %s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  std::vector<uint32_t> tokens = ByteTokenize(*text);
  TokenFileMeta meta = ByteTokenMeta(tokens);
  absl::Status st = WriteTokenFileV2(output, tokens, meta);
  if (!st.ok()) {
    std::fprintf(stderr, "ithaca-tokenize: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("%s: %zu tokens, %zu documents, vocab_size %u (from %zu bytes of %s)\n",
              output.c_str(), tokens.size(), meta.doc_starts.size(), kByteVocab, text->size(),
              input.c_str());
  return 0;
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Byte-level tokenizer.\nUsage: ithaca-tokenize --input corpus.txt --output data.tok");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "ithaca-tokenize: unexpected argument \"%s\" (use --input/--output)\n",
                 rest[1]);
    return 2;
  }
  return ithaca::Run(absl::GetFlag(FLAGS_input), absl::GetFlag(FLAGS_output),
                     absl::GetFlag(FLAGS_tokenizer));
}
