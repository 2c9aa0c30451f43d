#include "server/jobs.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "proto/version.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/overrides.h"
#include "google/protobuf/util/time_util.h"
#include "server/admission.h"
#include "launch/layout.h"

namespace ithaca {

using google::protobuf::util::TimeUtil;

Jobs::Jobs(Options options, JobStore* store, Metrics* metrics)
    : options_(std::move(options)),
      store_(store),
      metrics_(metrics),
      // Under Slurm, Slurm queues and places jobs: every admitted job is handed on at once.
      scheduler_(
          Scheduler::Options{options_.supervisor.slurm ? kClusterSlots : options_.node.slots()}),
      supervisor_(options_.supervisor, options_.node, this, metrics) {}

Jobs::~Jobs() { Shutdown("daemon stopped"); }

absl::Status Jobs::Start() {
  RETURN_IF_ERROR(MakeDirs(options_.state_dir));
  RETURN_IF_ERROR(MakeJobsDir(JobDirsPath(options_.state_dir), options_.supervisor.run_as));
  TightenJobDirs(JobDirsPath(options_.state_dir), options_.supervisor.run_as);
  // Workers inherit this environment: they check the paths they open against the same roots
  // (worker/job_paths.h, engine/core/path_policy.h).
  if (!options_.allowed_roots.empty()) {
    setenv(kAllowedRootsEnv, absl::StrJoin(options_.allowed_roots, ":").c_str(), 1);
  }
  RETURN_IF_ERROR(Recover());
  RefreshJobCounts();
  supervisor_.Start();
  return absl::OkStatus();
}

template <typename Request>
absl::StatusOr<AdmittedSpec> Jobs::Admit(const Request& request, const Node& node,
                                         bool check_inputs, const std::function<bool()>& cancelled,
                                         const std::string& after, bool plan,
                                         const PlanLimits& search) {
  const std::string source = SpecSource(request.source());
  const std::vector<std::string> overrides(request.overrides().begin(), request.overrides().end());
  ASSIGN_OR_RETURN(std::string toml, ApplyOverrides(request.spec_toml(), source, overrides,
                                                    request.overrides_flag()));
  // Planning runs inside the RPC and costs CPU in proportion to the model and the sequence (both
  // bounded by the spec's parser): a bounded number run at once, so a burst of submissions
  // cannot starve the supervisor's heartbeats.
  // A long plan (a long sequence) may not take the last slot: small requests keep one.
  absl::StatusOr<JobSpec> peek = ParseJobSpec(toml, source);
  const bool heavy = peek.ok() && peek->data.seq_len > kSmallPlanTokens;
  const int slots = heavy ? kMaxConcurrentPlans - 1 : kMaxConcurrentPlans;
  if (plans_in_flight_.fetch_add(1) >= slots) {
    plans_in_flight_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("ithacad plans at most ", kMaxConcurrentPlans, " submissions at once",
                     heavy ? absl::StrCat(" (", slots, " with data.seq_len > ", kSmallPlanTokens,
                                          ": one slot is kept for shorter ones)")
                           : "",
                     " and all are taken; try again shortly"));
  }
  // init.from = "job:ID": that job's checkpoint.dir, as admitted.
  const InitJobLookup init_job = [this, &after,
                                  plan](const std::string& id) -> absl::StatusOr<InitJob> {
    absl::StatusOr<v1::Job> parent = store_->Get(id);
    if (!parent.ok()) {
      return absl::NotFoundError(
          absl::StrCat("job:", id, ": no such job (`ithaca list` shows the ids)"));
    }
    InitJob j;
    j.checkpoint_dir = parent->spec().checkpoint_dir();
    j.ended = IsTerminal(parent->state());
    if (j.checkpoint_dir.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job:", id, ": that job has no checkpoint.dir, so it leaves no weights to start from"));
    }
    if (!j.ended && !plan && after != id) {
      return absl::FailedPreconditionError(
          absl::StrCat("job:", id, ": that job is ", JobStateLabel(parent->state()),
                       " and has no final checkpoint yet; submit with --after ", id,
                       " so this job starts when it succeeds"));
    }
    return j;
  };
  // Planning runs in a thread of its own at a lower CPU priority (nice +10): a long plan takes
  // the CPU the node's training ranks and the supervisor do not use, not theirs.
  absl::StatusOr<AdmittedSpec> admitted = absl::UnknownError("not admitted");
  PlanLimits bounded = search;
  bounded.deadline = absl::Now() + options_.max_plan_time;
  std::thread planner([&] {
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kPlanningNice);
    admitted = ParseSubmission(toml, source, request.base_dir(), node, options_.state_dir,
                               options_.allowed_roots, cancelled, init_job, bounded, plan);
  });
  planner.join();
  if (admitted.ok() && check_inputs) {
    absl::Status inputs = cancelled && cancelled() ? absl::CancelledError("the client went away")
                                                   : CheckInputs(*admitted, source);
    if (!inputs.ok()) admitted = inputs;
  }
  plans_in_flight_.fetch_sub(1);
  if (!admitted.ok() && !overrides.empty()) {
    return absl::Status(
        admitted.status().code(),
        ExplainSpecError(std::string(admitted.status().message()), request.spec_toml(), source,
                         overrides, request.overrides_flag()));
  }
  return admitted;
}

absl::StatusOr<v1::Job> Jobs::Submit(const v1::SubmitJobRequest& request,
                                     const std::function<bool()>& cancelled) {
  {
    MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("ithacad is shutting down");
  }
  // --after: the job must exist and may still succeed; checked before the costlier admission.
  std::string after = request.after();
  int64_t after_seq = 0;
  if (!after.empty() && std::all_of(after.begin(), after.end(), absl::ascii_isdigit) &&
      absl::SimpleAtoi(after, &after_seq)) {
    after = JobIdForSeq(after_seq);  // "3" is job-3, as `ithaca list` shows it
  }
  bool after_done = false;  // it already succeeded: nothing to wait for
  if (!after.empty()) {
    absl::StatusOr<v1::Job> parent = store_->Get(after);
    if (absl::IsNotFound(parent.status())) {
      return absl::NotFoundError(absl::StrCat("after: no job \"", after.substr(0, 64),
                                              "\" (`ithaca list` shows the ids)"));
    }
    RETURN_IF_ERROR(parent.status());
    if (parent->state() == v1::JOB_STATE_FAILED || parent->state() == v1::JOB_STATE_CANCELLED) {
      return absl::FailedPreconditionError(
          absl::StrCat("after: job ", after, " already ended ", JobStateLabel(parent->state()),
                       " (", parent->reason().substr(0, 200), "), so this job would never start"));
    }
    after_done = parent->state() == v1::JOB_STATE_SUCCEEDED;
  }
  ASSIGN_OR_RETURN(AdmittedSpec admitted, Admit(request, options_.node, /*check_inputs=*/true,
                                                cancelled, after, /*plan=*/false));
  if (admitted.spec.slurm.nodes > 1 && !options_.supervisor.slurm) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slurm.nodes = ", admitted.spec.slurm.nodes,
        ": this ithacad runs jobs on its own node only; a job across nodes needs ithacad "
        "--cluster slurm (docs/jobs.md)"));
  }
  RETURN_IF_ERROR(CheckFits(admitted, options_.node));
  v1::Job job;
  job.set_name(admitted.spec.name);
  *job.mutable_spec() = admitted.summary;
  job.set_spec_toml(admitted.toml);  // resolved: what `status` shows and the workers run
  *job.mutable_plan() = EstimateMemory(admitted);           // the report shows it as admitted
  job.set_log_dir(JobDirPath(options_.state_dir, "{id}"));  // the store fills in {id}
  job.set_after(after);
  for (const std::string& w : admitted.warnings) job.add_warnings(w);
  v1::Job stored;
  {
    MutexLock lock(&mu_);
    // A client that gave up (its deadline passed while the job was planned) gets no job: its
    // retry would otherwise find this one holding the checkpoint directory (issue 43 N5).
    if (cancelled && cancelled()) {
      return absl::CancelledError("the client went away before the job was stored; none was made");
    }
    const std::string& dir = admitted.spec.checkpoint.dir;
    // Checked before the job is stored, claimed once it has its id (under one lock hold).
    if (!dir.empty()) RETURN_IF_ERROR(ClaimCheckpointDirLocked(dir, ""));
    // The job it waits for may have ended while this one was admitted.
    if (!after.empty() && !after_done) {
      absl::StatusOr<v1::Job> parent = store_->Get(after);
      if (parent.ok() && IsTerminal(parent->state())) {
        if (parent->state() != v1::JOB_STATE_SUCCEEDED) {
          return absl::FailedPreconditionError(
              absl::StrCat("after: job ", after, " ended ", JobStateLabel(parent->state()),
                           " while this job was admitted, so it would never start"));
        }
        after_done = true;
      }
    }
    ASSIGN_OR_RETURN(
        stored, store_->Create(job, after.empty() || after_done ? "submitted"
                                                                : "submitted; waits for " + after +
                                                                      " to succeed (--after)"));
    if (!dir.empty()) ClaimCheckpointDirLocked(dir, stored.id()).IgnoreError();
    if (!after.empty() && !after_done) {
      waiting_[stored.id()] = after;
      PublishState(stored.id(), stored);
      return stored;
    }
    absl::Status queued = scheduler_.Enqueue(stored.id(), admitted.spec.parallel.world);
    if (!queued.ok()) {  // CheckFits makes this unreachable; keep the store honest anyway
      store_->Transition(stored.id(), v1::JOB_STATE_FAILED, std::string(queued.message()))
          .IgnoreError();
      ReleaseCheckpointDirLocked(stored.id());
      return queued;
    }
    PublishState(stored.id(), stored);
  }
  supervisor_.Wake();
  return stored;
}

absl::StatusOr<v1::PlanJobResponse> Jobs::Plan(const v1::PlanJobRequest& request,
                                               const std::function<bool()>& cancelled) {
  // Any daemon answers for hardware it is not (`ithaca plan --hardware h200x8`): the same
  // admission and planner, against that node.
  Node node = options_.node;
  if (!request.hardware().empty()) {
    ASSIGN_OR_RETURN(node, HardwareNode(request.hardware()));
  }
  PlanLimits search;
  std::shared_ptr<FitMemo> memo;
  if (request.fit_only()) {
    memo = FitMemoFor(request);
    search.first_fit = true;
    search.fit_memo = memo.get();
  }
  ASSIGN_OR_RETURN(AdmittedSpec admitted, Admit(request, node, /*check_inputs=*/false, cancelled,
                                                /*after=*/"", /*plan=*/true, search));
  v1::PlanJobResponse response;
  *response.mutable_plan() = EstimateMemory(admitted);
  *response.mutable_spec() = admitted.summary;
  for (const std::string& w : admitted.warnings) response.add_warnings(w);
  return response;
}

std::shared_ptr<FitMemo> Jobs::FitMemoFor(const v1::PlanJobRequest& request) {
  std::string key =
      absl::StrCat(request.spec_toml().size(), ":", request.spec_toml(), "|", request.source(), "|",
                   request.base_dir(), "|", request.hardware());
  for (const std::string& o : request.overrides()) {
    if (!absl::StartsWith(o, "data.seq_len=")) absl::StrAppend(&key, "|", o.size(), ":", o);
  }
  MutexLock lock(&fit_memos_mu_);
  for (auto it = fit_memos_.begin(); it != fit_memos_.end(); ++it) {
    if (it->first == key) {
      fit_memos_.splice(fit_memos_.begin(), fit_memos_, it);
      return it->second;
    }
  }
  fit_memos_.emplace_front(key, std::make_shared<FitMemo>());
  if (fit_memos_.size() > kFitMemos) fit_memos_.pop_back();
  return fit_memos_.front().second;
}

absl::StatusOr<v1::Job> Jobs::Get(const std::string& id) {
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  return job;
}

absl::StatusOr<std::vector<v1::JobEvent>> Jobs::History(const std::string& id) {
  return store_->History(id);
}

absl::StatusOr<v1::ListJobsResponse> Jobs::List(const v1::ListJobsRequest& request) {
  std::vector<JobState> states;
  for (int s : request.states()) states.push_back(static_cast<JobState>(s));
  if (request.limit() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("limit: must be >= 0, got ", request.limit()));
  }
  const int limit =
      request.limit() == 0 ? kDefaultListLimit : std::min<int>(request.limit(), kMaxListLimit);
  int64_t before = 0;
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &before) || before <= 0)) {
    return absl::InvalidArgumentError(
        "page_token: not a token this daemon gave (pass next_page_token back unchanged)");
  }
  // One more than the page, to know whether another page follows.
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->List(states, limit + 1, before));
  v1::ListJobsResponse response;
  size_t bytes = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const size_t size = jobs[i].ByteSizeLong();
    const bool full = static_cast<int>(i) == limit || (i > 0 && bytes + size > kMaxListBytes);
    if (full) {
      // job-N's number is N: the next page starts below the last one sent.
      int64_t seq = 0;
      ParseJobSeq(response.jobs(response.jobs_size() - 1).id(), &seq);
      response.set_next_page_token(absl::StrCat(seq));
      break;
    }
    bytes += size;
    *response.add_jobs() = std::move(jobs[i]);
  }
  return response;
}

absl::StatusOr<v1::Job> Jobs::Cancel(const std::string& id, const std::string& reason_in) {
  if (reason_in.size() > kMaxCancelReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason: at most ", kMaxCancelReasonBytes, " bytes, got ", reason_in.size()));
  }
  const std::string reason = reason_in.empty() ? "cancelled by the user" : reason_in;
  v1::Job job;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(job, store_->Get(id));
    if (IsTerminal(job.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " already ended: ", JobStateName(job.state())));
    }
    if (job.state() == v1::JOB_STATE_CANCELLING) return job;
    // Still in the queue: no workers to stop. (A QUEUED job the scheduler already handed to the
    // supervisor is no longer in it; the supervisor cancels it below once launched.)
    if (job.state() == v1::JOB_STATE_QUEUED &&
        (scheduler_.Remove(id) || backing_off_.erase(id) > 0 || waiting_.erase(id) > 0)) {
      ASSIGN_OR_RETURN(v1::Job done, store_->Transition(id, v1::JOB_STATE_CANCELLED, reason));
      PublishState(id, done);
      EndEventsLocked(id);
      ReleaseCheckpointDirLocked(id);
      ResolveDependentsLocked(id, v1::JOB_STATE_CANCELLED, reason);
      return done;
    }
  }
  // The supervisor records CANCELLING through OnStateChange, and CANCELLED once the workers are
  // gone.
  absl::StatusOr<std::optional<v1::Job>> cancelling = supervisor_.Cancel(id, reason);
  if (absl::IsNotFound(cancelling.status())) {  // the job may have ended meanwhile
    ASSIGN_OR_RETURN(v1::Job now, store_->Get(id));
    if (IsTerminal(now.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " already ended: ", JobStateName(now.state())));
    }
    return absl::InternalError(absl::StrCat("job ", id, " has no workers"));
  }
  RETURN_IF_ERROR(cancelling.status());
  if (!cancelling->has_value()) return job;  // already failing or finishing: its outcome stands
  return **cancelling;
}

absl::StatusOr<v1::Job> Jobs::Delete(const std::string& id) {
  v1::Job job;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(job, store_->Get(id));
    if (!IsTerminal(job.state())) {
      // A job already being cancelled needs no second cancel: only its end.
      const bool cancelling = job.state() == v1::JOB_STATE_CANCELLING;
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", JobStateName(job.state()), "; only an ended job can be deleted: ",
          cancelling ? absl::StrCat("wait for it to end (ithaca wait ", id, ")")
                     : absl::StrCat("cancel it first (ithaca cancel ", id, ")")));
    }
    RETURN_IF_ERROR(store_->Delete(id));
    events_.erase(id);
    ended_events_.erase(std::remove(ended_events_.begin(), ended_events_.end(), id),
                        ended_events_.end());
  }
  RefreshJobCounts();
  // Its directory under the state directory (rank logs, rendezvous, adoption record), never
  // anything else: checkpoint.dir and the outputs are the user's.
  if (!options_.state_dir.empty() && job.log_dir() == JobDirPath(options_.state_dir, id)) {
    std::error_code ec;
    std::filesystem::remove_all(job.log_dir(), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("job ", id, " was deleted, but its log directory ",
                                              job.log_dir(),
                                              " could not be removed: ", ec.message()));
    }
  }
  return job;
}

namespace {

// "a//b/./c/../d/" → "a/b/d" (by the letters: for comparing spellings of one directory).
std::string LexicallyNormal(const std::string& path) {
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (p == ".") continue;
    if (p == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.emplace_back(p);
  }
  return absl::StrCat(!path.empty() && path[0] == '/' ? "/" : "", absl::StrJoin(parts, "/"));
}

}  // namespace

absl::Status Jobs::ClaimCheckpointDirLocked(const std::string& dir, const std::string& job_id) {
  // Resolved, so two spellings of one directory ("a/../b", a link to it) are one.
  const std::string normal = LexicallyNormal(dir);
  absl::StatusOr<std::string> real = ResolveBeneathExisting(normal);
  const std::string key = real.ok() ? *real : normal;
  auto it = checkpoint_dirs_.find(key);
  if (it != checkpoint_dirs_.end() && it->second != job_id && !it->second.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir: ", dir, " is the checkpoint directory of ", it->second,
        ", which has not ended; two jobs in one directory would overwrite each other's "
        "checkpoints: give this job a directory of its own, or cancel ",
        it->second));
  }
  if (!job_id.empty()) checkpoint_dirs_[key] = job_id;
  return absl::OkStatus();
}

void Jobs::ReleaseCheckpointDirLocked(const std::string& job_id) {
  for (auto it = checkpoint_dirs_.begin(); it != checkpoint_dirs_.end();) {
    it = it->second == job_id ? checkpoint_dirs_.erase(it) : std::next(it);
  }
}

void Jobs::EndEventsLocked(const std::string& id) {
  auto it = events_.find(id);
  if (it == events_.end()) return;
  it->second->Close();  // watchers holding it read to its end
  ended_events_.push_back(id);
  while (ended_events_.size() > kEndedEventLogsKept) {
    events_.erase(ended_events_.front());
    ended_events_.pop_front();
  }
}

std::shared_ptr<EventLog> Jobs::EventsLocked(const std::string& id) {
  std::shared_ptr<EventLog>& log = events_[id];
  if (!log) log = std::make_shared<EventLog>();
  return log;
}

absl::StatusOr<std::shared_ptr<EventLog>> Jobs::Events(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = events_.find(id);
  if (it != events_.end()) return it->second;
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  if (IsTerminal(job.state())) {
    // Ended before this daemon started, or long enough ago to be dropped: a closed log with
    // the final state, held by the watcher alone.
    auto log = std::make_shared<EventLog>();
    v1::JobEvent e;
    *e.mutable_state() = job.transitions_size() > 0 ? job.transitions(job.transitions_size() - 1)
                                                    : v1::StateTransition();
    if (job.transitions_size() == 0) e.mutable_state()->set_to(job.state());
    *e.mutable_job() = job;
    log->Append(std::move(e));
    log->Close();
    return log;
  }
  std::shared_ptr<EventLog> log = EventsLocked(id);
  PublishState(id, job);
  return log;
}

void Jobs::PublishState(const std::string& id, const v1::Job& job) {
  v1::JobEvent e;
  if (job.transitions_size() > 0) {
    *e.mutable_state() = job.transitions(job.transitions_size() - 1);
  } else {
    e.mutable_state()->set_to(job.state());
  }
  *e.mutable_job() = job;
  EventsLocked(id)->Append(std::move(e));
}

v1::NodeInfo Jobs::NodeInfo() {
  v1::NodeInfo n;
  n.set_hostname(options_.node.hostname);
  n.set_libraries(options_.node.libraries);
  n.set_version(absl::StrCat("ithacad ", kIthacaVersion));
  n.set_gpus(options_.node.gpu ? options_.node.slots() : 0);
  n.set_slots(options_.node.slots());
  n.set_host_memory_bytes(options_.node.host_memory_bytes);
  n.set_metrics_address(options_.metrics_address);
  n.set_state_dir(options_.state_dir);
  n.set_jobs_running(supervisor_.running_jobs());  // before taking mu_: see the locking note
  if (const std::optional<SlurmDefaults>& slurm = options_.supervisor.slurm) {
    // The cluster's view: the jobs run on its nodes (sinfo runs outside every lock).
    v1::ClusterInfo* c = n.mutable_cluster();
    c->set_kind("slurm");
    c->set_partition(slurm->partition);
    absl::StatusOr<SlurmClusterState> cluster = QuerySlurmCluster(*slurm);
    if (cluster.ok()) {
      c->set_nodes(cluster->nodes);
      c->set_nodes_idle(cluster->idle);
      c->set_nodes_busy(cluster->busy);
      c->set_nodes_unavailable(cluster->unavailable);
    } else {
      c->set_error(std::string(cluster.status().message()));
    }
    const Supervisor::ClusterJobs jobs = supervisor_.cluster_jobs();
    c->set_jobs_running(jobs.running);
    c->set_jobs_pending(jobs.pending);
    n.set_gpus(0);
    n.set_slots(0);
    n.set_jobs_running(jobs.running);
    MutexLock lock(&mu_);
    n.set_scheduling_paused(scheduling_paused_);
    n.set_jobs_queued(scheduler_.queued() + jobs.pending);
    return n;
  }
  MutexLock lock(&mu_);
  n.set_free_slots(scheduler_.free_slots());
  n.set_scheduling_paused(scheduling_paused_);
  n.set_jobs_queued(scheduler_.queued());
  for (const NodeDevice& d : options_.node.devices) {
    v1::Device* out = n.add_devices();
    out->set_index(d.index);
    out->set_uuid(d.uuid);
    out->set_name(d.name);
    out->set_memory_bytes(d.memory_bytes);
    if (d.index < scheduler_.total_slots()) out->set_job_id(scheduler_.owners()[d.index]);
  }
  return n;
}

void Jobs::RefreshJobCounts() {
  absl::StatusOr<std::map<JobState, int64_t>> counts = store_->CountByState();
  if (counts.ok()) metrics_->SetJobCounts(*counts);
  // Per-job state series for the newest jobs (bounded, like the per-rank series).
  absl::StatusOr<std::vector<v1::Job>> recent = store_->List({}, Metrics::kFinishedJobsKept);
  if (recent.ok()) metrics_->SetJobs(*recent);
}

}  // namespace ithaca
