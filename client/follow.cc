#include "client/follow.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/format.h"
#include "client/json.h"

namespace ithaca {
namespace {

constexpr auto kResumeFor = std::chrono::seconds(60);

// A watch that breaks with these is opened again (a port-forward that blinks, a proxy dropping
// the connection, a daemon restarting); any other code is the daemon's answer.
bool Resumable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::INTERNAL ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::CANCELLED;
}

// The terminal's bottom line while a job is followed: the newest step's progress and, while
// nothing arrives (a 40-156 s step, a long model load), a spinner with the time it has taken.
// Log lines and state changes are printed above it. Without a terminal: plain lines, no
// spinner, at most one step line a second, and the first time one is left out a note on stderr
// saying so (`skip_note`).
class LiveLine {
 public:
  LiveLine(bool tty, std::string skip_note) : tty_(tty), skip_note_(std::move(skip_note)) {
    if (tty_) ticker_ = std::thread([this] { Tick(); });
  }
  ~LiveLine() { Close(); }

  void Phase(const std::string& phase) {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = phase;
    since_ = std::chrono::steady_clock::now();
    DrawLocked();
  }
  void Step(const std::string& progress, bool last) {
    std::lock_guard<std::mutex> lock(mu_);
    progress_ = progress;
    since_ = std::chrono::steady_clock::now();
    if (tty_) return DrawLocked();
    // In a log file: at most one progress line a second, and the last one.
    if (last || since_ - last_plain_ > std::chrono::seconds(1)) {
      std::printf("%s\n", progress_.c_str());
      std::fflush(stdout);
      last_plain_ = since_;
    } else if (!skip_noted_) {
      skip_noted_ = true;
      std::fprintf(stderr, "%s\n", skip_note_.c_str());
      std::fflush(stderr);
    }
  }
  // A whole line above the live line (to stdout, or stderr for notes).
  void Print(const std::string& line, FILE* to = stdout) {
    std::lock_guard<std::mutex> lock(mu_);
    if (tty_) std::printf("\r\033[K");
    std::fflush(stdout);
    std::fprintf(to, "%s\n", line.c_str());
    std::fflush(to);
    DrawLocked();
  }
  // Leaves the newest progress line on the screen (before the job's final state, say).
  void Commit() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!tty_ || progress_.empty()) return;
    std::printf("\r\033[K%s\n", progress_.c_str());
    std::fflush(stdout);
    progress_.clear();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      if (tty_) {
        std::printf("\r\033[K%s%s", progress_.c_str(), progress_.empty() ? "" : "\n");
        std::fflush(stdout);
      }
    }
    cv_.notify_all();
    if (ticker_.joinable()) ticker_.join();
  }

 private:
  void Tick() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!closed_) {
      cv_.wait_for(lock, std::chrono::milliseconds(250));
      ++frame_;
      // Only the spinner moves: nothing to redraw before it shows.
      if (std::chrono::steady_clock::now() - since_ >= kSpinAfter) DrawLocked();
    }
  }
  void DrawLocked() {
    if (!tty_ || closed_) return;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
    std::string line = progress_;
    if (waited >= std::chrono::duration<double>(kSpinAfter).count()) {
      const char spin = "|/-\\"[frame_ % 4];
      absl::StrAppend(&line, line.empty() ? "" : " | ", std::string(1, spin), " ",
                      progress_.empty() ? phase_ : "next step", " ", HumanDuration(waited));
    }
    std::printf("\r\033[K%s", line.c_str());
    std::fflush(stdout);
  }

  static constexpr auto kSpinAfter = std::chrono::seconds(2);
  const bool tty_;
  const std::string skip_note_;
  bool skip_noted_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread ticker_;
  std::string progress_, phase_ = "waiting";
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_plain_;
  int frame_ = 0;
  bool closed_ = false;
};

}  // namespace

int FollowJob(CliContext& c, const std::string& id, bool logs) {
  const bool json = c.output == Output::kJson;
  LiveLine live(!json && isatty(1),
                absl::StrCat("ithaca: not a terminal: at most one step line a second is printed, "
                             "and the last; `ithaca logs ",
                             id, " --steps` has every step"));
  int64_t after = 0;  // the newest event seen: a resumed stream continues after it
  bool first = true;
  double avg_step = -1;  // moving average of step seconds, for the ETA
  v1::JobState final_state = v1::JOB_STATE_UNSPECIFIED;
  using Clock = std::chrono::steady_clock;
  Clock::time_point give_up_at{};  // while resuming, when to give up; zero: not resuming
  auto backoff = std::chrono::milliseconds(200);
  auto print_state = [&](v1::JobState to, const std::string& reason) {
    if (IsTerminal(to)) live.Commit();
    live.Print(absl::StrCat(id, ": ", StateName(to),
                            reason.empty() ? "" : " (" + Printable(reason) + ")"));
  };
  while (true) {
    grpc::ClientContext ctx;
    v1::WatchJobRequest req;
    req.set_id(id);
    req.set_include_logs(logs && !json);
    req.set_after_seq(after);
    auto reader = c.stub->WatchJob(&ctx, req);
    std::optional<v1::Job> snapshot;
    bool ended = false;
    v1::JobEvent e;
    while (!ended && reader->Read(&e)) {
      give_up_at = {};
      backoff = std::chrono::milliseconds(200);
      if (e.kind_case() == v1::JobEvent::KIND_NOT_SET) {  // the snapshot, first on each stream
        snapshot = e.job();
        if (first) {
          first = false;
          if (json) PrintJson(e);
          live.Phase(StateName(e.job().state()));
        }
        continue;
      }
      after = std::max(after, e.seq());
      if (json) PrintJson(e);
      if (e.has_step() && e.step().rank() == 0 && !json) {
        const v1::StepReport& r = e.step();
        avg_step = avg_step < 0 ? r.seconds() : 0.9 * avg_step + 0.1 * r.seconds();
        live.Step(ProgressLine(r, avg_step * (r.total_steps() - r.step())),
                  r.step() == r.total_steps());
      }
      if (e.has_eval() && !json) live.Print(EvalLine(e.eval()));
      if (e.has_log() && !json && ShowLogLine(e.log())) {
        live.Print(absl::StrCat("[rank ", e.log().rank(), "] ", Printable(e.log().text())));
      }
      if (e.has_state()) {
        if (!json) live.Phase(StateName(e.state().to()));
        if (!json && e.state().from() != v1::JOB_STATE_UNSPECIFIED) {
          print_state(e.state().to(), e.state().reason());
        }
        if (IsTerminal(e.state().to())) {
          final_state = e.state().to();
          ended = true;
        }
      }
    }
    if (ended) ctx.TryCancel();
    grpc::Status st = reader->Finish();
    if (ended) break;
    if (!st.ok() && !Resumable(st.error_code())) {
      live.Close();
      return RpcError(c, st);
    }
    if (st.ok() && snapshot && IsTerminal(snapshot->state())) {
      // The daemon ended a stream that began after the job did, without the end: the job's
      // events are gone (the daemon restarted) and its stored state ends the story. A stream
      // that broke instead may have lost events it held for us (a resumed stream replays them at
      // once), so it is opened again below.
      final_state = snapshot->state();
      if (!json) print_state(final_state, snapshot->reason());
      break;
    }
    const std::string why =
        st.ok()
            ? "the stream ended before the job did"
            : absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                           ": ", st.error_message());
    const Clock::time_point now = Clock::now();
    if (give_up_at == Clock::time_point{}) {
      give_up_at = now + kResumeFor;
      live.Print(absl::StrCat("ithaca: the watch of ", id, " broke (", why,
                              "); resuming after event ", after),
                 stderr);
    }
    if (now >= give_up_at) {
      live.Close();
      std::fprintf(stderr, "ithaca: %s: the watch of %s did not resume within %lld s (%s)\n",
                   c.server.c_str(), id.c_str(), static_cast<long long>(kResumeFor.count()),
                   why.c_str());
      return 2;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  live.Close();
  return final_state == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

void PrintJson(const google::protobuf::Message& m) {
  std::printf("%s\n", ProtoJson(m).c_str());
  std::fflush(stdout);
}

}  // namespace ithaca
