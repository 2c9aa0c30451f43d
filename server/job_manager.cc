#include "server/job_manager.h"

#include <signal.h>

#include <algorithm>

#include "absl/time/clock.h"

namespace ithaca {

JobManager::JobManager(Options options, JobStore* store, Metrics* metrics)
    : options_(std::move(options)),
      store_(store),
      metrics_(metrics),
      scheduler_(Scheduler::Options{options_.node.slots()}) {}

JobManager::~JobManager() { Shutdown("daemon stopped"); }

absl::StatusOr<v1::Job> JobManager::Submit(const v1::SubmitJobRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("ithacad is shutting down");
  }
  ASSIGN_OR_RETURN(AdmittedSpec admitted, ParseSubmission(request.spec_toml(), request.source(),
                                                          request.base_dir(), options_.node));
  RETURN_IF_ERROR(CheckFits(admitted, options_.node));
  v1::Job job;
  job.set_name(admitted.spec.name);
  *job.mutable_spec() = admitted.summary;
  job.set_spec_toml(admitted.toml);  // resolved: what `status` shows and the workers run
  job.set_log_dir(absl::StrCat(options_.state_dir, "/jobs/{id}"));
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(v1::Job stored, store_->Create(job, "submitted"));
  absl::Status queued = scheduler_.Enqueue(stored.id(), admitted.spec.parallel.world);
  if (!queued.ok()) {  // CheckFits makes this unreachable; keep the store honest anyway
    store_->Transition(stored.id(), v1::JOB_STATE_FAILED, std::string(queued.message()))
        .IgnoreError();
    return queued;
  }
  PublishState(stored.id(), stored);
  wake_.notify_all();
  return stored;
}

absl::StatusOr<v1::PlanJobResponse> JobManager::Plan(const v1::PlanJobRequest& request) {
  ASSIGN_OR_RETURN(AdmittedSpec admitted, ParseSubmission(request.spec_toml(), request.source(),
                                                          request.base_dir(), options_.node));
  v1::PlanJobResponse response;
  *response.mutable_plan() = EstimateMemory(admitted);
  *response.mutable_spec() = admitted.summary;
  return response;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& id) { return store_->Get(id); }

absl::StatusOr<std::vector<v1::Job>> JobManager::List(const v1::ListJobsRequest& request) {
  std::vector<JobState> states;
  for (int s : request.states()) states.push_back(static_cast<JobState>(s));
  return store_->List(states, request.limit());
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& id, const std::string& reason_in) {
  const std::string reason = reason_in.empty() ? "cancelled by the user" : reason_in;
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  if (IsTerminal(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " already ended: ", JobStateName(job.state())));
  }
  if (job.state() == v1::JOB_STATE_CANCELLING) return job;
  if (job.state() == v1::JOB_STATE_QUEUED) {
    scheduler_.Remove(id);
    ASSIGN_OR_RETURN(v1::Job done, store_->Transition(id, v1::JOB_STATE_CANCELLED, reason));
    PublishState(id, done);
    EventsLocked(id)->Close();
    return done;
  }
  auto it = active_.find(id);
  if (it == active_.end()) return absl::InternalError(absl::StrCat("job ", id, " has no workers"));
  Active& a = *it->second;
  if (a.ending) return job;  // already failing or finishing: its outcome stands
  ASSIGN_OR_RETURN(v1::Job cancelling, store_->Transition(id, v1::JOB_STATE_CANCELLING, reason));
  PublishState(id, cancelling);
  EndLocked(a, v1::JOB_STATE_CANCELLED, reason, std::nullopt, /*sigkill_now=*/false);
  wake_.notify_all();
  return cancelling;
}

std::shared_ptr<EventLog> JobManager::EventsLocked(const std::string& id) {
  std::shared_ptr<EventLog>& log = events_[id];
  if (!log) log = std::make_shared<EventLog>();
  return log;
}

absl::StatusOr<std::shared_ptr<EventLog>> JobManager::Events(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(id);
  if (it != events_.end()) return it->second;
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  std::shared_ptr<EventLog> log = EventsLocked(id);
  PublishState(id, job);
  if (IsTerminal(job.state())) log->Close();
  return log;
}

void JobManager::PublishState(const std::string& id, const v1::Job& job) {
  v1::JobEvent e;
  if (job.transitions_size() > 0) {
    *e.mutable_state() = job.transitions(job.transitions_size() - 1);
  } else {
    e.mutable_state()->set_to(job.state());
  }
  *e.mutable_job() = job;
  EventsLocked(id)->Append(std::move(e));
}

v1::NodeInfo JobManager::NodeInfo() {
  v1::NodeInfo n;
  n.set_hostname(options_.node.hostname);
  n.set_version("ithacad 0.1");
  n.set_gpus(options_.node.gpu ? options_.node.slots() : 0);
  n.set_slots(options_.node.slots());
  n.set_host_memory_bytes(options_.node.host_memory_bytes);
  n.set_metrics_address(options_.metrics_address);
  n.set_state_dir(options_.state_dir);
  std::lock_guard<std::mutex> lock(mu_);
  n.set_free_slots(scheduler_.free_slots());
  n.set_jobs_queued(scheduler_.queued());
  n.set_jobs_running(static_cast<int32_t>(active_.size()));
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

void JobManager::RefreshJobCounts() {
  absl::StatusOr<std::map<JobState, int64_t>> counts = store_->CountByState();
  if (counts.ok()) metrics_->SetJobCounts(*counts);
  // Per-job state series for the newest jobs (bounded, like the per-rank series).
  absl::StatusOr<std::vector<v1::Job>> recent = store_->List({}, Metrics::kFinishedJobsKept);
  if (recent.ok()) {
    std::vector<std::pair<std::string, JobState>> states;
    for (const v1::Job& j : *recent) states.push_back({j.id(), j.state()});
    metrics_->SetJobStates(states);
  }
}

absl::StatusOr<JobManager::Active*> JobManager::ActiveLocked(const std::string& job_id, int rank) {
  auto it = active_.find(job_id);
  if (it == active_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no running workers"));
  }
  Active* a = it->second.get();
  if (rank < 0 || rank >= static_cast<int>(a->ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the job's world of ", a->ranks.size()));
  }
  return a;
}

absl::StatusOr<v1::RegisterResponse> JobManager::Register(const v1::RegisterRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Active * a, ActiveLocked(request.job_id(), request.rank()));
  Rank& r = a->ranks[request.rank()];
  if (a->ending) {
    return absl::FailedPreconditionError(absl::StrCat("job ", a->id, " is ending: ", a->reason));
  }
  if (request.pid() != r.pid) {
    return absl::PermissionDeniedError(absl::StrCat("rank ", request.rank(), " of ", a->id,
                                                    " is pid ", r.pid, ", not ", request.pid()));
  }
  r.registered = true;
  r.last_heartbeat = absl::Now();
  const bool all =
      std::all_of(a->ranks.begin(), a->ranks.end(), [](const Rank& x) { return x.registered; });
  if (all && !a->running) {
    a->running = true;
    ASSIGN_OR_RETURN(v1::Job job, store_->Transition(
                                      a->id, v1::JOB_STATE_RUNNING,
                                      absl::StrCat("all ", a->ranks.size(), " ranks registered")));
    PublishState(a->id, job);
  }
  v1::RegisterResponse response;
  response.set_spec_toml(a->spec_toml);
  response.set_world_size(static_cast<int32_t>(a->ranks.size()));
  response.set_rendezvous(a->rendezvous);
  response.set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  response.set_gpu(r.slot);
  return response;
}

absl::Status JobManager::ReportStep(const v1::ReportStepRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  const v1::StepReport& step = request.step();
  ASSIGN_OR_RETURN(Active * a, ActiveLocked(request.job_id(), step.rank()));
  Rank& r = a->ranks[step.rank()];
  r.last_heartbeat = absl::Now();
  const NodeDevice& dev = options_.node.devices[r.slot];
  metrics_->OnStep(a->id, step.rank(), dev.index, dev.uuid, step);
  RETURN_IF_ERROR(store_->RecordStep(a->id, step));
  v1::JobEvent e;
  *e.mutable_step() = step;
  EventsLocked(a->id)->Append(std::move(e));
  return absl::OkStatus();
}

absl::Status JobManager::Heartbeat(const v1::HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Active * a, ActiveLocked(request.job_id(), request.rank()));
  if (a->ending) {
    return absl::AbortedError(absl::StrCat("job ", a->id, " is ending: ", a->reason));
  }
  a->ranks[request.rank()].last_heartbeat = absl::Now();
  return absl::OkStatus();
}

absl::Status JobManager::Log(const v1::LogRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Active * a, ActiveLocked(request.job_id(), request.rank()));
  // The text also reached the rank's log file through stderr; here it becomes the reason a
  // failure is reported with.
  if (request.level() == "ERROR") a->ranks[request.rank()].last_error = request.text();
  return absl::OkStatus();
}

}  // namespace ithaca
