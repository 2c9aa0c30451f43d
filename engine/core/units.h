// Byte units, defined once: every GiB (and MiB) in the code is one of these.
#pragma once

#include <cstdint>

namespace ithaca {

// A gibibyte in bytes, as an integer: sizes written in GiB (`4 * kGiBBytes`) and the GiB-or-MiB
// choice of reports (`bytes >= kGiBBytes`).
inline constexpr int64_t kGiBBytes = int64_t{1} << 30;
// The same, as a double: budgets and reports in GiB are fractions
// (`bytes / kGiB`, `static_cast<int64_t>(gib * kGiB)`).
inline constexpr double kGiB = static_cast<double>(kGiBBytes);
// A mebibyte, for the reports of models too small to read in GiB.
inline constexpr double kMiB = static_cast<double>(int64_t{1} << 20);

}  // namespace ithaca
