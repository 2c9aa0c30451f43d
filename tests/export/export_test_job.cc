// export_test_job DIR CORPUS [TOKENIZER_DIR]: TrainTinyJob (export_testing.h), 3 steps, for the
// export's script tests and for checking an export with transformers by hand:
// DIR/checkpoints holds the checkpoint, DIR/source_model the model directory.
#include <cstdio>
#include <string>

#include "tests/export/export_testing.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: export_test_job DIR CORPUS [TOKENIZER_DIR]\n");
    return 2;
  }
  absl::StatusOr<ithaca::TinyJob> job =
      ithaca::TrainTinyJob(argv[1], argv[2], 3, "", argc == 4 ? argv[3] : "");
  if (!job.ok()) {
    std::fprintf(stderr, "export_test_job: %s\n", std::string(job.status().message()).c_str());
    return 1;
  }
  return 0;
}
