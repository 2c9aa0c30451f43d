// Prints the job spec's key reference (docs/spec.md) from the key table.
#include <iostream>

#include "engine/spec/job_spec.h"

int main() {
  std::cout << ithaca::SpecReferenceMarkdown();
  return 0;
}
