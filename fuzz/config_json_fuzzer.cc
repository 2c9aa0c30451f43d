// libFuzzer harness: Hugging Face config.json (engine/model/config.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ithaca::LlamaConfig> cfg = ithaca::ParseConfigJson(text);
  if (cfg.ok()) (void)ithaca::ValidateConfig(*cfg);
  return 0;
}
