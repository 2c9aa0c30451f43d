// passkey_corpus: a training corpus for the retrieval task the passkey eval measures
// ([eval.passkey], engine/data/passkey_prompt.h). Writes one token file of --count windows, each
// exactly --length tokens (so they are the DataLoader's windows of data.seq_len = --length), each
// one prompt, with keys and depths drawn from --seed: the same sentences, key sentence and question
// as the eval, in the byte-level tokenizer or a model's tokenizer.json (--tokenizer).
//   passkey_corpus --out train.tok --length 4096 --count 20000 [--seed 7] [--tokenizer T.json]
// With --pack_min M (a power of two below --length) a window holds 2^k prompts of length / 2^k
// tokens each, k drawn per window so that the prompts are at least M long: more retrievals a
// window, from short ones up, for training with data.document_mask (each prompt a document).
// Keys come from PasskeyKey over a seed mixed apart from the eval's (training.seed), so the eval's
// prompts are not in the corpus; depths are uniform in [0, 1].
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/data/passkey_prompt.h"
#include "engine/data/text_tokenizer.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/data_loader.h"
#include "engine/data/sha256.h"
#include "engine/data/token_file.h"

ABSL_FLAG(std::string, out, "", "the token file to write");
ABSL_FLAG(int64_t, length, 4096, "tokens per window (the training seq_len)");
ABSL_FLAG(int64_t, count, 1000, "windows of --length tokens");
ABSL_FLAG(uint64_t, seed, 7, "keys and depths come from it");
ABSL_FLAG(std::string, tokenizer, "", "a tokenizer.json; empty: byte-level");
ABSL_FLAG(int64_t, pack_min, 0, "0: one prompt a window; else the shortest packed prompt");
ABSL_FLAG(int64_t, vocab, 0, "the file's vocab_size; 0: 258 for byte-level (bytes, BOS, EOS)");

namespace ithaca {
namespace {

// Well apart from any seed a job would use for its eval's keys (training.seed is small).
constexpr uint64_t kCorpusSeedSalt = 0x70A55C0DE5EEDull;

absl::Status Run() {
  const std::string out = absl::GetFlag(FLAGS_out);
  const int64_t length = absl::GetFlag(FLAGS_length);
  const int64_t count = absl::GetFlag(FLAGS_count);
  const uint64_t seed = absl::GetFlag(FLAGS_seed) ^ kCorpusSeedSalt;
  if (out.empty()) return absl::InvalidArgumentError("--out: the token file to write is missing");
  if (count < 1) return absl::InvalidArgumentError("--count must be at least 1");
  const int64_t pack_min = absl::GetFlag(FLAGS_pack_min);
  int64_t max_split = 0;  // a window splits into at most 2^max_split prompts
  if (pack_min > 0) {
    while ((length >> (max_split + 1)) >= pack_min && (length % (int64_t{2} << max_split)) == 0) {
      ++max_split;
    }
  }
  std::unique_ptr<TextTokenizer> tok;
  const std::string json = absl::GetFlag(FLAGS_tokenizer);
  if (json.empty()) {
    tok = MakeByteTokenizer();
  } else {
    ASSIGN_OR_RETURN(tok, LoadBpeTokenizer(json));
  }
  TokenFileMeta meta;
  meta.vocab_size = static_cast<uint32_t>(absl::GetFlag(FLAGS_vocab));
  meta.bos_id = tok->bos();
  if (json.empty()) {
    if (meta.vocab_size == 0) meta.vocab_size = kByteVocab;
    meta.eos_id = kByteEos;
  } else {
    if (meta.vocab_size == 0) return absl::InvalidArgumentError("--vocab: needed with --tokenizer");
    ASSIGN_OR_RETURN(meta.fingerprint, Sha256File(json));
  }
  std::vector<uint32_t> tokens;
  tokens.reserve(static_cast<size_t>(length * count));
  // Five digits from (seed + salt, a length, an index): the keys (salt 0), the depths (1) and
  // the windows' splits (2).
  auto draw = [seed](uint64_t salt, int64_t n, int64_t index) {
    return PasskeyKey(seed + salt, n, /*depth_index=*/-1, index);
  };
  int64_t prompt = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t split = max_split == 0 ? 0 : std::stoll(draw(2, length, i)) % (max_split + 1);
    const int64_t n = length >> split;
    for (int64_t j = 0; j < (int64_t{1} << split); ++j, ++prompt) {
      const std::string key = draw(0, n, prompt);
      const double depth = static_cast<double>(std::stoi(draw(1, n, prompt)) - 10000) / 89999.0;
      ASSIGN_OR_RETURN(PasskeyPrompt p, BuildPasskeyPrompt(*tok, n, depth, key));
      meta.doc_starts.push_back(tokens.size());
      tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
    }
  }
  RETURN_IF_ERROR(WriteTokenFileV2(out, tokens, meta));
  std::printf("%s: %lld windows of %lld tokens, %lld prompts (%s)\n", out.c_str(),
              static_cast<long long>(count), static_cast<long long>(length),
              static_cast<long long>(prompt), tok->name().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ithaca::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "passkey_corpus: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
