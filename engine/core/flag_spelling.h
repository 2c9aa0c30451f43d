// One flag style across the binaries (docs/cli.md): flags are spelled with dashes
// (--source-model, --state-dir), as the `ithaca` CLI (CLI11) spells them. The binaries that parse
// with absl (ithacad, ithaca-export, token_file_dump) define their flags with underscores, as
// absl requires; this turns the command line into absl's spelling before absl::ParseCommandLine.
//
// The old underscore spelling of a flag of several words (--source_model) still works, with a
// warning on stderr naming the new one: "ithaca-export: --source_model is the old spelling;
// use --source-model (the old one will be refused in a later release)". A lone "--" ends the
// flags: what follows is left as it is.
#pragma once

#include <string>
#include <vector>

namespace ithaca {

struct FlagSpelling {
  std::vector<std::string> args;      // argv in absl's spelling
  std::vector<std::string> warnings;  // one per old-style flag, in order
  // For absl::ParseCommandLine: pointers into `args` (valid while this lives).
  std::vector<char*> argv();
};

FlagSpelling ToAbslSpelling(const std::string& program, int argc, char** argv);

// ToAbslSpelling, its warnings printed to stderr; the result's argv() goes to absl.
FlagSpelling NormalizeFlags(const std::string& program, int argc, char** argv);

// True when argv asks for help (--help, -h, --helpfull, -help): the binary prints
// DashedFlagHelp instead of absl's list, which names flags as declared (--state_dir).
bool AsksForHelp(int argc, char** argv);
// The flags declared in source files whose name contains `file_part`, as they are typed
// (--state-dir), each with its default and help, sorted.
std::string DashedFlagHelp(const std::string& file_part);

}  // namespace ithaca
