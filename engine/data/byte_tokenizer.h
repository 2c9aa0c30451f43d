// The byte-level tokenizer of the demo and the tests, and the version 2 metadata of what it
// writes (engine/data/token_file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/token_file.h"

namespace ithaca {

// Byte-level tokenizer for the demo and tests: token = byte value (0..255), and kByteBos (256)
// starts every document (documents are separated by blank lines). vocab_size 258.
// A document is a run of non-blank lines (a blank line is empty or only spaces, tabs and '\r');
// its tokens are BOS then every byte of its lines, newlines included. The separating blank lines
// produce no tokens, and no EOS is emitted: the next document's BOS marks the boundary.
inline constexpr uint32_t kByteBos = 256;
inline constexpr uint32_t kByteEos = 257;
inline constexpr uint32_t kByteVocab = 258;
std::vector<uint32_t> ByteTokenize(const std::string& text);
// The version 2 metadata of ByteTokenize's output: BOS 256, no EOS, a document per BOS.
TokenFileMeta ByteTokenMeta(const std::vector<uint32_t>& tokens);

}  // namespace ithaca
