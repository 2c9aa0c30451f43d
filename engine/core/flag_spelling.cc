#include "engine/core/flag_spelling.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ithaca {

std::vector<char*> FlagSpelling::argv() {
  std::vector<char*> out;
  for (std::string& a : args) out.push_back(a.data());
  return out;
}

FlagSpelling ToAbslSpelling(const std::string& program, int argc, char** argv) {
  FlagSpelling f;
  bool flags_ended = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && !flags_ended && a == "--") flags_ended = true;
    if (i > 0 && !flags_ended && a.size() > 2 && a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      const std::string name = a.substr(2, end - 2);
      if (name.find('_') != std::string::npos) {
        std::string dashed = name;
        std::replace(dashed.begin(), dashed.end(), '_', '-');
        f.warnings.push_back(program + ": --" + name + " is the old spelling; use --" + dashed +
                             " (the old one will be refused in a later release)");
      }
      std::replace(a.begin() + 2, a.begin() + end, '-', '_');
    }
    f.args.push_back(std::move(a));
  }
  return f;
}

FlagSpelling NormalizeFlags(const std::string& program, int argc, char** argv) {
  FlagSpelling f = ToAbslSpelling(program, argc, argv);
  for (const std::string& w : f.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  return f;
}

bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    for (const char* h : {"--help", "-h", "--helpfull", "-help"}) {
      if (std::strcmp(argv[i], h) == 0) return true;
    }
  }
  return false;
}

std::string DashedFlagHelp(const std::string& file_part) {
  std::vector<std::pair<std::string, const absl::CommandLineFlag*>> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), file_part)) flags.emplace_back(std::string(name), flag);
  }
  std::sort(flags.begin(), flags.end());
  std::string out;
  for (auto& [name, flag] : flags) {
    std::replace(name.begin(), name.end(), '_', '-');
    const std::string def = flag->DefaultValue();
    absl::StrAppend(&out, "  --", name, def.empty() ? "" : absl::StrCat(" (default ", def, ")"),
                    "\n      ", flag->Help(), "\n");
  }
  return out;
}

}  // namespace ithaca
