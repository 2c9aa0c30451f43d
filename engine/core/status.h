// Status helpers: Abseil's Status/StatusOr plus the propagation macros used everywhere.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#define ITHACA_CONCAT_INNER(a, b) a##b
#define ITHACA_CONCAT(a, b) ITHACA_CONCAT_INNER(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status _ithaca_st = (expr);      \
    if (!_ithaca_st.ok()) return _ithaca_st; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, Foo());` unwraps a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(ITHACA_CONCAT(_ithaca_sor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

// For invariants that only a bug can break (not for user input): aborts with a message.
#define ITHACA_CHECK(cond, ...)                                                                    \
  do {                                                                                             \
    if (!(cond)) ::ithaca::CheckFailed(__FILE__, __LINE__, #cond, ::absl::StrCat("" __VA_ARGS__)); \
  } while (0)

namespace ithaca {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);

// A training or eval loss that became NaN or infinite: DATA_LOSS, marked with a payload so that
// the worker's exit code (launch/exit_codes.h) tells it from corrupt data without reading the
// message. The mark survives only on the status itself: code that rewrites a status's message
// must copy it (absl::Status::ForEachPayload) or keep the status.
absl::Status NonFiniteLossError(absl::string_view message);
bool IsNonFiniteLoss(const absl::Status& status);
}  // namespace ithaca
