// TensorBoard scalars (metrics.tensorboard = true): rank 0 writes an event file that the
// `tensorboard` package reads (and W&B syncs), written here without TensorFlow:
//
// - The file is a sequence of TFRecords: uint64 length (little-endian), uint32 masked CRC-32C of
//   those 8 bytes, the data, uint32 masked CRC-32C of the data; masked(c) = ((c >> 15) |
//   (c << 17)) + 0xa282ead8.
// - Each record is a serialized tensorflow.Event: wall_time (1, double), step (2, int64),
//   file_version (3, string; the first record's: "brain.Event:2") or summary (5), a Summary of
//   values (1) each with tag (1, string) and simple_value (2, float).
//
// Files are named events.out.tfevents.<unix seconds>.<host>.<pid> (TensorBoard's pattern) in
// the directory given; a resumed job adds a file beside the earlier run's, and TensorBoard shows
// them as one run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

// CRC-32C (Castagnoli), as TFRecord frames use it.
uint32_t Crc32c(const void* data, size_t n);
uint32_t MaskedCrc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it holding the file_version record.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` with these (tag, value) scalars, written through to the file (flushed,
  // so a watching TensorBoard sees each step as it comes).
  absl::Status Write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                     double wall_time = 0);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  absl::Status Record(const std::string& data);
  std::FILE* f_;
  std::string path_;
};

// The serialized Event (exposed for the tests).
std::string TensorBoardScalarEvent(double wall_time, int64_t step,
                                   const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace ithaca
