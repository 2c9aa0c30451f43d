// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with Abseil's
// thread-safety annotations (as LevelDB's port::Mutex). Shared state is declared
// `ABSL_GUARDED_BY(mu_)` and a method that needs the lock `ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)`;
// clang's -Wthread-safety then proves every access holds it (tools/check_thread_safety.sh),
// and ThreadSanitizer, which sees pthread mutexes (absl::Mutex, in the system's uninstrumented
// libabsl, it cannot), checks the same locks at run time (tools/sanitize.sh tsan).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ithaca {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis the lock is held where it cannot see it (a lambda run under the lock).
  void AssertHeld() ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope, or until Release.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  // Unlocks before the scope ends.
  void Release() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    mu_ = nullptr;
  }

 private:
  Mutex* mu_;
};

// Waits release `mu` while they wait and hold it again when they return; a wait may return
// early (a spurious wake-up), so callers wait in a loop on their condition.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  void WaitFor(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())));
    lock.release();  // still held: the caller's
  }
  void WaitUntil(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    WaitFor(mu, deadline - absl::Now());
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ithaca
