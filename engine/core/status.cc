#include "engine/core/status.h"

#include "absl/strings/cord.h"

namespace ithaca {
namespace {
constexpr char kNonFiniteLossPayload[] = "ithaca.dev/non-finite-loss";
}  // namespace

absl::Status NonFiniteLossError(absl::string_view message) {
  absl::Status st = absl::DataLossError(message);
  st.SetPayload(kNonFiniteLossPayload, absl::Cord("1"));
  return st;
}

bool IsNonFiniteLoss(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss &&
         status.GetPayload(kNonFiniteLossPayload).has_value();
}

}  // namespace ithaca
