// ithaca: the command line for ithacad (docs/architecture.md; the commands: client/cli.cc).
#include "client/commands.h"

int main(int argc, char** argv) { return ithaca::RunCli(argc, argv); }
