#include "server/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "launch/exit_codes.h"
#include "prometheus/collectable.h"
#include "prometheus/text_serializer.h"

namespace ithaca {
namespace {

using prometheus::Labels;

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

Labels Constant(const std::string& hostname) {
  return hostname.empty() ? Labels{} : Labels{{"Hostname", hostname}};
}

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const Labels& constant,
                                             const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Labels(constant).Register(r);
}

prometheus::Family<prometheus::Counter>& Counter(prometheus::Registry& r, const Labels& constant,
                                                 const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels(constant).Register(r);
}

prometheus::Family<prometheus::Histogram>& Histogram(prometheus::Registry& r,
                                                     const Labels& constant, const char* name,
                                                     const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Labels(constant).Register(r);
}

const std::vector<double>& QueueWaitBuckets() {
  static const auto* b =
      new std::vector<double>{1, 5, 15, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400};
  return *b;
}

// A worker's end as the daemon sees it beyond its exit code (launch/exit_codes.h has those).
const char* const kDaemonExitReasons[] = {"heartbeat_timeout", "lost"};

// One sample of a family without labels of its own (the constant ones added).
prometheus::MetricFamily Single(const char* name, const char* help, prometheus::MetricType type,
                                double value, const Labels& constant) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  for (const auto& [k, v] : constant) m.label.push_back({k, v});
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
  return f;
}

// The standard process_* series (as Prometheus' Go and Python clients export them), from
// /proc/self; prometheus-cpp has no process collector. Linux only, like ithacad.
std::vector<prometheus::MetricFamily> ProcessFamilies(const Labels& constant) {
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold spaces.
  const size_t close = stat.rfind(')');
  if (close != std::string::npos && ticks > 0) {
    std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    // f[0] is field 3 (state): field n is f[n - 3].
    double utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
    if (f.size() > 21 && absl::SimpleAtod(f[11], &utime) && absl::SimpleAtod(f[12], &stime) &&
        absl::SimpleAtod(f[19], &start) && absl::SimpleAtod(f[20], &vsize) &&
        absl::SimpleAtod(f[21], &rss)) {
      using prometheus::MetricType;
      out.push_back(Single("process_cpu_seconds_total",
                           "Total user and system CPU time spent in "
                           "seconds.",
                           MetricType::Counter, (utime + stime) / ticks, constant));
      out.push_back(Single("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                           MetricType::Gauge, vsize, constant));
      out.push_back(Single("process_resident_memory_bytes", "Resident memory size in bytes.",
                           MetricType::Gauge, rss * sysconf(_SC_PAGESIZE), constant));
      std::ifstream proc_stat("/proc/stat");
      std::string line;
      while (std::getline(proc_stat, line)) {
        double boot = 0;
        if (line.rfind("btime ", 0) == 0 && absl::SimpleAtod(line.substr(6), &boot)) {
          out.push_back(Single("process_start_time_seconds",
                               "Start time of the process since unix epoch in seconds.",
                               MetricType::Gauge, boot + start / ticks, constant));
        }
      }
    }
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    out.push_back(Single("process_open_fds", "Number of open file descriptors.",
                         prometheus::MetricType::Gauge, n - 1, constant));  // less the DIR's own
  }
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    out.push_back(Single("process_max_fds", "Maximum number of open file descriptors.",
                         prometheus::MetricType::Gauge, static_cast<double>(lim.rlim_cur),
                         constant));
  }
  return out;
}

}  // namespace

const std::vector<double>& Metrics::StepBuckets() {
  static const auto* b =
      new std::vector<double>{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  1,    2.5,  5,
                              10,    25,   60,    120,  300, 600,  1200, 1800, 3600, 7200};
  return *b;
}

Metrics::Metrics(const std::string& hostname, const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()),
      memory_(Gauge(*registry_, Constant(hostname), "ithaca_gpu_memory_bytes",
                    "Device memory in use per tier at the end of the step.")),
      memory_peak_(Gauge(*registry_, Constant(hostname), "ithaca_gpu_memory_peak_bytes",
                         "Peak device memory per tier during the step.")),
      host_block_inputs_(
          Gauge(*registry_, Constant(hostname), "ithaca_host_block_inputs_bytes",
                "Pinned host memory holding saved block inputs offloaded from the device "
                "(memory.offload).")),
      host_optimizer_(Gauge(*registry_, Constant(hostname), "ithaca_host_optimizer_bytes",
                            "Pinned host memory holding the optimizer's state "
                            "(memory.optimizer_offload).")),
      host_params_(Gauge(*registry_, Constant(hostname), "ithaca_host_params_bytes",
                         "Pinned host memory holding the bf16 working copy "
                         "(memory.param_offload).")),
      tokens_per_second_(Gauge(*registry_, Constant(hostname), "ithaca_tokens_per_second",
                               "Training tokens per second of this rank (per GPU).")),
      loss_(Gauge(*registry_, Constant(hostname), "ithaca_train_loss",
                  "Mean cross-entropy of the newest step.")),
      step_(Gauge(*registry_, Constant(hostname), "ithaca_train_step",
                  "Newest completed optimizer step.")),
      flops_(Gauge(*registry_, Constant(hostname), "ithaca_model_flops_per_second",
                   "Model FLOPs per second of this rank.")),
      mfu_(Gauge(*registry_, Constant(hostname), "ithaca_mfu_ratio",
                 "Model FLOPs utilization (0..1) of this rank; absent where the device's peak is "
                 "unknown.")),
      grad_norm_(Gauge(*registry_, Constant(hostname), "ithaca_grad_norm",
                       "Global gradient norm of the newest step.")),
      lr_(Gauge(*registry_, Constant(hostname), "ithaca_learning_rate",
                "Learning rate of the newest step.")),
      last_step_time_(Gauge(*registry_, Constant(hostname), "ithaca_last_step_timestamp_seconds",
                            "Unix time of this rank's newest step report.")),
      eval_loss_(Gauge(*registry_, Constant(hostname), "ithaca_eval_loss",
                       "Mean cross-entropy of the newest held-out evaluation.")),
      job_state_(Gauge(*registry_, Constant(hostname), "ithaca_job_state",
                       "1 for each recent job's current state (one series per job).")),
      capacity_(Gauge(*registry_, Constant(hostname), "ithaca_gpu_memory_capacity_bytes",
                      "Memory of each GPU of this node.")),
      jobs_(Gauge(*registry_, Constant(hostname), "ithaca_jobs", "Jobs in the store per state.")),
      checkpoint_seconds_(Gauge(*registry_, Constant(hostname), "ithaca_checkpoint_seconds",
                                "Wall time of the job's newest checkpoint save.")),
      checkpoint_time_(Gauge(*registry_, Constant(hostname),
                             "ithaca_checkpoint_last_timestamp_seconds",
                             "Unix time the job's newest checkpoint was complete.")),
      job_state_since_(Gauge(*registry_, Constant(hostname),
                             "ithaca_job_state_since_timestamp_seconds",
                             "Unix time each recent job entered its current state.")),
      job_info_(Gauge(*registry_, Constant(hostname), "ithaca_job_info",
                      "Always 1; labels: each recent job's name and model.")),
      rank_node_(Gauge(*registry_, Constant(hostname), "ithaca_rank_node_info",
                       "1 for each rank of a job across nodes (ithacad --cluster slurm): the node "
                       "it runs on (join on job_id, rank).")),
      passkey_accuracy_(Gauge(*registry_, Constant(hostname), "ithaca_passkey_accuracy",
                              "Share of passkey prompts of a length and depth whose key the "
                              "newest evaluation retrieved ([eval.passkey]; with `keys`, "
                              "multi-key prompts of that many keys).")),
      passkey_logprob_(Gauge(*registry_, Constant(hostname), "ithaca_passkey_logprob",
                             "Mean log-probability of a passkey key token at a length and "
                             "depth in the newest evaluation ([eval.passkey]).")),
      trainable_parameters_(Gauge(*registry_, Constant(hostname), "ithaca_trainable_parameters",
                                  "Parameters the job trains (under [lora] the adapters alone).")),
      source_loss_(Gauge(*registry_, Constant(hostname), "ithaca_source_loss",
                         "Mean cross-entropy over the trained labels of one source of a "
                         "data.weights mix in the newest step that sampled it.")),
      eval_position_loss_(Gauge(*registry_, Constant(hostname), "ithaca_eval_position_loss",
                                "Held-out loss of the labels at positions [begin, end) of their "
                                "windows in the newest evaluation (eval.position_buckets).")),
      tokens_(Counter(*registry_, Constant(hostname), "ithaca_tokens_total",
                      "Tokens trained by this rank.")),
      exits_(Counter(*registry_, Constant(hostname), "ithaca_worker_exits_total",
                     "Worker process exits per reason.")),
      restarts_(Counter(*registry_, Constant(hostname), "ithaca_job_restarts_total",
                        "Failed jobs queued again by their [retry] policy.")),
      source_samples_(Counter(*registry_, Constant(hostname), "ithaca_source_samples_total",
                              "Samples trained from one source of a data.weights mix.")),
      source_tokens_(Counter(*registry_, Constant(hostname), "ithaca_source_tokens_total",
                             "Tokens of the samples trained from one source of a data.weights "
                             "mix.")),
      source_loss_tokens_(Counter(*registry_, Constant(hostname), "ithaca_source_loss_tokens_total",
                                  "Labels trained (not masked) from one source of a "
                                  "data.weights mix.")),
      duration_(Histogram(*registry_, Constant(hostname), "ithaca_step_duration_seconds",
                          "Wall time of one optimizer step.")),
      queue_wait_(Histogram(*registry_, Constant(hostname), "ithaca_queue_wait_seconds",
                            "Time from a job's submission to the launch of its workers.")) {
  Gauge(*registry_, Constant(hostname), "ithaca_build_info",
        "Always 1; labels: the ithacad version.")
      .Add({{"version", version}})
      .Set(1);
  for (const std::string& reason : WorkerExitReasons()) exits_.Add({{"reason", reason}});
  for (const char* reason : kDaemonExitReasons) exits_.Add({{"reason", reason}});
  restarts_.Add({});
  for (int st = v1::JOB_STATE_QUEUED; st <= v1::JOB_STATE_CANCELLED; ++st) {
    jobs_.Add({{"state", JobStateLabel(static_cast<JobState>(st))}});
  }
  // Present from the start, so that rate() sees the first launch.
  queue_wait_.Add({}, QueueWaitBuckets());
}

Metrics::~Metrics() = default;

prometheus::Labels Metrics::RankLabels(const RankSeries& s) const {
  // A CPU slot is no GPU: job_id and rank name it.
  if (s.gpu == kCpuSlot) return {{"job_id", s.job}, {"rank", std::to_string(s.rank)}};
  return {{"job_id", s.job},
          {"rank", std::to_string(s.rank)},
          {"gpu", s.gpu >= 0 ? std::to_string(s.gpu) : ""},
          {"UUID", s.uuid}};
}

Metrics::RankSeries& Metrics::RankLocked(const std::string& job, int rank, int gpu,
                                         const std::string& uuid) {
  auto [it, added] = ranks_.try_emplace({job, rank});
  RankSeries& s = it->second;
  if (!added && s.tokens != nullptr && s.gpu == gpu && s.uuid == uuid) {
    AddActivityLocked(s);  // back after the job's workers ended (a relaunch)
    return s;
  }
  if (!added) {  // the rank moved, or an evaluation came first (no step series yet): relabel
    const double eval = s.eval_loss ? s.eval_loss->Value() : 0;
    const bool had_eval = s.eval_loss != nullptr;
    DropRankLocked(s);
    ranks_.erase(it);
    RankSeries& fresh = RankLocked(job, rank, gpu, uuid);
    if (had_eval) {
      fresh.eval_loss = &eval_loss_.Add(RankLabels(fresh));
      fresh.eval_loss->Set(eval);
    }
    return fresh;
  }
  s.job = job;
  s.rank = rank;
  s.gpu = gpu;
  s.uuid = uuid;
  const Labels l = RankLabels(s);
  s.loss = &loss_.Add(l);
  s.step = &step_.Add(l);
  s.grad_norm = &grad_norm_.Add(l);
  s.lr = &lr_.Add(l);
  s.last_step_time = &last_step_time_.Add(l);
  s.tokens = &tokens_.Add(l);
  s.duration = &duration_.Add(l, StepBuckets());
  AddActivityLocked(s);
  return s;
}

void Metrics::AddActivityLocked(RankSeries& s) {
  const Labels l = RankLabels(s);
  if (s.host_block_inputs == nullptr) s.host_block_inputs = &host_block_inputs_.Add(l);
  if (s.tokens_per_second == nullptr) s.tokens_per_second = &tokens_per_second_.Add(l);
  if (s.flops == nullptr) s.flops = &flops_.Add(l);
}

void Metrics::DropActivityLocked(RankSeries& s) {
  for (auto& [tier, g] : s.memory) memory_.Remove(g);
  for (auto& [tier, g] : s.memory_peak) memory_peak_.Remove(g);
  s.memory.clear();
  s.memory_peak.clear();
  if (s.host_block_inputs) host_block_inputs_.Remove(s.host_block_inputs);
  if (s.host_optimizer) host_optimizer_.Remove(s.host_optimizer);
  if (s.host_params) host_params_.Remove(s.host_params);
  if (s.tokens_per_second) tokens_per_second_.Remove(s.tokens_per_second);
  if (s.flops) flops_.Remove(s.flops);
  if (s.mfu) mfu_.Remove(s.mfu);
  s.host_block_inputs = s.host_optimizer = s.host_params = s.tokens_per_second = s.flops = s.mfu =
      nullptr;
}

void Metrics::OnStep(const std::string& job, int rank, int gpu, const std::string& uuid,
                     const v1::StepReport& r) {
  MutexLock lock(&mu_);
  RankSeries& s = RankLocked(job, rank, gpu, uuid);
  const Labels l = RankLabels(s);
  if (!r.node().empty() && s.node_info == nullptr) {
    s.node_info =
        &rank_node_.Add({{"job_id", job}, {"rank", std::to_string(rank)}, {"node", r.node()}});
    s.node_info->Set(1);
  }
  for (const v1::TierBytes& t : r.memory()) {
    if (t.tier() == "host_block_inputs") {
      s.host_block_inputs->Set(static_cast<double>(t.current_bytes()));
      continue;
    }
    // Host tiers too; their series only where they are used.
    for (auto [name, family, gauge] :
         {std::tuple{"host_optimizer", &host_optimizer_, &s.host_optimizer},
          std::tuple{"host_params", &host_params_, &s.host_params}}) {
      if (t.tier() != name) continue;
      if (t.current_bytes() > 0 || *gauge != nullptr) {
        if (*gauge == nullptr) *gauge = &family->Add(l);
        (*gauge)->Set(static_cast<double>(t.current_bytes()));
      }
    }
    if (t.tier() == "host_optimizer" || t.tier() == "host_params") continue;
    Labels tl = l;
    tl["tier"] = t.tier();
    prometheus::Gauge*& current = s.memory[t.tier()];
    if (current == nullptr) current = &memory_.Add(tl);
    current->Set(static_cast<double>(t.current_bytes()));
    prometheus::Gauge*& peak = s.memory_peak[t.tier()];
    if (peak == nullptr) peak = &memory_peak_.Add(tl);
    peak->Set(static_cast<double>(t.peak_bytes()));
  }
  s.tokens_per_second->Set(r.tokens_per_second());
  s.tokens->Increment(static_cast<double>(r.tokens()));
  s.loss->Set(r.loss());
  s.step->Set(static_cast<double>(r.step()));
  s.duration->Observe(r.seconds());
  s.flops->Set(r.model_tflops() * 1e12);
  // 0 means unknown (a CPU, an unlisted GPU): no sample rather than a misleading 0.
  if (r.mfu() > 0) {
    if (s.mfu == nullptr) s.mfu = &mfu_.Add(l);
    s.mfu->Set(r.mfu());
  } else if (s.mfu != nullptr) {
    mfu_.Remove(s.mfu);
    s.mfu = nullptr;
  }
  s.grad_norm->Set(r.grad_norm());
  s.lr->Set(r.lr());
  s.last_step_time->Set(NowSeconds());
  if (rank == 0 && r.trainable_parameters() > 0) {
    JobSeries& j = jobs_series_[job];
    if (j.trainable_parameters == nullptr) {
      j.trainable_parameters = &trainable_parameters_.Add({{"job_id", job}});
    }
    j.trainable_parameters->Set(static_cast<double>(r.trainable_parameters()));
  }
  if (rank == 0 && r.sources_size() > 0) {
    // Every rank reports the whole step's sources; rank 0's are counted.
    JobSeries& j = jobs_series_[job];
    for (const v1::SourceReport& src : r.sources()) {
      auto [it, added] = j.sources.try_emplace(src.source());
      JobSeries::Source& g = it->second;
      if (added) {
        const Labels sl = {
            {"job_id", job}, {"source", std::to_string(src.source())}, {"path", src.path()}};
        g.samples = &source_samples_.Add(sl);
        g.tokens = &source_tokens_.Add(sl);
        g.loss_tokens = &source_loss_tokens_.Add(sl);
        g.loss = &source_loss_.Add(sl);
      }
      g.samples->Increment(static_cast<double>(src.samples()));
      g.tokens->Increment(static_cast<double>(src.tokens()));
      g.loss_tokens->Increment(static_cast<double>(src.loss_tokens()));
      if (src.loss_tokens() > 0) g.loss->Set(src.loss());
    }
  }
  if (rank == 0 && r.checkpoint_seconds() > 0) {
    JobSeries& j = jobs_series_[job];
    if (j.checkpoint_seconds == nullptr) {
      j.checkpoint_seconds = &checkpoint_seconds_.Add({{"job_id", job}});
      j.checkpoint_time = &checkpoint_time_.Add({{"job_id", job}});
    }
    j.checkpoint_seconds->Set(r.checkpoint_seconds());
    j.checkpoint_time->Set(static_cast<double>(r.checkpoint_time_unix()));
  }
}

void Metrics::OnEval(const std::string& job, int rank, int gpu, const std::string& uuid,
                     const v1::EvalReport& r) {
  MutexLock lock(&mu_);
  auto [it, added] = ranks_.try_emplace({job, rank});
  RankSeries& s = it->second;
  if (added) {  // an evaluation before any step (or an evaluation-only job): no step series yet
    s.job = job;
    s.rank = rank;
    s.gpu = gpu;
    s.uuid = uuid;
  }
  if (r.tokens() > 0 || r.passkey_size() == 0) {  // a held-out loss (0 tokens: passkey only)
    if (s.eval_loss == nullptr) s.eval_loss = &eval_loss_.Add(RankLabels(s));
    s.eval_loss->Set(r.loss());
  }
  JobSeries& j = jobs_series_[job];
  for (const v1::PasskeyResult& p : r.passkey()) {
    const std::string depth = absl::StrFormat("%g", p.depth());
    const int64_t keys = std::max<int64_t>(1, p.keys());
    auto [g, added_point] = j.passkey.try_emplace({keys, p.length(), depth});
    if (added_point) {
      prometheus::Labels l = {
          {"job_id", job}, {"length", std::to_string(p.length())}, {"depth", depth}};
      // A multi-key point is labelled with its keys; the passkey test's series stay as they were.
      if (keys > 1) l["keys"] = std::to_string(keys);
      g->second = {&passkey_accuracy_.Add(l), &passkey_logprob_.Add(l)};
    }
    g->second.first->Set(p.accuracy());
    g->second.second->Set(p.logprob());
  }
  for (const v1::PositionLoss& b : r.positions()) {
    auto [g, added_bucket] = j.positions.try_emplace({b.begin(), b.end()});
    if (added_bucket) {
      g->second = &eval_position_loss_.Add({{"job_id", job},
                                            {"begin", std::to_string(b.begin())},
                                            {"end", std::to_string(b.end())}});
    }
    g->second->Set(b.loss());
  }
}

void Metrics::OnJobStarted(double queue_wait_seconds) {
  MutexLock lock(&mu_);
  queue_wait_.Add({}, QueueWaitBuckets()).Observe(queue_wait_seconds);
}

void Metrics::DropRankLocked(RankSeries& s) {
  DropActivityLocked(s);
  if (s.tokens) {  // an eval-only entry has none of the step series
    loss_.Remove(s.loss);
    step_.Remove(s.step);
    grad_norm_.Remove(s.grad_norm);
    lr_.Remove(s.lr);
    last_step_time_.Remove(s.last_step_time);
    tokens_.Remove(s.tokens);
    duration_.Remove(s.duration);
  }
  if (s.eval_loss) eval_loss_.Remove(s.eval_loss);
  if (s.node_info) rank_node_.Remove(s.node_info);
}

void Metrics::DropJobLocked(const std::string& job) {
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    if (it->first.first == job) {
      DropRankLocked(it->second);
      it = ranks_.erase(it);
    } else {
      ++it;
    }
  }
}

void Metrics::OnJobFinished(const std::string& job) {
  MutexLock lock(&mu_);
  // Nothing runs any more: a sum of tokens/s or memory over the node counts only live ranks.
  for (auto& [key, s] : ranks_) {
    if (key.first == job) DropActivityLocked(s);
  }
  if (std::find(finished_.begin(), finished_.end(), job) != finished_.end()) return;
  finished_.push_back(job);
  while (static_cast<int>(finished_.size()) > kFinishedJobsKept) {
    const std::string old = finished_.front();
    finished_.pop_front();
    DropJobLocked(old);
    auto j = jobs_series_.find(old);
    if (j != jobs_series_.end()) {
      checkpoint_seconds_.Remove(j->second.checkpoint_seconds);
      checkpoint_time_.Remove(j->second.checkpoint_time);
      trainable_parameters_.Remove(j->second.trainable_parameters);
      for (auto& [point, g] : j->second.passkey) {
        passkey_accuracy_.Remove(g.first);
        passkey_logprob_.Remove(g.second);
      }
      for (auto& [bucket, g] : j->second.positions) eval_position_loss_.Remove(g);
      for (auto& [source, g] : j->second.sources) {
        source_samples_.Remove(g.samples);
        source_tokens_.Remove(g.tokens);
        source_loss_tokens_.Remove(g.loss_tokens);
        source_loss_.Remove(g.loss);
      }
      jobs_series_.erase(j);
    }
  }
}

void Metrics::OnWorkerExit(const std::string& reason) {
  MutexLock lock(&mu_);
  exits_.Add({{"reason", reason}}).Increment();
}

void Metrics::OnJobRestarted() {
  MutexLock lock(&mu_);
  restarts_.Add({}).Increment();
}

void Metrics::SetJobCounts(const std::map<JobState, int64_t>& counts) {
  MutexLock lock(&mu_);
  for (int st = v1::JOB_STATE_QUEUED; st <= v1::JOB_STATE_CANCELLED; ++st) {
    auto it = counts.find(static_cast<JobState>(st));
    jobs_.Add({{"state", JobStateLabel(static_cast<JobState>(st))}})
        .Set(it == counts.end() ? 0 : static_cast<double>(it->second));
  }
}

void Metrics::SetJobs(const std::vector<v1::Job>& jobs) {
  MutexLock lock(&mu_);
  for (prometheus::Gauge* g : job_state_series_) job_state_.Remove(g);
  for (prometheus::Gauge* g : job_since_series_) job_state_since_.Remove(g);
  for (prometheus::Gauge* g : job_info_series_) job_info_.Remove(g);
  job_state_series_.clear();
  job_since_series_.clear();
  job_info_series_.clear();
  for (const v1::Job& job : jobs) {
    const Labels l = {{"job_id", job.id()}, {"state", JobStateLabel(job.state())}};
    prometheus::Gauge& g = job_state_.Add(l);
    g.Set(1);
    job_state_series_.push_back(&g);
    // The newest transition into the current state: when the job got there.
    double since = 0;
    for (const v1::StateTransition& t : job.transitions()) {
      if (t.to() == job.state()) {
        since = static_cast<double>(t.time().seconds()) + t.time().nanos() / 1e9;
      }
    }
    if (since > 0) {
      prometheus::Gauge& at = job_state_since_.Add(l);
      at.Set(since);
      job_since_series_.push_back(&at);
    }
    prometheus::Gauge& info =
        job_info_.Add({{"job_id", job.id()}, {"name", job.name()}, {"model", job.spec().model()}});
    info.Set(1);
    job_info_series_.push_back(&info);
  }
}

void Metrics::SetDevices(const std::vector<std::tuple<int, std::string, int64_t>>& devices) {
  MutexLock lock(&mu_);
  for (prometheus::Gauge* g : capacity_series_) capacity_.Remove(g);
  capacity_series_.clear();
  for (const auto& [index, uuid, bytes] : devices) {
    prometheus::Gauge& g = capacity_.Add({{"gpu", std::to_string(index)}, {"UUID", uuid}});
    g.Set(static_cast<double>(bytes));
    capacity_series_.push_back(&g);
  }
}

std::vector<prometheus::MetricFamily> Metrics::Collect() {
  std::vector<prometheus::MetricFamily> out;
  Labels constant;
  {
    MutexLock lock(&mu_);
    out = registry_->Collect();
  }
  // Hostname, as the registry's families carry it.
  for (const prometheus::MetricFamily& f : out) {
    if (f.name == "ithaca_build_info" && !f.metric.empty()) {
      for (const auto& l : f.metric[0].label) {
        if (l.name == "Hostname") constant[l.name] = l.value;
      }
    }
  }
  for (prometheus::MetricFamily& f : ProcessFamilies(constant)) out.push_back(std::move(f));
  return out;
}

std::string Metrics::Render() { return prometheus::TextSerializer().Serialize(Collect()); }

absl::StatusOr<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(const Options& options) {
  if (options.metrics == nullptr) return absl::InvalidArgumentError("MetricsHttp: no metrics");
  std::unique_ptr<MetricsHttp> http(new MetricsHttp(options));
  HttpServer::Options o;
  o.listen = options.listen;
  Metrics* metrics = options.metrics;
  std::function<void()> before = options.before_render;
  o.handlers["/metrics"] = [metrics, before] {
    if (before) before();  // refreshes the gauges computed on demand
    HttpServer::Response r;
    r.body = metrics->Render();
    return r;
  };
  o.handlers["/healthz"] = [] { return HttpServer::Response{}; };  // 200, empty, while serving
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(std::move(o));
  if (!server.ok()) {
    return absl::UnavailableError(absl::StrCat("--metrics-listen ", options.listen,
                                               ": cannot listen there (", server.status().message(),
                                               ")"));
  }
  http->server_ = std::move(*server);
  return http;
}

MetricsHttp::MetricsHttp(Options o) : options_(std::move(o)) {}

MetricsHttp::~MetricsHttp() = default;

std::string MetricsHttp::address() const {
  const std::string& l = options_.listen;
  std::string host = l.find(':') == std::string::npos ? "0.0.0.0" : l.substr(0, l.rfind(':'));
  return absl::StrCat(host, ":", server_->port());
}

}  // namespace ithaca
