#include "launch/rpc_text.h"

#include "absl/strings/str_cat.h"
#include "engine/core/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace ithaca {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

int SanitizeUtf8(Message* message) {
  const Reflection* r = message->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(*message, &fields);  // only the fields that are set
  int changed = 0;
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING &&
        f->type() == FieldDescriptor::TYPE_STRING) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*message, f); ++i) {
          std::string scratch;
          const std::string& v = r->GetRepeatedStringReference(*message, f, i, &scratch);
          if (!IsValidUtf8(v)) {
            r->SetRepeatedString(message, f, i, ToValidUtf8(v));
            ++changed;
          }
        }
      } else {
        std::string scratch;
        const std::string& v = r->GetStringReference(*message, f, &scratch);
        if (!IsValidUtf8(v)) {
          r->SetString(message, f, ToValidUtf8(v));
          ++changed;
        }
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      // Map fields are repeated entry messages: their keys and values are covered here too.
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*message, f); ++i) {
          changed += SanitizeUtf8(r->MutableRepeatedMessage(message, f, i));
        }
      } else {
        changed += SanitizeUtf8(r->MutableMessage(message, f));
      }
    }
  }
  return changed;
}

namespace {

class Utf8RequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit Utf8RequestInterceptor(grpc::experimental::ServerRpcInfo* info) : info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status sent = methods->GetSendStatus();
      // gRPC answers an unparsable request INTERNAL with an empty message.
      if (sent.error_code() == grpc::StatusCode::INTERNAL && sent.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat(info_->method() ? info_->method() : "request",
                         ": the request does not parse: a string field holds bytes that are not "
                         "valid UTF-8 (protobuf strings must be UTF-8), or the message is "
                         "malformed")));
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  bool unparsed_ = false;
};

class Utf8RequestInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Utf8RequestInterceptor(info);
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Utf8RequestErrors() {
  return std::make_unique<Utf8RequestInterceptorFactory>();
}

void AddRpcBoundary(
    grpc::ServerBuilder* builder,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> others) {
  others.push_back(Utf8RequestErrors());
  builder->experimental().SetInterceptorCreators(std::move(others));
}

}  // namespace ithaca
