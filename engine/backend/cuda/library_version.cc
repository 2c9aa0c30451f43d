#include "engine/backend/cuda/library_version.h"

#include "absl/strings/str_cat.h"

namespace ithaca {

std::string FormatLibraryVersion(int64_t code) {
  return absl::StrCat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

absl::StatusOr<std::string> CheckLibraryVersion(const std::string& library, int64_t built,
                                                int64_t loaded) {
  const std::string built_text = FormatLibraryVersion(built);
  if (loaded <= 0) {
    return absl::UnavailableError(
        absl::StrCat(library, ": built with ", built_text, " but none could be loaded"));
  }
  const std::string loaded_text = FormatLibraryVersion(loaded);
  if (loaded < built) {
    return absl::FailedPreconditionError(absl::StrCat(
        library, " ", loaded_text, " is loaded but this binary was built with ", library, " ",
        built_text, ": put the newer library first on LD_LIBRARY_PATH or rebuild"));
  }
  return absl::StrCat(library, " ", loaded_text, " (built with ", built_text, ")");
}

}  // namespace ithaca
