// libFuzzer harness: the UTF-8 rule at the RPC boundary (engine/core/utf8.h, which
// launch/rpc_text.h applies to every string field of every message the daemon and the workers
// send). For any bytes: IsValidUtf8 agrees with protobuf's own validator (what makes a
// receiver's parse fail), ToValidUtf8 always gives what protobuf accepts and leaves valid text
// unchanged, and BoundedUtf8 stays valid and bounded.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/core/utf8.h"
#include "google/protobuf/stubs/common.h"

namespace {

bool ProtobufAccepts(const std::string& s) {
  return google::protobuf::internal::IsStructurallyValidUTF8(s.data(), static_cast<int>(s.size()));
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz check: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const bool valid = ithaca::IsValidUtf8(in);
  Check(valid == ProtobufAccepts(in), "IsValidUtf8 disagrees with protobuf");
  const std::string fixed = ithaca::ToValidUtf8(in);
  Check(ProtobufAccepts(fixed), "ToValidUtf8 gave what protobuf refuses");
  Check(!valid || fixed == in, "ToValidUtf8 changed valid text");
  Check(fixed.size() <= 3 * in.size(), "ToValidUtf8 grew more than 3x");
  const size_t bound = size % 64;
  const std::string bounded = ithaca::BoundedUtf8(in, bound);
  Check(ProtobufAccepts(bounded), "BoundedUtf8 gave what protobuf refuses");
  Check(in.size() <= bound || bounded.size() <= 3 * bound + 40, "BoundedUtf8 is not bounded");
  return 0;
}
