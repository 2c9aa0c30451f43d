// Ithaca's version: the one number `ithaca --version`, `ithacad --version`, `ithaca node`
// (NodeInfo.version) and /metrics (ithaca_build_info) all print. Beside the API it goes with.
#pragma once

namespace ithaca {

inline constexpr char kIthacaVersion[] = "0.3.0";

}  // namespace ithaca
