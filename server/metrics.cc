#include "server/metrics.h"

#include <civetweb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ithaca {
namespace {

std::string Escape(const std::string& v) {
  return absl::StrReplaceAll(v, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

std::string Num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.15g", v);
}

void Header(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

const std::vector<double>& Metrics::StepBuckets() {
  static const auto* b = new std::vector<double>{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                 2.5,   5,    10,    25,   60,  120,  300};
  return *b;
}

void Metrics::OnStep(const std::string& job, int rank, int gpu, const std::string& uuid,
                     const v1::StepReport& r) {
  std::lock_guard<std::mutex> lock(mu_);
  RankSeries& s = ranks_[{job, rank}];
  if (s.buckets.empty()) s.buckets.assign(StepBuckets().size(), 0);
  s.gpu = gpu;
  s.uuid = uuid;
  s.last = r;
  s.tokens_total += r.tokens();
  s.last_step_time = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  s.count += 1;
  s.sum += r.seconds();
  for (size_t i = 0; i < StepBuckets().size(); ++i) {
    if (r.seconds() <= StepBuckets()[i]) s.buckets[i] += 1;
  }
}

void Metrics::OnEval(const std::string& job, int rank, int gpu, const std::string& uuid,
                     const v1::EvalReport& r) {
  std::lock_guard<std::mutex> lock(mu_);
  evals_[{job, rank}] = EvalSeries{gpu, uuid, r.loss()};
}

void Metrics::OnJobFinished(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(finished_.begin(), finished_.end(), job) != finished_.end()) return;
  finished_.push_back(job);
  while (static_cast<int>(finished_.size()) > kFinishedJobsKept) {
    const std::string old = finished_.front();
    finished_.pop_front();
    for (auto it = ranks_.begin(); it != ranks_.end();) {
      it = it->first.first == old ? ranks_.erase(it) : std::next(it);
    }
    for (auto it = evals_.begin(); it != evals_.end();) {
      it = it->first.first == old ? evals_.erase(it) : std::next(it);
    }
  }
}

void Metrics::OnWorkerExit(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  exits_[reason] += 1;
}

void Metrics::SetJobCounts(const std::map<JobState, int64_t>& counts) {
  std::lock_guard<std::mutex> lock(mu_);
  job_counts_ = counts;
}

void Metrics::SetJobStates(const std::vector<std::pair<std::string, JobState>>& jobs) {
  std::lock_guard<std::mutex> lock(mu_);
  job_states_ = jobs;
}

void Metrics::SetDevices(const std::vector<std::tuple<int, std::string, int64_t>>& devices) {
  std::lock_guard<std::mutex> lock(mu_);
  devices_ = devices;
}

std::string Metrics::Render() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto labels = [](const std::pair<std::string, int>& key, const RankSeries& s) {
    return absl::StrCat("job=\"", Escape(key.first), "\",rank=\"", key.second, "\",gpu=\"", s.gpu,
                        "\",UUID=\"", Escape(s.uuid), "\"");
  };
  auto gauge = [&](const char* name, const char* help,
                   const std::function<double(const RankSeries&)>& value) {
    Header(&out, name, "gauge", help);
    for (const auto& [key, s] : ranks_) {
      absl::StrAppend(&out, name, "{", labels(key, s), "} ", Num(value(s)), "\n");
    }
  };
  auto tier_gauge = [&](const char* name, const char* help, bool peak) {
    Header(&out, name, "gauge", help);
    for (const auto& [key, s] : ranks_) {
      for (const v1::TierBytes& t : s.last.memory()) {
        if (t.tier() == "host_offload") continue;
        absl::StrAppend(&out, name, "{", labels(key, s), ",tier=\"", Escape(t.tier()), "\"} ",
                        peak ? t.peak_bytes() : t.current_bytes(), "\n");
      }
    }
  };
  tier_gauge("ithaca_gpu_memory_bytes", "Device memory in use per tier at the end of the step.",
             false);
  tier_gauge("ithaca_gpu_memory_peak_bytes", "Peak device memory per tier during the step.", true);
  gauge("ithaca_host_offload_bytes", "Pinned host memory holding offloaded checkpoints.",
        [](const RankSeries& s) {
          for (const v1::TierBytes& t : s.last.memory()) {
            if (t.tier() == "host_offload") return static_cast<double>(t.current_bytes());
          }
          return 0.0;
        });
  gauge("ithaca_tokens_per_second", "Training tokens per second of this rank (per GPU).",
        [](const RankSeries& s) { return s.last.tokens_per_second(); });
  Header(&out, "ithaca_tokens_total", "counter", "Tokens trained by this rank.");
  for (const auto& [key, s] : ranks_) {
    absl::StrAppend(&out, "ithaca_tokens_total{", labels(key, s), "} ", Num(s.tokens_total), "\n");
  }
  gauge("ithaca_train_loss", "Mean cross-entropy of the newest step.",
        [](const RankSeries& s) { return s.last.loss(); });
  Header(&out, "ithaca_eval_loss", "gauge",
         "Held-out loss of the job's newest evaluation ([eval]; mean over every rank's tokens).");
  for (const auto& [key, e] : evals_) {
    absl::StrAppend(&out, "ithaca_eval_loss{job=\"", Escape(key.first), "\",rank=\"", key.second,
                    "\",gpu=\"", e.gpu, "\",UUID=\"", Escape(e.uuid), "\"} ", Num(e.loss), "\n");
  }
  gauge("ithaca_train_step", "Newest completed optimizer step.",
        [](const RankSeries& s) { return static_cast<double>(s.last.step()); });
  Header(&out, "ithaca_step_duration_seconds", "histogram", "Wall time of one optimizer step.");
  for (const auto& [key, s] : ranks_) {
    const std::string l = labels(key, s);
    for (size_t i = 0; i < StepBuckets().size(); ++i) {
      absl::StrAppend(&out, "ithaca_step_duration_seconds_bucket{", l, ",le=\"",
                      Num(StepBuckets()[i]), "\"} ", s.buckets[i], "\n");
    }
    absl::StrAppend(&out, "ithaca_step_duration_seconds_bucket{", l, ",le=\"+Inf\"} ", s.count,
                    "\n");
    absl::StrAppend(&out, "ithaca_step_duration_seconds_sum{", l, "} ", Num(s.sum), "\n");
    absl::StrAppend(&out, "ithaca_step_duration_seconds_count{", l, "} ", s.count, "\n");
  }
  gauge("ithaca_model_flops_per_second", "Model FLOPs per second of this rank.",
        [](const RankSeries& s) { return s.last.model_tflops() * 1e12; });
  gauge("ithaca_mfu_ratio", "Model FLOPs utilization (0..1) of this rank.",
        [](const RankSeries& s) { return s.last.mfu(); });
  gauge("ithaca_grad_norm", "Global gradient norm of the newest step.",
        [](const RankSeries& s) { return s.last.grad_norm(); });
  gauge("ithaca_learning_rate", "Learning rate of the newest step.",
        [](const RankSeries& s) { return s.last.lr(); });
  gauge("ithaca_last_step_timestamp_seconds", "Unix time of this rank's newest step report.",
        [](const RankSeries& s) { return s.last_step_time; });
  Header(&out, "ithaca_job_state", "gauge",
         "1 for each recent job's current state (one series per job).");
  for (const auto& [job, state] : job_states_) {
    absl::StrAppend(&out, "ithaca_job_state{job=\"", Escape(job), "\",state=\"",
                    JobStateLabel(state), "\"} 1\n");
  }
  Header(&out, "ithaca_gpu_memory_capacity_bytes", "gauge", "Memory of each GPU of this node.");
  for (const auto& [index, uuid, bytes] : devices_) {
    absl::StrAppend(&out, "ithaca_gpu_memory_capacity_bytes{gpu=\"", index, "\",UUID=\"",
                    Escape(uuid), "\"} ", bytes, "\n");
  }
  Header(&out, "ithaca_jobs", "gauge", "Jobs in the store per state.");
  for (int st = v1::JOB_STATE_QUEUED; st <= v1::JOB_STATE_CANCELLED; ++st) {
    auto it = job_counts_.find(static_cast<JobState>(st));
    absl::StrAppend(&out, "ithaca_jobs{state=\"", JobStateLabel(static_cast<JobState>(st)), "\"} ",
                    it == job_counts_.end() ? 0 : it->second, "\n");
  }
  Header(&out, "ithaca_worker_exits_total", "counter", "Worker process exits per reason.");
  for (const char* reason : {"ok", "error", "bad_spec", "oom", "nan_loss", "killed", "signal",
                             "heartbeat_timeout", "lost"}) {
    auto it = exits_.find(reason);
    absl::StrAppend(&out, "ithaca_worker_exits_total{reason=\"", reason, "\"} ",
                    it == exits_.end() ? 0 : it->second, "\n");
  }
  return out;
}

namespace {

int HandleMetrics(mg_connection* conn, void* cb) {
  auto* self = static_cast<MetricsHttp*>(cb);
  if (self->options().before_render) self->options().before_render();
  const std::string body = self->options().metrics->Render();
  mg_send_http_ok(conn, "text/plain; version=0.0.4; charset=utf-8",
                  static_cast<long long>(body.size()));
  mg_write(conn, body.data(), body.size());
  return 200;
}

int HandleHealth(mg_connection* conn, void*) {
  mg_send_http_ok(conn, "text/plain", 3);
  mg_write(conn, "ok\n", 3);
  return 200;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(const Options& options) {
  if (options.metrics == nullptr) return absl::InvalidArgumentError("MetricsHttp: no metrics");
  std::unique_ptr<MetricsHttp> http(new MetricsHttp(options));
  mg_init_library(0);
  const char* opts[] = {"listening_ports", http->options_.listen.c_str(), "num_threads", "4",
                        nullptr};
  mg_callbacks cbs;
  std::memset(&cbs, 0, sizeof(cbs));
  http->ctx_ = mg_start(&cbs, nullptr, opts);
  if (http->ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen ", options.listen, ": cannot listen there"));
  }
  mg_set_request_handler(http->ctx_, "/metrics", HandleMetrics, http.get());
  mg_set_request_handler(http->ctx_, "/healthz", HandleHealth, http.get());
  return http;
}

MetricsHttp::~MetricsHttp() {
  if (ctx_) mg_stop(ctx_);
  mg_exit_library();
}

std::string MetricsHttp::address() const {
  mg_server_port ports[4];
  int n = mg_get_server_ports(ctx_, 4, ports);
  const std::string& l = options_.listen;
  std::string host = l.find(':') == std::string::npos ? "0.0.0.0" : l.substr(0, l.rfind(':'));
  return n > 0 ? absl::StrCat(host, ":", ports[0].port) : l;
}

}  // namespace ithaca
