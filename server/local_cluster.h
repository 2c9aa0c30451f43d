// The cluster of one node: a job's ranks are this node's processes, forked by the launcher
// (launch/launcher.h) in a process group of their own, judged by waitpid (or, once adopted
// after a daemon restart, through /proc and what they announced), and stopped by signals to the
// group: SIGTERM, then SIGKILL after the grace period.
#pragma once

#include <optional>
#include <string>

#include "launch/launcher.h"
#include "server/cluster.h"
#include "server/node.h"

namespace ithaca {

class LocalCluster : public Cluster {
 public:
  struct Options {
    std::string worker_binary;  // ithaca-worker
    std::string worker_socket;  // the WorkerService unix socket the workers dial
    std::optional<RunAs> run_as;
    absl::Duration grace_period = absl::Seconds(10);  // SIGTERM → SIGKILL
  };
  LocalCluster(Options options, Node node) : options_(std::move(options)), node_(std::move(node)) {}

  absl::StatusOr<Launched> Launch(const LaunchOrder& order, SupervisedJob& job) override;
  void Adopt(const AdoptOrder& order, SupervisedJob& job) override;
  std::optional<WorkerEnd> RankEnd(const SupervisedJob& job, SupervisedRank& rank,
                                   absl::Time now) override;
  void Stop(SupervisedJob& job, JobState outcome, bool now) override;
  void Kill(SupervisedJob& job) override;
  absl::Status Drain(SupervisedJob& job) override;
  std::string VanishedReason(const SupervisedJob& job, size_t rank) const override;

 private:
  const Options options_;
  const Node node_;
};

}  // namespace ithaca
