#include "engine/core/library_version.h"

#include "absl/strings/str_cat.h"

namespace ithaca {

std::string FormatLibraryVersion(int64_t code) {
  return absl::StrCat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

absl::StatusOr<std::string> CheckLibraryVersion(const std::string& library, int64_t built,
                                                int64_t loaded, int64_t minimum) {
  const std::string built_text = FormatLibraryVersion(built);
  if (loaded <= 0) {
    return absl::UnavailableError(
        absl::StrCat(library, ": built with ", built_text, " but none could be loaded"));
  }
  const std::string loaded_text = FormatLibraryVersion(loaded);
  const bool other_major = loaded / 10000 != built / 10000;
  if (loaded < minimum || other_major) {
    return absl::FailedPreconditionError(absl::StrCat(
        library, " ", loaded_text, " is loaded but Ithaca needs ", library, " ",
        other_major ? absl::StrCat(built / 10000, ".x (it was built with ", built_text, ")")
                    : absl::StrCat(FormatLibraryVersion(minimum), " or newer"),
        ": put a suitable library first on LD_LIBRARY_PATH or rebuild"));
  }
  return absl::StrCat(library, " ", loaded_text, " (built with ", built_text, ")");
}

LibraryReport CombineLibraryReports(const std::vector<absl::StatusOr<std::string>>& reports) {
  LibraryReport out;
  for (const auto& report : reports) {
    if (out.refusal.ok() && report.status().code() == absl::StatusCode::kFailedPrecondition) {
      out.refusal = report.status();
    }
    absl::StrAppend(&out.line, out.line.empty() ? "" : ", ",
                    report.ok() ? *report : report.status().message());
  }
  return out;
}

}  // namespace ithaca
