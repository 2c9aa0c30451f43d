// The one UTF-8 rule at the RPC boundary (engine/core/utf8.h): proto3 `string` fields must hold
// valid UTF-8, or the receiver cannot parse the message at all (the real error is lost; a
// Python client sees "Exception deserializing response").
//
// Out: every message the daemon or a worker sends passes through SanitizeUtf8 first (file
// names in Latin-1, log lines, reasons quoting them), which replaces invalid bytes with U+FFFD.
// In: a request that gRPC cannot parse (in practice: a string field with invalid UTF-8) gets
// INVALID_ARGUMENT saying so, not INTERNAL with an empty message (Utf8RequestErrors).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

#include "google/protobuf/message.h"

namespace ithaca {

// Replaces invalid UTF-8 in every string field of `message`, nested messages and repeated and
// map fields included. Returns how many fields it changed.
int SanitizeUtf8(google::protobuf::Message* message);

// For ServerBuilder::experimental().SetInterceptorCreators: turns the status of a call whose
// request did not parse into INVALID_ARGUMENT "<method>: the request does not parse: ...".
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Utf8RequestErrors();

// Installs Utf8RequestErrors on `builder` (keeps any interceptors given in `others`).
void AddRpcBoundary(
    grpc::ServerBuilder* builder,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> others =
        {});

}  // namespace ithaca
