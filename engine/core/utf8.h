// UTF-8 at the RPC boundary: proto3 `string` fields must hold valid UTF-8 (a message with one
// invalid byte fails to parse at the receiver), but file names, log lines and client input may
// hold any bytes. Everything the daemon or a worker puts into a proto string passes through
// ToValidUtf8 (launch/rpc_text.h does it for whole messages).
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace ithaca {

// Valid UTF-8 as protobuf checks it: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(absl::string_view text);

// `text` with every byte that does not start a valid sequence replaced by U+FFFD; valid input
// comes back unchanged.
std::string ToValidUtf8(absl::string_view text);

// At most `max_bytes` of `text` (cut at a character boundary of valid UTF-8), followed by
// "... (N more bytes)" when anything was cut; valid UTF-8 either way.
std::string BoundedUtf8(absl::string_view text, size_t max_bytes);

}  // namespace ithaca
