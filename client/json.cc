#include "client/json.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/timestamp.pb.h"
#include "google/protobuf/util/time_util.h"

namespace ithaca {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void AppendString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        absl::StrAppend(out, "\\\"");
        break;
      case '\\':
        absl::StrAppend(out, "\\\\");
        break;
      case '\n':
        absl::StrAppend(out, "\\n");
        break;
      case '\t':
        absl::StrAppend(out, "\\t");
        break;
      case '\r':
        absl::StrAppend(out, "\\r");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppend(out, absl::StrFormat("\\u%04x", c));
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendDouble(std::string* out, double v) {
  if (std::isnan(v)) return absl::StrAppend(out, "\"NaN\"");
  if (std::isinf(v)) return absl::StrAppend(out, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  // The shortest of %.15g and %.17g that reads back as the same double (0.003, not
  // 0.0030000000000000001).
  std::string s = absl::StrFormat("%.15g", v);
  if (std::strtod(s.c_str(), nullptr) != v) s = absl::StrFormat("%.17g", v);
  absl::StrAppend(out, s);
}

void AppendMessage(std::string* out, const Message& m);

void AppendValue(std::string* out, const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrAppend(out, rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrAppend(out, rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrAppend(out, rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrAppend(out, rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return AppendDouble(out, rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return AppendDouble(out, rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return absl::StrAppend(
          out, (rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f)) ? "true" : "false");
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int v = rep ? r->GetRepeatedEnumValue(m, f, index) : r->GetEnumValue(m, f);
      const auto* value = f->enum_type()->FindValueByNumber(v);
      if (value == nullptr) return absl::StrAppend(out, v);
      return AppendString(out, value->name());
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      return AppendString(out,
                          f->type() == FieldDescriptor::TYPE_BYTES ? absl::Base64Escape(s) : s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return AppendMessage(out, rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
}

void AppendMessage(std::string* out, const Message& m) {
  if (m.GetDescriptor()->full_name() == "google.protobuf.Timestamp") {
    return AppendString(out, google::protobuf::util::TimeUtil::ToString(
                                 static_cast<const google::protobuf::Timestamp&>(m)));
  }
  const Reflection* r = m.GetReflection();
  const auto* d = m.GetDescriptor();
  out->push_back('{');
  bool first = true;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const bool in_real_oneof = f->real_containing_oneof() != nullptr;
    if (in_real_oneof && !r->HasField(m, f)) continue;
    if (!first) out->push_back(',');
    first = false;
    AppendString(out, f->name());
    out->push_back(':');
    if (f->is_repeated()) {
      out->push_back('[');
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        if (j > 0) out->push_back(',');
        AppendValue(out, m, f, j);
      }
      out->push_back(']');
    } else if (f->has_presence() && !r->HasField(m, f)) {
      absl::StrAppend(out, "null");
    } else {
      AppendValue(out, m, f, 0);
    }
  }
  out->push_back('}');
}

}  // namespace

std::string ProtoJson(const Message& m) {
  std::string out;
  AppendMessage(&out, m);
  return out;
}

}  // namespace ithaca
