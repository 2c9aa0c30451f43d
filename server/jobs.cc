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
  RETURN_IF_ERROR(MakeDirs(JobDirsPath(options_.state_dir)));
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

std::vector<std::string> Jobs::ResumableRunningLocked(std::vector<std::string>* others,
                                                      JobState state) {
  std::vector<std::string> resumable;
  absl::StatusOr<std::vector<v1::Job>> running = store_->List({state}, 0);
  for (const v1::Job& job : running.ok() ? *running : std::vector<v1::Job>()) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_toml(), "job " + job.id());
    if (spec.ok() && spec->checkpoint.resume && !spec->checkpoint.dir.empty()) {
      resumable.push_back(job.id());
    } else if (others != nullptr) {
      others->push_back(job.id());
    }
  }
  return resumable;
}

int Jobs::Drain(absl::Duration timeout) {
  std::vector<std::string> resumable;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;  // no new submissions, no new launches
    resumable = ResumableRunningLocked(nullptr);
  }
  return supervisor_.Drain(resumable, timeout);
}

v1::DrainResponse Jobs::DrainNode(bool undo, absl::Duration timeout,
                                  std::function<bool()> cancelled) {
  v1::DrainResponse response;
  std::vector<std::string> resumable, others, starting;
  const absl::Time deadline = absl::Now() + timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    scheduling_paused_ = !undo;
    if (!undo) {
      resumable = ResumableRunningLocked(&others);
      // Jobs still starting (under Slurm: pending) would run on while scheduling is paused
      // (issue 43 N9): drained too, once they run, within the same timeout.
      starting = ResumableRunningLocked(&others, v1::JOB_STATE_STARTING);
    }
  }
  auto gone = [&] { return cancelled && cancelled(); };
  while (!starting.empty() && absl::Now() < deadline && !gone()) {
    std::vector<std::string> still;
    for (const std::string& id : starting) {
      absl::StatusOr<v1::Job> job = Get(id);
      if (!job.ok() || IsTerminal(job->state())) continue;
      if (job->state() == v1::JOB_STATE_RUNNING) {
        resumable.push_back(id);
      } else {
        still.push_back(id);
      }
    }
    starting = std::move(still);
    if (!starting.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  // Not running by the deadline: listed, not silently left out.
  others.insert(others.end(), starting.begin(), starting.end());
  std::printf("ithacad: scheduling %s\n", undo ? "resumed (drain undone)" : "paused (drain)");
  std::fflush(stdout);
  if (undo) {
    supervisor_.Wake();  // the queue starts now
  } else {
    // The supervisor reports each drained job QUEUED (OnEnded), which queues it again: it waits
    // there, as every queued job does, for the undo.
    supervisor_.Drain(resumable, std::max(absl::ZeroDuration(), deadline - absl::Now()), cancelled);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : resumable) {
    absl::StatusOr<v1::Job> job = store_->Get(id);
    if (job.ok() && job->state() == v1::JOB_STATE_QUEUED) {
      response.add_drained(id);
    } else {
      others.push_back(id);
    }
  }
  for (const std::string& id : others) response.add_still_running(id);
  response.set_scheduling_paused(scheduling_paused_);
  return response;
}

int Jobs::Detach() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
  }
  const int left = supervisor_.Detach();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, log] : events_) log->Close();
  return left;
}

void Jobs::Shutdown(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
  }
  supervisor_.Shutdown(reason);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, log] : events_) log->Close();
}

namespace {

// The newest checkpoint of a job whose spec asks to resume from one; "" when there is none.
std::string ResumableCheckpoint(const v1::Job& job) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_toml(), "job.toml");
  if (!spec.ok() || !spec->checkpoint.resume || spec->checkpoint.dir.empty()) return "";
  absl::StatusOr<std::string> latest = LatestCheckpoint(spec->checkpoint.dir);
  return latest.ok() ? *latest : "";
}

constexpr char kRestartReason[] = "restart ";

}  // namespace

std::optional<AdoptOrder> Jobs::AdoptableLocked(const v1::Job& job, std::string* why_not) {
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(job.log_dir());
  if (!record.ok() || record->job_id != job.id()) return std::nullopt;
  std::string slurm_id;
  if (absl::StartsWith(job.cluster_job(), kSlurmPrefix)) {
    // A Slurm job: Slurm says whether it still runs; its ranks re-attach over TCP.
    slurm_id = job.cluster_job().substr(strlen(kSlurmPrefix));
    if (!options_.supervisor.slurm) {
      *why_not = absl::StrCat("; Slurm job ", slurm_id,
                              " left to Slurm (this ithacad runs "
                              "without --cluster slurm)");
      return std::nullopt;
    }
    absl::StatusOr<SlurmJobState> st = SlurmQuery(slurm_id, *options_.supervisor.slurm);
    if (!st.ok() || !st->Active()) {
      *why_not = absl::StrCat("; Slurm job ", slurm_id, " ",
                              st.ok() ? st->ToString() : std::string(st.status().message()));
      return std::nullopt;
    }
    if (job.state() == v1::JOB_STATE_CANCELLING) {
      SlurmCancel(slurm_id, 0, *options_.supervisor.slurm).IgnoreError();
      *why_not = absl::StrCat("; scancel of Slurm job ", slurm_id);
      return std::nullopt;
    }
    std::printf("ithacad: adopting job %s (%s): Slurm job %s is %s\n", job.id().c_str(),
                JobStateLabel(job.state()).c_str(), slurm_id.c_str(), st->ToString().c_str());
  } else {
    if (job.state() == v1::JOB_STATE_CANCELLING) return std::nullopt;  // finish the cancel
    int alive = 0;
    for (pid_t pid : record->pids) alive += IsWorkerOf(pid, job.id(), record->secret) ? 1 : 0;
    if (alive == 0) return std::nullopt;  // really gone: resumed or failed by Recover
    std::printf("ithacad: adopting job %s (%s): %d of %zu workers still run\n", job.id().c_str(),
                JobStateLabel(job.state()).c_str(), alive, record->pids.size());
  }
  if (!scheduler_.Reserve(job.id(), record->slots).ok()) return std::nullopt;
  std::fflush(stdout);
  AdoptOrder order{job.id(), job.spec_toml(), job.log_dir(), *std::move(record),
                   job.state() == v1::JOB_STATE_RUNNING};
  order.slurm_id = slurm_id;
  // From the history, not the job's last_steps: a daemon killed inside RecordStep may have
  // written the one and not the other, and the report the rank re-sends must reach the history.
  order.last_steps.assign(order.record.pids.size(), 0);
  absl::StatusOr<std::vector<v1::JobEvent>> history = store_->History(job.id());
  for (const v1::JobEvent& e : history.ok() ? *history : std::vector<v1::JobEvent>()) {
    const int rank = e.step().rank();
    if (e.has_step() && rank >= 0 && rank < static_cast<int>(order.last_steps.size())) {
      order.last_steps[rank] = std::max(order.last_steps[rank], e.step().step());
    }
  }
  return order;
}

absl::Status Jobs::Recover() {
  ASSIGN_OR_RETURN(
      std::vector<v1::Job> left,
      store_->List({v1::JOB_STATE_STARTING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLING}, 0));
  for (const v1::Job& job : left) {
    // Workers outlive the daemon that launched them: take them over when they still run (the
    // supervisor's thread is not started yet; it rechecks every rank on its first look).
    std::optional<AdoptOrder> adopt;
    std::string why_not;  // a Slurm job's state
    {
      std::lock_guard<std::mutex> lock(mu_);
      adopt = AdoptableLocked(job, &why_not);
    }
    if (adopt) {
      // The adopted job still writes into its checkpoint.dir: no new job may share it.
      if (!job.spec().checkpoint_dir().empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        ClaimCheckpointDirLocked(job.spec().checkpoint_dir(), job.id()).IgnoreError();
      }
      supervisor_.Adopt(*adopt);
      continue;
    }
    ASSIGN_OR_RETURN(int pgid, store_->ProcessGroup(job.id()));
    const int killed = pgid > 0 ? Supervisor::KillStrayWorkers(pgid, job.id()) : 0;
    const std::string stray = !why_not.empty() ? why_not
                              : killed > 0     ? absl::StrCat("; killed ", killed, " stray workers")
                                               : "; its workers were gone";
    if (job.state() == v1::JOB_STATE_CANCELLING) {
      ASSIGN_OR_RETURN(v1::Job j, store_->Transition(job.id(), v1::JOB_STATE_CANCELLED,
                                                     "daemon restarted while cancelling" + stray));
    } else if (std::string checkpoint = ResumableCheckpoint(job); !checkpoint.empty()) {
      // The spec asks to resume, and there is a checkpoint: queue the job again; its workers
      // pick the checkpoint up themselves (engine/train/trainer.cc).
      ASSIGN_OR_RETURN(v1::Job j,
                       store_->Transition(job.id(), v1::JOB_STATE_QUEUED,
                                          absl::StrCat("daemon restarted while the job was ",
                                                       JobStateLabel(job.state()), stray,
                                                       "; resuming from ", checkpoint)));
    } else {
      ASSIGN_OR_RETURN(v1::Job j,
                       store_->Transition(job.id(), v1::JOB_STATE_FAILED,
                                          absl::StrCat("daemon restarted while the job was ",
                                                       JobStateLabel(job.state()), stray)));
    }
  }
  ASSIGN_OR_RETURN(std::vector<v1::Job> queued, store_->List({v1::JOB_STATE_QUEUED}, 0));
  std::reverse(queued.begin(), queued.end());  // oldest first
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::Job& job : queued) {
    // Waiting for another job (submit --after): by what that job has become meanwhile.
    if (!job.after().empty()) {
      absl::StatusOr<v1::Job> parent = store_->Get(job.after());
      const JobState ps = parent.ok() ? parent->state() : v1::JOB_STATE_CANCELLED;
      if (ps != v1::JOB_STATE_SUCCEEDED) {
        if (!job.spec().checkpoint_dir().empty()) {
          ClaimCheckpointDirLocked(job.spec().checkpoint_dir(), job.id()).IgnoreError();
        }
        waiting_[job.id()] = job.after();
        if (IsTerminal(ps)) {
          ResolveDependentsLocked(job.after(), ps,
                                  parent.ok() ? parent->reason() : "it no longer exists");
        }
        continue;
      }
    }
    absl::Status st = scheduler_.Enqueue(job.id(), job.spec().world());
    if (st.ok() && !job.spec().checkpoint_dir().empty()) {
      st = ClaimCheckpointDirLocked(job.spec().checkpoint_dir(), job.id());
      if (!st.ok()) scheduler_.Remove(job.id());
    }
    if (!st.ok()) {
      ASSIGN_OR_RETURN(
          v1::Job j, store_->Transition(job.id(), v1::JOB_STATE_FAILED, std::string(st.message())));
    }
  }
  return absl::OkStatus();
}

template <typename Request>
absl::StatusOr<AdmittedSpec> Jobs::Admit(const Request& request, const Node& node,
                                         bool check_inputs, const std::function<bool()>& cancelled,
                                         const std::string& after, bool plan,
                                         const PlanLimits& search) {
  const std::string source = SpecSource(request.source());
  const std::vector<std::string> overrides(request.overrides().begin(), request.overrides().end());
  ASSIGN_OR_RETURN(std::string toml, ApplyOverrides(request.spec_toml(), source, overrides));
  // Planning runs inside the RPC and costs CPU in proportion to the model and the sequence (both
  // bounded by the spec's parser): a bounded number run at once, so a burst of submissions
  // cannot starve the supervisor's heartbeats.
  // A long plan (a long sequence) may not take the last slot: small requests keep one.
  absl::StatusOr<JobSpec> peek = ParseJobSpec(toml, source);
  const bool heavy = peek.ok() && peek->data.seq_len > kSmallPlanTokens;
  const int slots = heavy ? kMaxConcurrentPlans - 1 : kMaxConcurrentPlans;
  if (plans_in_flight_.fetch_add(1) >= slots) {
    plans_in_flight_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "ithacad is already admitting ", slots, " jobs",
        heavy ? absl::StrCat(" (one more slot is kept for data.seq_len <= ", kSmallPlanTokens, ")")
              : "",
        "; try again shortly"));
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
  std::thread planner([&] {
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kPlanningNice);
    admitted = ParseSubmission(toml, source, request.base_dir(), node, options_.state_dir,
                               options_.allowed_roots, cancelled, init_job, search);
  });
  planner.join();
  if (admitted.ok() && check_inputs) {
    absl::Status inputs = cancelled && cancelled() ? absl::CancelledError("the client went away")
                                                   : CheckInputs(*admitted, source);
    if (!inputs.ok()) admitted = inputs;
  }
  plans_in_flight_.fetch_sub(1);
  if (!admitted.ok() && !overrides.empty()) {
    return absl::Status(admitted.status().code(),
                        ExplainSpecError(std::string(admitted.status().message()),
                                         request.spec_toml(), source, overrides));
  }
  return admitted;
}

absl::StatusOr<v1::Job> Jobs::Submit(const v1::SubmitJobRequest& request,
                                     const std::function<bool()>& cancelled) {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(fit_memos_mu_);
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
      const std::string& last = response.jobs(response.jobs_size() - 1).id();
      absl::SimpleAtoi(absl::string_view(last).substr(std::min<size_t>(4, last.size())), &seq);
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
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
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
    absl::StatusOr<SlurmClusterState> cluster = SlurmCluster(*slurm);
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
    std::lock_guard<std::mutex> lock(mu_);
    n.set_scheduling_paused(scheduling_paused_);
    n.set_jobs_queued(scheduler_.queued() + jobs.pending);
    return n;
  }
  std::lock_guard<std::mutex> lock(mu_);
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

std::vector<LaunchOrder> Jobs::TakeLaunches() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return {};      // draining or stopping: queued jobs wait for the next daemon
  if (scheduling_paused_) return {};  // `ithaca drain`: queued jobs wait for the undo
  // Restarted jobs whose backoff is over join the queue (at its end, as a new submission).
  const absl::Time now = absl::Now();
  for (auto it = backing_off_.begin(); it != backing_off_.end();) {
    if (it->second.due > now) {
      ++it;
      continue;
    }
    absl::Status queued = scheduler_.Enqueue(it->first, it->second.world);
    if (!queued.ok()) {
      auto failed =
          store_->Transition(it->first, v1::JOB_STATE_FAILED, std::string(queued.message()));
      if (failed.ok()) PublishState(it->first, *failed);
    }
    it = backing_off_.erase(it);
  }
  std::vector<LaunchOrder> orders;
  for (const Scheduler::Assignment& a : scheduler_.Schedule()) {
    absl::StatusOr<v1::Job> job = store_->Get(a.job_id);
    if (!job.ok()) {
      scheduler_.Release(a.job_id);
      continue;
    }
    orders.push_back({job->id(), job->spec_toml(), job->log_dir(), a.slots});
  }
  return orders;
}

void Jobs::OnClusterJob(const std::string& job_id, const std::string& cluster_job) {
  std::lock_guard<std::mutex> lock(mu_);
  store_->SetClusterJob(job_id, cluster_job).IgnoreError();
}

void Jobs::OnLaunched(const std::string& job_id, const std::vector<int>& slots, int pgid,
                      const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  store_->SetLaunch(job_id, slots, pgid).IgnoreError();
  auto starting = store_->Transition(job_id, v1::JOB_STATE_STARTING, reason);
  if (starting.ok()) {
    PublishState(job_id, *starting);
    // Queue wait: since the job last entered the queue (its submission, or a daemon restart
    // that queued it again to resume).
    int64_t queued_ms = TimeUtil::TimestampToMilliseconds(starting->created_at());
    for (const v1::StateTransition& t : starting->transitions()) {
      if (t.to() == v1::JOB_STATE_QUEUED) queued_ms = TimeUtil::TimestampToMilliseconds(t.time());
    }
    const int64_t waited_ms = TimeUtil::TimestampToMilliseconds(starting->updated_at()) - queued_ms;
    metrics_->OnJobStarted(std::max<int64_t>(waited_ms, 0) / 1000.0);
  }
}

absl::StatusOr<v1::Job> Jobs::OnStateChange(const std::string& job_id, JobState to,
                                            const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(v1::Job job, store_->Transition(job_id, to, reason));
  PublishState(job_id, job);
  return job;
}

absl::Status Jobs::OnStep(const std::string& job_id, const v1::StepReport& step) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(store_->RecordStep(job_id, step));
  v1::JobEvent e;
  *e.mutable_step() = step;
  EventsLocked(job_id)->Append(std::move(e));
  return absl::OkStatus();
}

absl::Status Jobs::OnEval(const std::string& job_id, const v1::EvalReport& eval) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(store_->RecordEval(job_id, eval));
  v1::JobEvent e;
  *e.mutable_eval() = eval;
  EventsLocked(job_id)->Append(std::move(e));
  return absl::OkStatus();
}

void Jobs::OnLogLines(const std::string& job_id, int rank, std::vector<std::string> lines) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<EventLog> events = EventsLocked(job_id);
  for (std::string& line : lines) {
    v1::JobEvent e;
    e.mutable_log()->set_rank(rank);
    e.mutable_log()->set_text(std::move(line));
    events->Append(std::move(e));
  }
}

bool Jobs::RestartLocked(const std::string& job_id, const std::string& reason) {
  absl::StatusOr<v1::Job> job = store_->Get(job_id);
  if (!job.ok() || shutting_down_) return false;
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job->spec_toml(), "job " + job_id);
  if (!spec.ok()) return false;
  const int restarts = job->restarts();
  if (restarts >= spec->retry.max_restarts) return false;
  const double backoff = spec->retry.backoff_seconds;
  const std::string checkpoint = ResumableCheckpoint(*job);
  auto queued = store_->Transition(
      job_id, v1::JOB_STATE_QUEUED,
      absl::StrCat(kRestartReason, restarts + 1, " of ", spec->retry.max_restarts, " in ", backoff,
                   " s, ", checkpoint.empty() ? "from the start" : "from " + checkpoint,
                   "; after: ", reason),  // which names the rank: failed_rank is for FAILED
      std::nullopt, /*restart=*/true);
  if (!queued.ok()) return false;
  PublishState(job_id, *queued);
  backing_off_[job_id] = {absl::Now() + absl::Seconds(backoff),
                          static_cast<int>(spec->parallel.world)};
  metrics_->OnJobRestarted();
  return true;
}

void Jobs::OnEnded(const std::string& job_id, JobState outcome, const std::string& reason,
                   std::optional<int> failed_rank, bool retryable) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_.Release(job_id);
    // Its [retry] policy may queue it again: the event stream goes on.
    if (retryable && RestartLocked(job_id, reason)) return;
    // Drained (`ithaca drain`, or Slurm's warning before a time limit or a preemption): it
    // checkpointed and stopped, and joins the queue again to resume from that checkpoint, with
    // no restart counted. A daemon that is stopping leaves it queued for the next one.
    if (outcome == v1::JOB_STATE_QUEUED && !shutting_down_) {
      absl::StatusOr<v1::Job> queued = store_->Transition(job_id, outcome, reason);
      if (queued.ok()) {
        PublishState(job_id, *queued);
        absl::StatusOr<JobSpec> spec = ParseJobSpec(queued->spec_toml(), "job " + job_id);
        backing_off_[job_id] = {absl::Now(),
                                spec.ok() ? static_cast<int>(spec->parallel.world) : 1};
        return;
      }
      std::fprintf(stderr, "ithacad: %s\n", queued.status().ToString().c_str());
    }
    auto done = store_->Transition(job_id, outcome, reason, failed_rank);
    if (!done.ok()) {
      std::fprintf(stderr, "ithacad: %s\n", done.status().ToString().c_str());
    } else {
      PublishState(job_id, *done);
    }
    EndEventsLocked(job_id);
    ReleaseCheckpointDirLocked(job_id);
    if (done.ok()) ResolveDependentsLocked(job_id, done->state(), done->reason());
  }
  // A job that waited for this one may start: the supervisor's loop, which called this, takes
  // the launches on its next pass.
  RefreshJobCounts();
}

void Jobs::ResolveDependentsLocked(const std::string& parent, JobState outcome,
                                   const std::string& reason) {
  if (!IsTerminal(outcome)) return;
  std::vector<std::string> children;
  for (const auto& [child, waits_for] : waiting_) {
    if (waits_for == parent) children.push_back(child);
  }
  for (const std::string& child : children) {
    waiting_.erase(child);
    absl::StatusOr<v1::Job> job = store_->Get(child);
    if (!job.ok() || job->state() != v1::JOB_STATE_QUEUED) continue;
    if (outcome == v1::JOB_STATE_SUCCEEDED) {
      absl::Status queued = scheduler_.Enqueue(child, job->spec().world());
      if (!queued.ok()) {
        auto failed =
            store_->Transition(child, v1::JOB_STATE_FAILED, std::string(queued.message()));
        if (failed.ok()) PublishState(child, *failed);
        EndEventsLocked(child);
        ReleaseCheckpointDirLocked(child);
        ResolveDependentsLocked(child, v1::JOB_STATE_FAILED, std::string(queued.message()));
      }
      continue;
    }
    const std::string why =
        absl::StrCat("job ", parent, " it waited for (--after) ended ", JobStateLabel(outcome),
                     reason.empty() ? "" : ": ", reason.substr(0, 1024));
    auto cancelled = store_->Transition(child, v1::JOB_STATE_CANCELLED, why);
    if (cancelled.ok()) PublishState(child, *cancelled);
    EndEventsLocked(child);
    ReleaseCheckpointDirLocked(child);
    ResolveDependentsLocked(child, v1::JOB_STATE_CANCELLED, why);
  }
}

}  // namespace ithaca
