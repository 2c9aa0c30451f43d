// SHA-256 (FIPS 180-4), so that a tokenizer's fingerprint (engine/data/token_file.h) needs no
// crypto library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace ithaca {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256(const void* data, size_t n);
// SHA-256 of a file's bytes (the fingerprint of a tokenizer.json, at most kMaxTokenizerBytes).
absl::StatusOr<Sha256Digest> Sha256File(const std::string& path);

}  // namespace ithaca
