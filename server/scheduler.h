// Scheduler: first in, first out over the node's slots (GPUs, or CPU ranks on a CPU node).
// The head of the queue waits for enough free slots; nothing behind it jumps ahead, so a big job
// is never starved by a stream of small ones. Not thread-safe: Jobs owns it.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

class Scheduler {
 public:
  struct Options {
    int slots = 1;  // GPUs, or CPU slots
  };
  struct Assignment {
    std::string job_id;
    std::vector<int> slots;  // ascending slot indices, one per rank
  };

  explicit Scheduler(const Options& options);

  // Queues a job that needs `world` slots. FAILED_PRECONDITION when the node can never run it.
  absl::Status Enqueue(const std::string& job_id, int world);
  // Removes a queued job; false when it was not queued.
  bool Remove(const std::string& job_id);
  // Pops every job from the head of the queue that fits now and gives it slots.
  std::vector<Assignment> Schedule();
  // Gives a running job these slots (a job adopted after a daemon restart keeps the ones it
  // runs on). FAILED_PRECONDITION when one is outside the node or held by another job.
  absl::Status Reserve(const std::string& job_id, const std::vector<int>& slots);
  // Frees a running job's slots.
  void Release(const std::string& job_id);

  int total_slots() const { return static_cast<int>(owner_.size()); }
  int free_slots() const;
  int queued() const { return static_cast<int>(queue_.size()); }
  // Which job holds each slot ("" when free).
  const std::vector<std::string>& owners() const { return owner_; }

 private:
  struct Pending {
    std::string job_id;
    int world;
  };
  std::deque<Pending> queue_;
  std::vector<std::string> owner_;
};

}  // namespace ithaca
