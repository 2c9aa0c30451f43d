// token_file_dump: prints token files as JSON, one object per file, through the C++ reader; with
// --seq-len it also builds the DataLoader over all of them (checked against --model-tokenizer)
// and prints its verdict. Lets the Python tool's tests check that the C++ side reads what Python
// wrote.
//   token_file_dump [--seq-len N --model-vocab V --model-tokenizer tokenizer.json] FILE_OR_GLOB...
// --write-byte-tokens TEXT OUT.tok writes the C++ ByteTokenize of TEXT instead (the oracle the
// byte-level ithaca-tokenize is compared with).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/core/file_util.h"
#include "engine/core/flag_spelling.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/data_loader.h"
#include "engine/data/token_file.h"

ABSL_FLAG(int64_t, seq_len, 0, "also build a DataLoader with this seq_len");
ABSL_FLAG(int64_t, model_vocab, 0, "the model's vocab_size for the DataLoader");
ABSL_FLAG(std::string, model_tokenizer, "", "the model's tokenizer.json for the DataLoader");
ABSL_FLAG(std::string, write_byte_tokens, "",
          "a text file: write its ByteTokenize to the one FILE argument, and print nothing");

namespace ithaca {
namespace {

int Run(const std::vector<std::string>& args) {
  if (const std::string text_path = absl::GetFlag(FLAGS_write_byte_tokens); !text_path.empty()) {
    absl::StatusOr<std::string> text = ReadFileToString(text_path);
    if (!text.ok() || args.size() != 1) {
      std::fprintf(
          stderr, "--write-byte-tokens: %s\n",
          text.ok() ? "give one output FILE" : std::string(text.status().message()).c_str());
      return 1;
    }
    const std::vector<uint32_t> tokens = ByteTokenize(*text);
    absl::Status st = WriteTokenFileV2(args[0], tokens, ByteTokenMeta(tokens));
    if (!st.ok()) std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return st.ok() ? 0 : 1;
  }
  std::vector<std::unique_ptr<TokenFile>> files;
  for (const std::string& pattern : args) {
    absl::StatusOr<std::vector<std::string>> paths = ExpandDataPath(pattern);
    if (!paths.ok()) {
      std::fprintf(stderr, "%s\n", std::string(paths.status().message()).c_str());
      return 1;
    }
    for (const std::string& p : *paths) {
      absl::StatusOr<std::unique_ptr<TokenFile>> f = TokenFile::Open(p);
      if (!f.ok()) {
        std::fprintf(stderr, "%s\n", std::string(f.status().message()).c_str());
        return 1;
      }
      const TokenFile& t = **f;
      std::string out =
          absl::StrCat("{\"path\": \"", p, "\", \"version\": ", t.version(),
                       ", \"vocab_size\": ", t.vocab_size(), ", \"bos_id\": ", t.bos_id(),
                       ", \"eos_id\": ", t.eos_id(), ", \"fingerprint\": \"",
                       FingerprintHex(t.fingerprint()), "\", \"tokens\": [");
      for (int64_t i = 0; i < t.size(); ++i) absl::StrAppend(&out, i ? "," : "", t.tokens()[i]);
      absl::StrAppend(&out, "], \"doc_starts\": [");
      for (int64_t i = 0; i < t.num_docs(); ++i) {
        absl::StrAppend(&out, i ? "," : "", t.doc_starts()[i]);
      }
      absl::StrAppend(&out, "], \"has_loss_mask\": ", t.loss_mask() ? "true" : "false");
      if (t.loss_mask()) {
        absl::StrAppend(&out, ", \"loss_mask\": [");
        for (int64_t i = 0; i < t.size(); ++i) {
          absl::StrAppend(&out, i ? "," : "", static_cast<int>(t.loss_mask()[i]));
        }
        absl::StrAppend(&out, "]");
      }
      absl::StrAppend(&out, "}");
      std::printf("%s\n", out.c_str());
      files.push_back(std::move(*f));
    }
  }
  if (absl::GetFlag(FLAGS_seq_len) > 0) {
    DataOptions o;
    o.tokenizer_json = absl::GetFlag(FLAGS_model_tokenizer);
    auto loader = DataLoader::Create(std::move(files), absl::GetFlag(FLAGS_seq_len),
                                     absl::GetFlag(FLAGS_model_vocab), o);
    if (!loader.ok()) {
      std::fprintf(stderr, "%s\n", std::string(loader.status().message()).c_str());
      return 1;
    }
    for (const std::string& w : (*loader)->warnings()) std::printf("warning: %s\n", w.c_str());
    std::printf("loader: %lld samples per epoch\n",
                static_cast<long long>((*loader)->samples_per_epoch()));
  }
  return 0;
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  ithaca::FlagSpelling flags = ithaca::NormalizeFlags("token_file_dump", argc, argv);
  std::vector<char*> args = flags.argv();
  std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  return ithaca::Run(std::vector<std::string>(rest.begin() + 1, rest.end()));
}
