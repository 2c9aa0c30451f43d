// Metrics: the daemon's Prometheus series (docs/architecture.md, docs/operations.md), kept in a
// prometheus-cpp registry and served on GET /metrics by MetricsHttp (below).
//
// Labels: per-rank series carry job_id (the training job; not `job`, which Prometheus gives the
// scrape job, so no `honor_labels` is needed), rank, and for a rank on a GPU gpu (the device
// index as this container sees it) and UUID; a rank on a CPU slot has neither (it is no GPU).
// A data.weights mix adds per-source series labelled job_id, source (from 1) and path. Every series
// carries Hostname (the Kubernetes node, from NODE_NAME). Join with DCGM exporter series on UUID
// (or UUID and Hostname): DCGM's `gpu` is the host's index, which differs from a container's
// whenever the pod does not own every GPU. Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/core/mutex.h"
#include "engine/core/status.h"
#include "ithaca/v1/job.pb.h"
#include "proto/version.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/http_server.h"
#include "server/job_state.h"

namespace ithaca {

class Metrics {
 public:
  // `hostname` labels every series (Hostname="..."; none when empty); `version` goes into
  // ithaca_build_info.
  explicit Metrics(const std::string& hostname = "", const std::string& version = kIthacaVersion);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Upper bounds of ithaca_step_duration_seconds buckets (+Inf is implicit): up to 2 h, for
  // million-token steps.
  static const std::vector<double>& StepBuckets();
  // When a job's workers end, its gauges of what a running rank does (tokens/s, FLOP/s, MFU,
  // memory per tier, host offload) are removed at once, so sums over the node stay true. What
  // it did last (loss, step, learning rate, gradient norm, eval loss, last step time) and its
  // counters and histograms are kept for this many finished jobs, then dropped too (bounded
  // cardinality).
  static constexpr int kFinishedJobsKept = 16;

  // `gpu` for a rank on a CPU slot: no gpu and UUID labels.
  static constexpr int kCpuSlot = -1;
  // A rank's identity: its device index and UUID, or kCpuSlot (and "").
  void OnStep(const std::string& job, int rank, int gpu, const std::string& uuid,
              const v1::StepReport& r);
  // A held-out evaluation: ithaca_eval_loss, labelled like the reporting rank's step series
  // (when it has a held-out loss), and per passkey point ithaca_passkey_accuracy and
  // ithaca_passkey_logprob{job_id, length, depth} (a multi-key point also `keys`), and per
  // eval.position_buckets bucket ithaca_eval_position_loss{job_id, begin, end}.
  void OnEval(const std::string& job, int rank, int gpu, const std::string& uuid,
              const v1::EvalReport& r);
  // A job left the queue for its workers `seconds` after it was submitted.
  void OnJobStarted(double queue_wait_seconds);
  void OnJobFinished(const std::string& job);
  void OnWorkerExit(const std::string& reason);
  // A failed job was queued again by its [retry] policy: ithaca_job_restarts_total.
  void OnJobRestarted();
  // Called before each render with the job store's counts and its newest jobs' states.
  void SetJobCounts(const std::map<JobState, int64_t>& counts);
  // ithaca_job_state{job_id,state}, ithaca_job_state_since_timestamp_seconds{job_id,state} (when
  // the job entered it) and ithaca_job_info{job_id,name,model} of the newest jobs.
  void SetJobs(const std::vector<v1::Job>& jobs);
  // The node's GPUs (index, UUID, capacity), for ithaca_gpu_memory_capacity_bytes.
  void SetDevices(const std::vector<std::tuple<int, std::string, int64_t>>& devices);

  // Every family: the registry's and the process_* ones.
  std::vector<prometheus::MetricFamily> Collect();
  // Collect() in the text exposition format.
  std::string Render();

 private:
  struct RankSeries {
    std::string job;
    int rank = 0, gpu = 0;
    std::string uuid;
    std::map<std::string, prometheus::Gauge*> memory, memory_peak;  // per tier
    prometheus::Gauge* host_optimizer = nullptr;  // under memory.optimizer_offload only
    prometheus::Gauge* host_params = nullptr;     // under memory.param_offload only
    prometheus::Gauge *host_block_inputs = nullptr, *tokens_per_second = nullptr, *loss = nullptr,
                      *step = nullptr, *flops = nullptr, *mfu = nullptr, *grad_norm = nullptr,
                      *lr = nullptr, *last_step_time = nullptr, *eval_loss = nullptr;
    prometheus::Counter* tokens = nullptr;
    prometheus::Histogram* duration = nullptr;
    // ithaca_rank_node_info{job_id, rank, node}: where a rank of a job across nodes runs.
    prometheus::Gauge* node_info = nullptr;
  };
  struct JobSeries {
    prometheus::Gauge *checkpoint_seconds = nullptr, *checkpoint_time = nullptr;
    prometheus::Gauge* trainable_parameters = nullptr;
    // Per source of a data.weights mix (from 1): samples, tokens and trained tokens (counters)
    // and the newest loss (a gauge).
    struct Source {
      prometheus::Counter *samples = nullptr, *tokens = nullptr, *loss_tokens = nullptr;
      prometheus::Gauge* loss = nullptr;
    };
    std::map<int, Source> sources;
    // Per passkey point (keys, length, depth label): accuracy and logprob.
    std::map<std::tuple<int64_t, int64_t, std::string>,
             std::pair<prometheus::Gauge*, prometheus::Gauge*>>
        passkey;
    // Per eval.position_buckets bucket (its begin and end): the loss.
    std::map<std::pair<int64_t, int64_t>, prometheus::Gauge*> positions;
  };
  prometheus::Labels RankLabels(const RankSeries& s) const;
  RankSeries& RankLocked(const std::string& job, int rank, int gpu, const std::string& uuid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddActivityLocked(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropActivityLocked(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropRankLocked(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJobLocked(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Guards the series maps below (the families and the registry are prometheus-cpp's, locked
  // by it).
  Mutex mu_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>&memory_, &memory_peak_, &host_block_inputs_,
      &host_optimizer_, &host_params_, &tokens_per_second_, &loss_, &step_, &flops_, &mfu_,
      &grad_norm_, &lr_, &last_step_time_, &eval_loss_, &job_state_, &capacity_, &jobs_,
      &checkpoint_seconds_, &checkpoint_time_, &job_state_since_, &job_info_, &rank_node_,
      &passkey_accuracy_, &passkey_logprob_, &trainable_parameters_, &source_loss_,
      &eval_position_loss_;
  prometheus::Family<prometheus::Counter>&tokens_, &exits_, &restarts_, &source_samples_,
      &source_tokens_, &source_loss_tokens_;
  prometheus::Family<prometheus::Histogram>&duration_, &queue_wait_;
  std::map<std::pair<std::string, int>, RankSeries> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobSeries> jobs_series_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<prometheus::Gauge*> job_state_series_ ABSL_GUARDED_BY(mu_),
      job_since_series_ ABSL_GUARDED_BY(mu_), job_info_series_ ABSL_GUARDED_BY(mu_),
      capacity_series_ ABSL_GUARDED_BY(mu_);
};

// GET /metrics (and GET /healthz, an empty 200), served by HttpServer (http_server.h), which
// idle or slow connections cannot stall.
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

 private:
  explicit MetricsHttp(Options o);
  Options options_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace ithaca
