// Byte units, defined once.
#pragma once

namespace ithaca {

// A gibibyte in bytes, as a double: budgets and reports in GiB are fractions
// (`bytes / kGiB`, `static_cast<int64_t>(gib * kGiB)`).
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace ithaca
