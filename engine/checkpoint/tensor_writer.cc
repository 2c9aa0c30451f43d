#include "engine/checkpoint/tensor_writer.h"

#include <algorithm>
#include <utility>

namespace ithaca {

TensorWriter::TensorWriter(Put put, int64_t limit) : put_(std::move(put)), limit_(limit) {
  thread_ = std::thread([this] { Run(); });
}

absl::Status TensorWriter::Push(size_t file, std::string tensor, std::vector<float>&& values) {
  const int64_t bytes = static_cast<int64_t>(values.size() * sizeof(float));
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !error_.ok() || queued_ == 0 || queued_ + bytes <= limit_; });
  if (!error_.ok()) return error_;
  queue_.push_back({file, std::move(tensor), std::move(values)});
  queued_ += bytes;
  peak_ = std::max(peak_, queued_);
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status TensorWriter::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    changed_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  return error_;
}

void TensorWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return closed_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closed, and nothing left
    Item item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    // Only this thread sets error_, so it reads it without the lock.
    absl::Status st = error_.ok() ? put_(item.file, item.tensor, item.values) : absl::OkStatus();
    const int64_t bytes = static_cast<int64_t>(item.values.size() * sizeof(float));
    item.values = std::vector<float>();  // freed before the producer may queue more
    lock.lock();
    if (error_.ok() && !st.ok()) error_ = st;
    queued_ -= bytes;
    changed_.notify_all();
  }
}

}  // namespace ithaca
