#include "server/scheduler.h"

#include <algorithm>

namespace ithaca {

Scheduler::Scheduler(const Options& options) : owner_(std::max(options.slots, 0)) {}

absl::Status Scheduler::Enqueue(const std::string& job_id, int world) {
  if (world < 1 || world > total_slots()) {
    return absl::FailedPreconditionError(absl::StrCat("parallel.world: the job needs ", world,
                                                      " slots; this node has ", total_slots()));
  }
  queue_.push_back({job_id, world});
  return absl::OkStatus();
}

bool Scheduler::Remove(const std::string& job_id) {
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Pending& p) { return p.job_id == job_id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

int Scheduler::free_slots() const {
  return static_cast<int>(std::count(owner_.begin(), owner_.end(), std::string()));
}

std::vector<Scheduler::Assignment> Scheduler::Schedule() {
  std::vector<Assignment> out;
  while (!queue_.empty() && queue_.front().world <= free_slots()) {
    Assignment a;
    a.job_id = queue_.front().job_id;
    for (int s = 0; s < total_slots() && static_cast<int>(a.slots.size()) < queue_.front().world;
         ++s) {
      if (owner_[s].empty()) {
        owner_[s] = a.job_id;
        a.slots.push_back(s);
      }
    }
    queue_.pop_front();
    out.push_back(std::move(a));
  }
  return out;
}

absl::Status Scheduler::Reserve(const std::string& job_id, const std::vector<int>& slots) {
  for (int s : slots) {
    if (s < 0 || s >= total_slots()) {
      return absl::FailedPreconditionError(
          absl::StrCat("slot ", s, " is outside this node's ", total_slots()));
    }
    if (!owner_[s].empty() && owner_[s] != job_id) {
      return absl::FailedPreconditionError(absl::StrCat("slot ", s, " is held by job ", owner_[s]));
    }
  }
  for (int s : slots) owner_[s] = job_id;
  return absl::OkStatus();
}

void Scheduler::Release(const std::string& job_id) {
  for (std::string& o : owner_) {
    if (o == job_id) o.clear();
  }
}

}  // namespace ithaca
