// libFuzzer harness: token files of versions 1 and 2 (engine/data/token_file.h). Open validates
// the header, the document index and the loss mask; a file it accepts is then served by a
// DataLoader, which relies on that validation.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "engine/data/data_loader.h"
#include "engine/data/token_file.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ithaca::fuzz::InputFile file(".tok");
  auto opened = ithaca::TokenFile::Open(file.Write(data, size));
  if (!opened.ok()) return 0;
  std::unique_ptr<ithaca::TokenFile> tf = std::move(*opened);
  // Touch everything Open vouched for, so ASan sees any read past the mapping.
  uint64_t sum = 0;
  for (int64_t i = 0; i < tf->size(); ++i) sum += tf->tokens()[i];
  for (int64_t i = 0; i < tf->num_docs(); ++i) {
    if (tf->doc_starts()[i] >= static_cast<uint64_t>(tf->size())) std::abort();
    sum += tf->doc_starts()[i];
  }
  if (tf->loss_mask() != nullptr) {
    for (int64_t i = 0; i < tf->size(); ++i) sum += tf->loss_mask()[i];
  }
  if (tf->vocab_size() != 0) {
    for (int64_t i = 0; i < tf->size(); ++i) {
      if (tf->tokens()[i] >= tf->vocab_size()) std::abort();  // Open must refuse such a file
    }
  }
  const int64_t seq_len = 4;
  // Every mask the file can serve: documents (by index, or BOS 0 in version 1), loss mask.
  ithaca::DataOptions options;
  options.document_mask = true;
  options.bos_id = 0;
  options.loss_mask = tf->loss_mask() != nullptr;
  auto loader = ithaca::DataLoader::Create(std::move(tf), seq_len, int64_t{1} << 31, options);
  if (loader.ok()) {
    std::vector<int32_t> inputs(seq_len), labels(seq_len);
    const int64_t samples = (*loader)->samples_per_epoch();
    for (int64_t i = 0; i < samples + 1 && i < 64; ++i) {
      sum += static_cast<uint64_t>((*loader)->CountLabels(i));
      (*loader)->Next(inputs.data(), labels.data());
    }
  }
  static volatile uint64_t sink;
  sink = sum;  // keeps the loops from being optimized away
  return 0;
}
