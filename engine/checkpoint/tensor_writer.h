// TensorWriter: puts tensors into their files on a thread of its own, so that whoever produces
// them (a checkpoint's gathers, which are collective) goes on while earlier ones are written.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

// Push blocks while `limit` bytes wait (a tensor larger than that waits alone); the first error
// of a Put is returned by every later Push and by Finish, and the tensors after it are dropped.
class TensorWriter {
 public:
  using Put = std::function<absl::Status(size_t file, const std::string& tensor,
                                         const std::vector<float>& values)>;
  TensorWriter(Put put, int64_t limit);
  ~TensorWriter() { Finish().IgnoreError(); }
  TensorWriter(const TensorWriter&) = delete;
  TensorWriter& operator=(const TensorWriter&) = delete;

  absl::Status Push(size_t file, std::string tensor, std::vector<float>&& values);
  // Waits until every pushed tensor is written (or dropped after an error).
  absl::Status Finish();
  int64_t peak_bytes() const { return peak_; }  // the most that waited at once

 private:
  struct Item {
    size_t file;
    std::string tensor;
    std::vector<float> values;
  };
  void Run();

  Put put_;
  const int64_t limit_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  int64_t queued_ = 0, peak_ = 0;
  bool closed_ = false;
  absl::Status error_;
  std::thread thread_;
};

}  // namespace ithaca
