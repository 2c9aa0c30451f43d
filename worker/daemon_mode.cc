#include "worker/daemon_mode.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <cstdlib>
#include <optional>
#include <thread>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/bootstrap.h"
#include "engine/core/mutex.h"
#include "engine/core/path_policy.h"
#include "engine/memory/allocator.h"
#include "engine/runtime/rank.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/spec/job_spec.h"
#include "ithaca/v1/worker.grpc.pb.h"
#include "launch/rpc_text.h"
#include "daemon_link/connection.h"
#include "absl/strings/match.h"
#include "worker/job_paths.h"
#include "launch/exit_codes.h"
#include "launch/worker_contract.h"

namespace ithaca {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_drain{false};

void OnSigterm(int) { g_stop.store(true); }
void OnSigusr1(int) { g_drain.store(true); }

// What the ranks agreed to do before the next step: a signal reaches each rank at its own time,
// so they agree (one small all-reduce per step) and all stop after the same step, which is what
// lets a drain write a checkpoint together.
struct StopRequest {
  bool stop = false;   // SIGTERM on some rank: stop
  bool drain = false;  // SIGUSR1 on some rank: checkpoint, then stop
};

absl::StatusOr<StopRequest> AgreeOnStop(Rank& rank) {
  StopRequest mine{g_stop.load(), g_drain.load()};
  Comm* comm = rank.comm();
  if (comm == nullptr || comm->size() == 1) return mine;
  LlamaModel* model = rank.trainer().model();
  ASSIGN_OR_RETURN(Buffer buf, Buffer::Make(model->allocator(), DType::kF32, {2}, Tier::kComm));
  float flags[2] = {mine.stop ? 1.f : 0.f, mine.drain ? 1.f : 0.f};
  model->ops()->Upload(flags, DType::kF32, buf.tensor());
  RETURN_IF_ERROR(comm->AllReduce(buf.tensor()));
  model->ops()->Download(buf.tensor(), flags, DType::kF32);
  return StopRequest{flags[0] > 0, flags[1] > 0};
}

// The node this rank runs on, for the daemon's status and metrics: Slurm's name for it, else
// the host name.
std::string NodeName() {
  if (const char* n = std::getenv("SLURMD_NODENAME"); n != nullptr && *n != 0) return n;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

v1::StepReport ToProto(const StepReport& r, int rank) {
  v1::StepReport p;
  p.set_rank(rank);
  p.set_step(r.step);
  p.set_total_steps(r.total_steps);
  p.set_loss(r.loss);
  p.set_tokens(r.tokens);
  p.set_seconds(r.seconds);
  p.set_tokens_per_second(r.tokens_per_second);
  p.set_model_tflops(r.model_tflops);
  p.set_mfu(r.mfu);
  p.set_grad_norm(r.grad_norm);
  p.set_lr(r.lr);
  p.set_cpu_update_seconds(r.cpu_update_seconds);
  p.set_device_wait_seconds(r.device_wait_seconds);
  p.set_trainable_parameters(r.trainable_parameters);
  p.set_parameters(r.parameters);
  for (int t = 0; t < kNumTiers; ++t) {
    v1::TierBytes* tb = p.add_memory();
    tb->set_tier(TierName(static_cast<Tier>(t)));
    tb->set_current_bytes(r.mem_current[t]);
    tb->set_peak_bytes(r.mem_peak[t]);
  }
  p.set_device_peak_bytes(r.mem_device_peak);
  p.set_checkpoint_seconds(r.checkpoint_seconds);
  p.set_checkpoint_time_unix(r.checkpoint_time_unix);
  for (size_t i = 0; i < r.sources.size(); ++i) {
    v1::SourceReport* s = p.add_sources();
    s->set_source(static_cast<int32_t>(i + 1));
    s->set_path(r.sources[i].path);
    s->set_samples(r.sources[i].samples);
    s->set_tokens(r.sources[i].tokens);
    s->set_loss_tokens(r.sources[i].loss_tokens);
    s->set_loss(r.sources[i].loss);
  }
  return p;
}

v1::EvalReport ToProto(const EvalReport& r, int rank) {
  v1::EvalReport p;
  p.set_rank(rank);
  p.set_step(r.step);
  p.set_loss(r.loss);
  p.set_tokens(r.tokens);
  p.set_batches(static_cast<int32_t>(r.batches));
  p.set_seconds(r.seconds);
  for (const PasskeyResult& k : r.passkey) {
    v1::PasskeyResult* q = p.add_passkey();
    q->set_length(k.length);
    q->set_depth(k.depth);
    q->set_samples(static_cast<int32_t>(k.samples));
    q->set_accuracy(k.accuracy);
    q->set_logprob(k.logprob);
    q->set_seconds(k.seconds);
  }
  return p;
}

// A daemon that restarts binds the same address again: reconnect within a second of it. A path
// (or unix:PATH) is the daemon's worker socket on this machine; host:port is its TCP port, for
// ranks on other nodes (ithacad --cluster slurm), reached as clients reach it: TLS when
// $ITHACA_CA names the CA, the bearer token of $ITHACA_TOKEN_FILE (daemon_link/connection.h).
absl::StatusOr<std::shared_ptr<grpc::Channel>> DaemonChannel(const std::string& address) {
  ConnectionOptions c;
  c.server =
      IsUnixAddress(address) && !absl::StartsWith(address, "unix:") ? "unix:" + address : address;
  if (!IsUnixAddress(address)) ApplyConnectionEnvironment(&c);
  c.max_reconnect_backoff_ms = 1000;
  return Connect(c);
}

// Every call carries the job's secret: over TCP, a client's token alone does not make a caller
// one of the job's ranks.
void WithSecret(grpc::ClientContext* ctx, const std::string& secret) {
  if (!secret.empty()) ctx->AddMetadata(kJobSecretMetadata, secret);
}

// The daemon is not there (stopped, restarting; CANCELLED: a call in flight when it stopped):
// try again later. The daemon ignores a step report it already recorded.
bool DaemonAway(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         st.error_code() == grpc::StatusCode::CANCELLED;
}

void SendExiting(v1::WorkerService::Stub* stub, const std::string& secret,
                 const std::string& job_id, int rank, int exit_code, int signal) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(5000));
  WithSecret(&ctx, secret);
  v1::ExitingRequest req;
  req.set_job_id(job_id);
  req.set_rank(rank);
  req.set_exit_code(exit_code);
  req.set_signal(signal);
  v1::Ack ack;
  stub->Exiting(&ctx, req, &ack);
}

// One rank's connection to the daemon, and the heartbeat thread.
class DaemonLink {
 public:
  DaemonLink(const DaemonWorkerOptions& o, std::shared_ptr<grpc::Channel> channel)
      : o_(o), address_(o.socket), stub_(v1::WorkerService::NewStub(std::move(channel))) {}
  ~DaemonLink() {
    FlushReports();
    StopHeartbeats();
  }

  // `reattach`: this rank registered with an earlier daemon, which went away.
  absl::StatusOr<v1::RegisterResponse> Register(bool reattach = false) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(reattach ? 5000 : 30000));
    ctx.set_wait_for_ready(true);  // the daemon may still be binding its socket
    WithSecret(&ctx, o_.secret);
    v1::RegisterRequest req;
    req.set_job_id(o_.job_id);
    req.set_rank(o_.rank);
    req.set_pid(getpid());
    req.set_secret(o_.secret);
    req.set_reattach(reattach);
    req.set_node(NodeName());
    v1::RegisterResponse resp;
    grpc::Status st = stub()->Register(&ctx, req, &resp);
    if (!st.ok()) {
      if (reattach && DaemonAway(st)) return absl::UnavailableError(st.error_message());
      return absl::Status(
          static_cast<absl::StatusCode>(st.error_code()),
          absl::StrCat("register with ithacad at ", o_.socket, ": ", st.error_message()));
    }
    return resp;
  }

  // Queues the step's report; a sender thread delivers reports in order, so the training loop
  // never waits on the daemon.
  void ReportStep(const StepReport& r) { Queue(ToProto(r, o_.rank)); }
  // An evaluation's report, in the same queue: the daemon sees it after the step it follows.
  void ReportEval(const EvalReport& r) { Queue(ToProto(r, o_.rank)); }

  // Delivers every queued report, then stops the sender (before the rank exits, so the daemon
  // has seen the last step before it sees the exit).
  void FlushReports() {
    {
      MutexLock lock(&report_mu_);
      reports_done_ = true;
    }
    report_cv_.SignalAll();
    if (sender_.joinable()) sender_.join();
  }

  void Log(const std::string& level, const std::string& text) {
    std::fprintf(stderr, "rank %d: %s\n", o_.rank, text.c_str());
    std::fflush(stderr);
    grpc::ClientContext ctx;
    ctx.set_deadline(In(5000));
    WithSecret(&ctx, o_.secret);
    v1::LogRequest req;
    req.set_job_id(o_.job_id);
    req.set_rank(o_.rank);
    req.set_level(level);
    req.set_text(text);
    // A file name in Latin-1 must not turn the real error into an unparsable request.
    SanitizeUtf8(&req);
    v1::Ack ack;
    stub()->Log(&ctx, req, &ack);
  }

  // The rank's exit code, for a daemon that adopted the rank and cannot waitpid it.
  void Exiting(int code) { SendExiting(stub().get(), o_.secret, o_.job_id, o_.rank, code, 0); }

  // Heart-beats every `interval_ms`. When the daemon goes away, the rank trains on and
  // re-attaches to the one that comes back (the step reports wait in their queue meanwhile).
  // When the daemon says the job is over, or does not know it, the rank stops as if it got
  // SIGTERM; when none answers for `lost_timeout_ms` (0: ten intervals, at least 10 s), it exits
  // outright, even in the middle of a step.
  void StartHeartbeats(int interval_ms, int lost_timeout_ms) {
    thread_ = std::thread([this, interval_ms, lost_timeout_ms] {
      const auto lost_after = std::chrono::milliseconds(
          lost_timeout_ms > 0 ? lost_timeout_ms : std::max(10000, 10 * interval_ms));
      auto last_ok = std::chrono::steady_clock::now();
      bool away = false;  // the daemon stopped answering: re-attach when one answers again
      while (true) {
        {
          MutexLock lock(&mu_);
          if (!done_) cv_.WaitFor(&mu_, absl::Milliseconds(interval_ms));
          if (done_) break;
        }
        grpc::Status st = away ? Reattach() : Beat();
        const auto now = std::chrono::steady_clock::now();
        if (st.ok()) {
          if (away) std::fprintf(stderr, "rank %d: re-attached to ithacad\n", o_.rank);
          away = false;
          last_ok = now;
        } else if (DaemonAway(st) || st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
          // FAILED_PRECONDITION from Heartbeat: a new daemon adopted the job and waits for this
          // rank to re-attach.
          if (!away) {
            std::fprintf(stderr, "rank %d: ithacad away (%s); training on, waiting for it\n",
                         o_.rank, st.error_message().c_str());
          }
          away = true;
          if (now - last_ok > lost_after) {
            std::fprintf(stderr, "rank %d: ithacad unreachable for %lld s (%s); exiting\n", o_.rank,
                         static_cast<long long>(
                             std::chrono::duration_cast<std::chrono::seconds>(lost_after).count()),
                         st.error_message().c_str());
            std::fflush(stderr);
            _exit(kExitKilled);
          }
        } else {  // ABORTED: the job is ending; NOT_FOUND, PERMISSION_DENIED: not ours any more
          std::fprintf(stderr, "rank %d: %s; stopping\n", o_.rank, st.error_message().c_str());
          g_stop.store(true);
          if (st.error_code() != grpc::StatusCode::ABORTED) {
            reports_abandoned_.store(true);  // no daemon will take them
            report_cv_.SignalAll();
          }
        }
        std::fflush(stderr);
      }
    });
  }

  void StopHeartbeats() {
    {
      MutexLock lock(&mu_);
      done_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
  }

 private:
  using Report = std::variant<v1::StepReport, v1::EvalReport>;

  grpc::Status Beat() {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(5000));
    WithSecret(&ctx, o_.secret);
    v1::HeartbeatRequest req;
    req.set_job_id(o_.job_id);
    req.set_rank(o_.rank);
    v1::Ack ack;
    return stub()->Heartbeat(&ctx, req, &ack);
  }

  // The daemon this rank talks to (the heartbeat thread may switch it: FollowDaemon).
  std::shared_ptr<v1::WorkerService::Stub> stub() {
    MutexLock lock(&stub_mu_);
    return stub_;
  }

  // A daemon restarted elsewhere (another port or host) says where in the address file; the
  // rank dials it from now on.
  void FollowDaemon() {
    if (o_.address_file.empty()) return;
    std::ifstream in(o_.address_file);
    std::string address;
    std::getline(in, address);
    address = std::string(absl::StripAsciiWhitespace(address));
    if (address.empty() || address == address_) return;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DaemonChannel(address);
    if (!channel.ok()) {
      std::fprintf(stderr, "rank %d: %s names ithacad at %s: %s\n", o_.rank,
                   o_.address_file.c_str(), address.c_str(), channel.status().ToString().c_str());
      return;
    }
    std::fprintf(stderr, "rank %d: ithacad is now at %s (%s)\n", o_.rank, address.c_str(),
                 o_.address_file.c_str());
    address_ = address;
    MutexLock lock(&stub_mu_);
    stub_ = v1::WorkerService::NewStub(*std::move(channel));
  }

  grpc::Status Reattach() {
    FollowDaemon();
    absl::StatusOr<v1::RegisterResponse> r = Register(/*reattach=*/true);
    if (r.ok()) return grpc::Status::OK;
    return grpc::Status(static_cast<grpc::StatusCode>(r.status().code()),
                        std::string(r.status().message()));
  }

  void Queue(Report report) {
    {
      MutexLock lock(&report_mu_);
      if (!sender_.joinable()) sender_ = std::thread([this] { SendReports(); });
      reports_.push_back(std::move(report));
    }
    report_cv_.SignalAll();
  }

  // Waits up to `timeout`, or until the daemon disowns the job (reports_abandoned_).
  void WaitUnlessAbandoned(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(report_mu_) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!reports_abandoned_.load() && absl::Now() < deadline) {
      report_cv_.WaitUntil(&report_mu_, deadline);
    }
  }

  void SendReports() {
    report_mu_.Lock();
    while (true) {
      while (!reports_done_ && reports_.empty()) report_cv_.Wait(&report_mu_);
      if (reports_.empty()) break;  // done and drained
      Report report = reports_.front();
      report_mu_.Unlock();
      grpc::Status st = Send(report);
      report_mu_.Lock();
      // The daemon is away (restarting): the report waits at the head of the queue, so the next
      // daemon gets every step in order. The heartbeat thread ends the wait, one way or another.
      if (DaemonAway(st) && !reports_abandoned_.load()) {
        WaitUnlessAbandoned(absl::Milliseconds(200));
        continue;
      }
      // The daemon could not store it (its state disk full): sent again each second while the
      // rank trains; once it exits, for at most kStoreRetry, then the daemon names the gap.
      if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        const auto now = std::chrono::steady_clock::now();
        if (!reports_done_) store_retry_until_.reset();
        if (reports_done_ && !store_retry_until_) store_retry_until_ = now + kStoreRetry;
        if (!store_retry_until_ || now < *store_retry_until_) {
          WaitUnlessAbandoned(absl::Seconds(1));
          if (!reports_abandoned_.load()) continue;
        }
      }
      reports_.pop_front();
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: report %s: %s\n", o_.rank,
                     report.index() == 0 ? "step" : "eval", st.error_message().c_str());
      }
    }
    report_mu_.Unlock();
  }

  grpc::Status Send(const Report& report) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(10000));
    WithSecret(&ctx, o_.secret);
    v1::Ack ack;
    if (const auto* step = std::get_if<v1::StepReport>(&report)) {
      v1::ReportStepRequest req;
      req.set_job_id(o_.job_id);
      *req.mutable_step() = *step;
      SanitizeUtf8(&req);
      return stub()->ReportStep(&ctx, req, &ack);
    }
    v1::ReportEvalRequest req;
    req.set_job_id(o_.job_id);
    *req.mutable_eval() = std::get<v1::EvalReport>(report);
    SanitizeUtf8(&req);
    return stub()->ReportEval(&ctx, req, &ack);
  }

  // Three threads share the link: the training loop (reports, logs, the exit), the heartbeat
  // thread and the report sender.
  DaemonWorkerOptions o_;
  std::string address_;  // the daemon's, as stub_ dials it (heartbeat thread only)
  Mutex stub_mu_;
  std::shared_ptr<v1::WorkerService::Stub> stub_ ABSL_GUARDED_BY(stub_mu_);
  // The report queue, between the training loop and the sender.
  Mutex report_mu_;
  CondVar report_cv_;  // a report queued, the queue closed, or the job disowned
  std::deque<Report> reports_ ABSL_GUARDED_BY(report_mu_);
  bool reports_done_ ABSL_GUARDED_BY(report_mu_) = false;
  // The daemon disowned the job: queued reports are dropped instead of waited on.
  std::atomic<bool> reports_abandoned_{false};
  // A report the daemon could not store is retried this long after the rank's training ended.
  static constexpr std::chrono::seconds kStoreRetry{30};
  std::optional<std::chrono::steady_clock::time_point> store_retry_until_
      ABSL_GUARDED_BY(report_mu_);
  std::thread sender_;  // started (Queue) and joined (FlushReports) by the training loop
  std::thread thread_;  // the heartbeat thread
  Mutex mu_;
  CondVar cv_;  // StopHeartbeats
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status Train(const DaemonWorkerOptions& o, const JobSpec& spec, DaemonLink& link,
                   bool* drained) {
  // The rank's identity and rendezvous come from the launcher's ITHACA_* variables; the daemon
  // created the Gloo FileStore directory of $ITHACA_RENDEZVOUS.
  ASSIGN_OR_RETURN(RankInfo info, RankInfoFromEnvironment());
  if (info.rank != o.rank || info.world != o.world) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvRank, "/", kEnvWorldSize, " say rank ",
                                                   info.rank, " of ", info.world, ", expected ",
                                                   o.rank, " of ", o.world));
  }
  // Admission checked the paths against ithacad's roots; what is there now is checked again
  // before anything is opened (a link planted since is refused), and checkpoint.dir is made.
  ASSIGN_OR_RETURN(std::vector<std::string> roots, AllowedRootsFromEnvironment());
  RETURN_IF_ERROR(CheckJobPaths(spec, roots));
  // The spec is the one admission resolved (every "auto" decided against this node): it runs
  // as it is. Joining the group and every collective give up after RankOptions' timeout (a dead
  // peer is an error, not a hang); the daemon normally kills the other ranks first.
  // The daemon (its socket) and the job name the run: a relaunch of this job may resume at its
  // last step; another job finding that checkpoint is refused (Trainer::Create).
  RankOptions options;
  options.run_id = absl::StrCat("ithacad ", o.socket, " ", o.job_id);
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> rank, Rank::Create(spec, info, options));
  Trainer& trainer = rank->trainer();
  std::printf("rank %d/%d: job %s (%s), %lld tokens per sample, %lld steps, backend %s%s%s\n",
              o.rank, o.world, o.job_id.c_str(),
              spec.model.config.empty() ? spec.model.preset.c_str() : spec.model.config.c_str(),
              static_cast<long long>(spec.data.seq_len),
              static_cast<long long>(spec.training.steps), spec.backend.c_str(),
              rank->libraries().empty() ? "" : " with ", rank->libraries().c_str());
  std::fflush(stdout);
  // Rank 0 reports the evaluations: their losses are already the whole job's.
  std::function<void(const EvalReport&)> on_eval = nullptr;
  if (o.rank == 0) on_eval = [&link](const EvalReport& r) { link.ReportEval(r); };
  // One step per Run call, so SIGTERM and SIGUSR1 are honoured between steps.
  while (trainer.state().step < spec.training.steps) {
    ASSIGN_OR_RETURN(StopRequest request, AgreeOnStop(*rank));
    if (request.drain) {
      ASSIGN_OR_RETURN(CheckpointSaveReport saved, trainer.SaveCheckpointNow());
      (void)saved;
      *drained = true;
      return absl::CancelledError(
          absl::StrCat("drained: checkpointed and stopped after step ", trainer.state().step));
    }
    if (request.stop) {
      return absl::CancelledError(
          absl::StrCat("stopped by SIGTERM after step ", trainer.state().step));
    }
    RETURN_IF_ERROR(trainer.Run([&link](const StepReport& r) { link.ReportStep(r); },
                                trainer.state().step + 1, on_eval));
  }
  // An evaluation-only job takes no step: its one evaluation is the whole run.
  if (spec.training.steps == 0) RETURN_IF_ERROR(trainer.Run(nullptr, 0, on_eval));
  if (!spec.checkpoint.dir.empty()) {
    absl::StatusOr<std::string> latest = LatestCheckpoint(spec.checkpoint.dir);
    if (latest.ok()) std::printf("checkpoint: %s\n", latest->c_str());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DaemonWorkerOptions> DaemonWorkerOptionsFromEnv(const std::string& socket_flag,
                                                               const std::string& job_flag) {
  auto env = [](const char* k) -> std::string {
    const char* v = std::getenv(k);
    return v ? v : "";
  };
  DaemonWorkerOptions o;
  o.socket = socket_flag.empty() ? env(kEnvDaemonSocket) : socket_flag;
  o.job_id = job_flag.empty() ? env(kEnvJobId) : job_flag;
  o.secret = env(kEnvJobSecret);
  o.address_file = env(kEnvDaemonAddrFile);
  if (o.socket.empty()) return absl::InvalidArgumentError("--daemon: no socket path given");
  if (o.job_id.empty()) return absl::InvalidArgumentError("--job: no job id given");
  const std::string rank = env(kEnvRank), world = env(kEnvWorldSize);
  if (!rank.empty() && !absl::SimpleAtoi(rank, &o.rank)) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvRank, ": not a number: ", rank));
  }
  if (!world.empty() && !absl::SimpleAtoi(world, &o.world)) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvWorldSize, ": not a number: ", world));
  }
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvRank, " ", o.rank, " is outside ", kEnvWorldSize, " ", o.world));
  }
  return o;
}

int RunDaemonWorker(const DaemonWorkerOptions& o) {
  struct sigaction sa = {};
  sa.sa_handler = OnSigterm;
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction drain = {};
  drain.sa_handler = OnSigusr1;
  sigaction(SIGUSR1, &drain, nullptr);
  // The launcher started this rank with SIGUSR1 blocked (LaunchSpec::drain_signal_blocked): a
  // drain that came before the handler was pending, and is taken now.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DaemonChannel(o.socket);
  if (!channel.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", o.rank, channel.status().ToString().c_str());
    return kExitBadSpec;
  }
  DaemonLink link(o, *std::move(channel));
  absl::StatusOr<v1::RegisterResponse> reg = link.Register();
  if (!reg.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", o.rank, reg.status().ToString().c_str());
    return kExitError;
  }
  link.StartHeartbeats(std::max(50, reg->heartbeat_interval_ms()), reg->daemon_lost_timeout_ms());
  absl::StatusOr<JobSpec> spec = ParseJobSpec(reg->spec_toml(), "job " + o.job_id);
  bool drained = false;
  absl::Status st = spec.ok() ? Train(o, *spec, link, &drained) : spec.status();
  link.FlushReports();
  if (!st.ok())
    link.Log(st.code() == absl::StatusCode::kCancelled ? "INFO" : "ERROR",
             std::string(st.message()));
  const int code = drained ? kExitDrained : ExitCodeFor(st);
  link.Exiting(code);
  link.StopHeartbeats();
  return code;
}

void ReportKilledRank(const std::string& address, const std::string& job_id, int rank, int signal) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DaemonChannel(address);
  if (!channel.ok()) return;
  const char* secret = std::getenv(kEnvJobSecret);
  auto stub = v1::WorkerService::NewStub(*std::move(channel));
  SendExiting(stub.get(), secret != nullptr ? secret : "", job_id, rank, 0, signal);
}

}  // namespace ithaca
