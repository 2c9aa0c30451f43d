// The `ithaca` command line (CLI11): RunCli parses argv and runs a command (commands.h).
#pragma once

#include <string>

namespace ithaca {

// `ithaca completion bash`: a bash completion script made from the command line's own
// definitions (every command, flag and the values they take; job ids from `ithaca -q list`).
std::string BashCompletion();

}  // namespace ithaca
