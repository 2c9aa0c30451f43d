// `ithaca -o json`: a protobuf message as one line of JSON that scripts can use as it is. Unlike
// protobuf's JSON mapping, every field is present (zeros, empty strings and lists included;
// an absent message or unset optional field is null; of a oneof, only the member that is set),
// and 64-bit integers are numbers, not strings. Field names are the proto's (snake_case), enums
// their names, timestamps RFC 3339 strings.
#pragma once

#include <string>

#include "google/protobuf/message.h"

namespace ithaca {

std::string ProtoJson(const google::protobuf::Message& m);

}  // namespace ithaca
