// Metrics: the daemon's Prometheus series (docs/architecture.md), rendered in the text exposition
// format and served on GET /metrics by civetweb. Per-rank series carry the labels job, rank, gpu
// and UUID, so they join with DCGM exporter series. Thread-safe.
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "ithaca/v1/job.pb.h"
#include "server/job_state.h"

struct mg_context;

namespace ithaca {

class Metrics {
 public:
  // Upper bounds of ithaca_step_duration_seconds buckets (+Inf is implicit).
  static const std::vector<double>& StepBuckets();
  // Series of finished jobs are kept for this many jobs, then dropped (bounded cardinality).
  static constexpr int kFinishedJobsKept = 16;

  // A rank's identity: its device index and UUID ("" on a CPU node).
  void OnStep(const std::string& job, int rank, int gpu, const std::string& uuid,
              const v1::StepReport& r);
  // rank 0's evaluation (the whole job's held-out loss): ithaca_eval_loss.
  void OnEval(const std::string& job, int rank, int gpu, const std::string& uuid,
              const v1::EvalReport& r);
  void OnJobFinished(const std::string& job);
  void OnWorkerExit(const std::string& reason);
  // Called before each render with the job store's counts and its newest jobs' states.
  void SetJobCounts(const std::map<JobState, int64_t>& counts);
  void SetJobStates(const std::vector<std::pair<std::string, JobState>>& jobs);
  // The node's GPUs (index, UUID, capacity), for ithaca_gpu_memory_capacity_bytes.
  void SetDevices(const std::vector<std::tuple<int, std::string, int64_t>>& devices);

  std::string Render();

 private:
  struct RankSeries {
    int gpu = 0;
    std::string uuid;
    v1::StepReport last;
    double tokens_total = 0;
    std::vector<uint64_t> buckets;  // cumulative counts per bound
    uint64_t count = 0;
    double sum = 0;
    double last_step_time = 0;  // Unix seconds of the newest step report
  };
  std::mutex mu_;
  std::map<std::pair<std::string, int>, RankSeries> ranks_;
  // Apart from ranks_: an evaluation-only job reports no step, and its ranks have no step series.
  struct EvalSeries {
    int gpu = 0;
    std::string uuid;
    double loss = 0;
  };
  std::map<std::pair<std::string, int>, EvalSeries> evals_;
  std::deque<std::string> finished_;
  std::map<std::string, uint64_t> exits_;
  std::map<JobState, int64_t> job_counts_;
  std::vector<std::pair<std::string, JobState>> job_states_;
  std::vector<std::tuple<int, std::string, int64_t>> devices_;
};

// civetweb server for GET /metrics (and GET /healthz).
class MetricsHttp {
 public:
  struct Options {
    std::string listen = "127.0.0.1:9464";  // host:port; port 0 picks one
    Metrics* metrics = nullptr;
    std::function<void()> before_render;  // refreshes gauges (job counts)
  };
  static absl::StatusOr<std::unique_ptr<MetricsHttp>> Start(const Options& options);
  ~MetricsHttp();
  std::string address() const;  // host:port actually bound

  const Options& options() const { return options_; }

 private:
  explicit MetricsHttp(Options o) : options_(std::move(o)) {}
  Options options_;
  mg_context* ctx_ = nullptr;
};

}  // namespace ithaca
