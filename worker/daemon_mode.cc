#include "worker/daemon_mode.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/comm/bootstrap.h"
#include "engine/core/path_policy.h"
#include "engine/memory/allocator.h"
#include "engine/runtime/rank.h"
#include "engine/spec/job_spec.h"
#include "launch/exit_codes.h"
#include "launch/worker_contract.h"
#include "worker/job_paths.h"

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
    q->set_keys(k.keys);
    q->set_length(k.length);
    q->set_depth(k.depth);
    q->set_samples(static_cast<int32_t>(k.samples));
    q->set_accuracy(k.accuracy);
    q->set_logprob(k.logprob);
    q->set_seconds(k.seconds);
  }
  for (const PositionLoss& b : r.positions) {
    v1::PositionLoss* q = p.add_positions();
    q->set_begin(b.begin);
    q->set_end(b.end);
    q->set_loss(b.loss);
    q->set_tokens(b.tokens);
  }
  return p;
}

absl::Status Train(const DaemonWorkerOptions& o, const JobSpec& spec, DaemonClient& link,
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
  if (o.rank == 0)
    on_eval = [&link, &o](const EvalReport& r) { link.ReportEval(ToProto(r, o.rank)); };
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
    RETURN_IF_ERROR(
        trainer.Run([&link, &o](const StepReport& r) { link.ReportStep(ToProto(r, o.rank)); },
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
  DaemonClient link(o, *std::move(channel), &g_stop);
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

}  // namespace ithaca
