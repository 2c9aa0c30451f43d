#include "client/commands.h"

#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/format.h"
#include "client/json.h"
#include "client/report.h"
#include "client/spec_overrides.h"

namespace ithaca {

const char kUsage[] =
    "usage: ithaca [--server ADDR] [--token-file FILE] [--ca PEM] [-o json|name|wide] [-q] "
    "COMMAND ...\n"
    "  submit JOB.toml [-f] [--set KEY=VALUE]... [--no-logs]\n"
    "                               queue a job; -f/--follow shows its progress, log lines and\n"
    "                               a spinner during long steps, and exits 0 iff it succeeds\n"
    "  watch ID [--no-logs]         follow a job (as submit --follow); exits 0 iff it succeeds;\n"
    "                               a dropped stream is resumed where it stopped\n"
    "  status ID                    state, reason, last step, history, memory per tier\n"
    "  list [--state S[,S]] [--limit N]\n"
    "                               jobs, newest first (S: queued, starting, running,\n"
    "                               succeeded, failed, cancelling, cancelled)\n"
    "  logs ID [-f] [--rank N] [--tail N]\n"
    "                               the workers' output (-f: until the job ends; --tail: the\n"
    "                               last N lines of each rank)\n"
    "  logs ID --steps              every recorded step and eval report, one JSON object a line\n"
    "  report ID [--out FILE.html]  a self-contained HTML page: plots, spec, plan (ID.html)\n"
    "  cancel ID [--reason TEXT]    SIGTERM the workers, SIGKILL after the grace period\n"
    "  plan JOB.toml [--set KEY=VALUE]...\n"
    "                               memory estimate per rank against the node's budget\n"
    "  node                         GPUs or CPU slots, what runs where, the metrics address\n"
    "  --server: host:port or unix:/path; default $ITHACA_SERVER, else the address in\n"
    "    $ITHACA_HOME/ithacad.addr (ITHACA_HOME default ~/.ithaca), else 127.0.0.1:50051\n"
    "  --token-file: bearer token for a daemon with --auth-token-file ($ITHACA_TOKEN_FILE)\n"
    "  --ca: CA certificate (PEM) to verify a daemon with --tls-cert; TLS ($ITHACA_CA)\n"
    "  --tls-server-name: the name the daemon's certificate carries, if not the host's\n"
    "  -o json: every field, one object per line (streams: one per event); --json is -o json\n"
    "  -o name (-q): job ids only (submit, list, status, cancel); -o wide: list's wide table\n"
    "  --set training.steps=10: set a key of the spec before it is sent (TOML value, else a\n"
    "    string); relative paths in a spec resolve on the daemon's host, against the spec's\n"
    "    directory when it exists there, else against ithacad's state directory\n";

namespace {

constexpr auto kResumeFor = std::chrono::seconds(60);

void PrintJson(const google::protobuf::Message& m) {
  std::printf("%s\n", ProtoJson(m).c_str());
  std::fflush(stdout);
}


int UsageError(const std::string& msg) {
  std::fprintf(stderr, "ithaca: %s (ithaca --help lists every command and flag)\n", msg.c_str());
  return 2;
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// A watch that breaks with these is opened again (a port-forward that blinks, a proxy dropping
// the connection, a daemon restarting); any other code is the daemon's answer.
bool Resumable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::INTERNAL ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::CANCELLED;
}

// The spec file's text and its absolute directory (relative paths in it resolve there).
bool ReadSpec(const std::string& path, std::string* text, std::string* dir) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "ithaca: %s: cannot read\n", path.c_str());
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) == nullptr) return false;
  std::string r = real;
  *dir = r.substr(0, r.rfind('/'));
  if (dir->empty()) *dir = "/";
  return true;
}

// One command's flags: each command accepts only those it names.
struct Flags {
  std::vector<std::string> positional;
  bool follow = false;
  bool no_logs = false;
  bool steps = false;
  std::string out;
  std::optional<int> rank;
  std::optional<int> tail;
  int limit = 0;
  std::vector<std::string> sets;
  std::vector<std::string> states;
  std::string reason;
};

// Parses args[1...] against `allowed` ("follow", "no-logs", "rank", "tail", "limit", "set",
// "state", "reason"); an error message, or "" on success.
std::string ParseFlags(const std::vector<std::string>& args, const std::set<std::string>& allowed,
                       Flags* f) {
  const std::string& cmd = args[0];
  for (size_t i = 1; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--") {
      for (++i; i < args.size(); ++i) f->positional.push_back(args[i]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      f->positional.push_back(a);
      continue;
    }
    std::optional<std::string> inline_value;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    std::string name = a == "-f" ? "follow" : a.substr(a.rfind("--", 0) == 0 ? 2 : 1);
    if (!allowed.count(name)) {
      return absl::StrCat(cmd, ": unknown flag ", a, allowed.empty() ? " (it takes none)" : "");
    }
    const bool takes_value = name != "follow" && name != "no-logs" && name != "steps";
    std::string value;
    if (takes_value) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::StrCat(cmd, ": ", a, " needs a value");
      }
    } else if (inline_value) {
      return absl::StrCat(cmd, ": ", a, " takes no value");
    }
    int n = 0;
    const bool number = absl::SimpleAtoi(value, &n) && n >= 0;
    if ((name == "rank" || name == "tail" || name == "limit") && !number) {
      return absl::StrCat(cmd, ": ", a, ": not a number >= 0: \"", value, "\"");
    }
    if (name == "follow") f->follow = true;
    if (name == "no-logs") f->no_logs = true;
    if (name == "rank") f->rank = n;
    if (name == "tail") f->tail = n;
    if (name == "limit") f->limit = n;
    if (name == "set") f->sets.push_back(value);
    if (name == "reason") f->reason = value;
    if (name == "steps") f->steps = true;
    if (name == "out") f->out = value;
    if (name == "state") {
      for (absl::string_view s : absl::StrSplit(value, ',', absl::SkipEmpty()))
        f->states.emplace_back(s);
    }
  }
  return "";
}

// The terminal's bottom line while a job is followed: the newest step's progress and, while
// nothing arrives (a 40-156 s step, a long model load), a spinner with the time it has taken.
// Log lines and state changes are printed above it. Without a terminal: plain lines, no
// spinner.
class LiveLine {
 public:
  explicit LiveLine(bool tty) : tty_(tty) {
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
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread ticker_;
  std::string progress_, phase_ = "waiting";
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_plain_;
  int frame_ = 0;
  bool closed_ = false;
};

// Which worker lines `--follow` shows: rank 0's, except its step lines (the progress line
// shows those), and other ranks' warnings and errors.
bool ShowLogLine(const v1::LogLine& l) {
  if (l.rank() == 0) return !absl::StartsWith(l.text(), "step ");
  const std::string lower = absl::AsciiStrToLower(l.text());
  return absl::StrContains(lower, "error") || absl::StrContains(lower, "warn") ||
         absl::StrContains(lower, "fatal");
}

int FollowJob(CliContext& c, const std::string& id, bool logs) {
  const bool json = c.output == Output::kJson;
  LiveLine live(!json && isatty(1));
  int64_t after = 0;  // the newest event seen: a resumed stream continues after it
  bool first = true;
  double avg_step = -1;  // moving average of step seconds, for the ETA
  v1::JobState final_state = v1::JOB_STATE_UNSPECIFIED;
  std::optional<std::chrono::steady_clock::time_point> give_up_at;
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
      give_up_at.reset();
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
    if (snapshot && IsTerminal(snapshot->state())) {
      // The job ended while the stream was down and its events are gone (the daemon
      // restarted): its stored state ends the story.
      final_state = snapshot->state();
      if (!json) print_state(final_state, snapshot->reason());
      break;
    }
    const std::string why =
        st.ok()
            ? "the stream ended before the job did"
            : absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                           ": ", st.error_message());
    const auto now = std::chrono::steady_clock::now();
    if (!give_up_at) {
      give_up_at = now + kResumeFor;
      live.Print(absl::StrCat("ithaca: the watch of ", id, " broke (", why,
                              "); resuming after event ", after),
                 stderr);
    }
    if (now >= *give_up_at) {
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

// Fills a SubmitJobRequest or a PlanJobRequest (the same spec fields) from the spec file and
// the --set overrides: 0, or the exit code after saying what is wrong.
template <typename Request>
int FillSpecRequest(const std::string& spec_path, const Flags& f, Request* req) {
  std::string text;
  if (!ReadSpec(spec_path, &text, req->mutable_base_dir())) return 2;
  absl::StatusOr<std::string> spec = ApplyOverrides(text, spec_path, f.sets);
  if (!spec.ok()) return UsageError(std::string(spec.status().message()));
  req->set_spec_toml(*spec);
  req->set_source(spec_path);
  return 0;
}

int SubmitCommand(CliContext& c, const std::string& spec_path, const Flags& f) {
  v1::SubmitJobRequest req;
  if (int rc = FillSpecRequest(spec_path, f, &req); rc != 0) return rc;
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->SubmitJob(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  if (c.output == Output::kJson) {
    PrintJson(resp.job());
  } else if (c.output == Output::kName) {
    std::printf("%s\n", resp.job().id().c_str());
  } else {
    std::printf("submitted %s (%s): %s\n", resp.job().id().c_str(),
                Printable(resp.job().name()).c_str(), StateName(resp.job().state()).c_str());
  }
  std::fflush(stdout);
  return f.follow ? FollowJob(c, resp.job().id(), !f.no_logs) : 0;
}

int StatusCommand(CliContext& c, const std::string& id) {
  v1::GetJobRequest req;
  req.set_id(id);
  v1::Job job;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->GetJob(&ctx, req, &job);
  if (!st.ok()) return RpcError(c, st);
  if (c.output == Output::kJson) {
    PrintJson(job);
  } else if (c.output == Output::kName) {
    std::printf("%s\n", job.id().c_str());
  } else {
    std::printf("%s", JobDetails(job).c_str());
  }
  return 0;
}

int ListCommand(CliContext& c, const Flags& f) {
  v1::ListJobsRequest req;
  for (const std::string& s : f.states) {
    v1::JobState state;
    if (!v1::JobState_Parse("JOB_STATE_" + absl::AsciiStrToUpper(s), &state) ||
        state == v1::JOB_STATE_UNSPECIFIED) {
      return UsageError(absl::StrCat("list: --state: unknown state \"", s,
                                     "\" (queued, starting, running, succeeded, failed, "
                                     "cancelling, cancelled)"));
    }
    req.add_states(state);
  }
  req.set_limit(f.limit);
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->ListJobs(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  if (c.output == Output::kJson) {
    PrintJson(resp);
  } else if (c.output == Output::kName) {
    for (const v1::Job& j : resp.jobs()) std::printf("%s\n", j.id().c_str());
  } else if (resp.jobs_size() == 0) {
    std::printf("no jobs\n");
  } else {
    std::printf("%s", JobTable({resp.jobs().begin(), resp.jobs().end()}, c.output == Output::kWide,
                               absl::Now())
                          .c_str());
  }
  return 0;
}

// Streams ReadLogs; `skip` lines of each rank are dropped first (shown already by --tail).
int ReadLogs(CliContext& c, const std::string& id, bool follow, std::optional<int> rank,
             std::map<int, int64_t> skip, const std::function<void(const v1::LogLine&)>& emit) {
  v1::ReadLogsRequest req;
  req.set_id(id);
  req.set_follow(follow);
  if (rank) req.set_rank(*rank);
  grpc::ClientContext ctx;
  auto reader = c.stub->ReadLogs(&ctx, req);
  v1::LogLine line;
  while (reader->Read(&line)) {
    if (skip[line.rank()] > 0) {
      --skip[line.rank()];
      continue;
    }
    emit(line);
  }
  grpc::Status st = reader->Finish();
  return st.ok() ? 0 : RpcError(c, st);
}

int LogsCommand(CliContext& c, const std::string& id, const Flags& f) {
  auto print = [&](const v1::LogLine& line) {
    if (c.output == Output::kJson) {
      PrintJson(line);
    } else {
      std::printf("%s%s\n", f.rank ? "" : absl::StrCat("[rank ", line.rank(), "] ").c_str(),
                  Printable(line.text(), /*keep_newlines=*/true).c_str());
    }
  };
  int rc = 0;
  if (!f.tail) {
    rc = ReadLogs(c, id, f.follow, f.rank, {}, print);
  } else {
    // The daemon streams each rank's log from its start: keep the last N of each, then (-f)
    // follow from where that read ended.
    std::map<int, std::deque<v1::LogLine>> last;
    std::map<int, int64_t> seen;
    rc = ReadLogs(c, id, false, f.rank, {}, [&](const v1::LogLine& line) {
      std::deque<v1::LogLine>& q = last[line.rank()];
      q.push_back(line);
      if (static_cast<int>(q.size()) > *f.tail) q.pop_front();
      ++seen[line.rank()];
    });
    for (const auto& [rank, lines] : last) {
      for (const v1::LogLine& line : lines) print(line);
    }
    if (rc == 0 && f.follow) rc = ReadLogs(c, id, true, f.rank, seen, print);
  }
  std::fflush(stdout);
  return rc;
}

int CancelCommand(CliContext& c, const std::string& id, const Flags& f) {
  v1::CancelJobRequest req;
  req.set_id(id);
  req.set_reason(f.reason);
  v1::Job job;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->CancelJob(&ctx, req, &job);
  if (!st.ok()) return RpcError(c, st);
  if (c.output == Output::kJson) {
    PrintJson(job);
  } else if (c.output == Output::kName) {
    std::printf("%s\n", job.id().c_str());
  } else {
    std::printf("%s: %s\n", job.id().c_str(), StateName(job.state()).c_str());
  }
  return 0;
}

int PlanCommand(CliContext& c, const std::string& spec_path, const Flags& f) {
  v1::PlanJobRequest req;
  if (int rc = FillSpecRequest(spec_path, f, &req); rc != 0) return rc;
  v1::PlanJobResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->PlanJob(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  if (c.output == Output::kJson) {
    PrintJson(resp);
  } else {
    std::printf("%s", PlanText(resp).c_str());
  }
  return resp.plan().fits() ? 0 : 1;
}

int NodeCommand(CliContext& c) {
  v1::GetNodeRequest req;
  v1::NodeInfo node;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->GetNode(&ctx, req, &node);
  if (!st.ok()) return RpcError(c, st);
  if (c.output == Output::kJson) {
    PrintJson(node);
  } else {
    std::printf("%s", NodeText(node).c_str());
  }
  return 0;
}

}  // namespace

std::string DefaultServer() {
  if (const char* env = std::getenv("ITHACA_SERVER"); env && *env) return env;
  std::string home;
  if (const char* h = std::getenv("ITHACA_HOME"); h && *h) {
    home = h;
  } else if (const char* u = std::getenv("HOME"); u && *u) {
    home = absl::StrCat(u, "/.ithaca");
  }
  if (!home.empty()) {
    std::ifstream in(home + "/ithacad.addr");
    std::string line;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, "grpc=")) {
        return std::string(absl::StripAsciiWhitespace(line.substr(5)));
      }
    }
  }
  return "127.0.0.1:50051";
}

bool ParseOutput(const std::string& name, Output* out) {
  static const std::map<std::string, Output> kNames = {
      {"json", Output::kJson}, {"name", Output::kName}, {"wide", Output::kWide}};
  auto it = kNames.find(name);
  if (it == kNames.end()) return false;
  *out = it->second;
  return true;
}

int RunCommand(CliContext& c, const std::vector<std::string>& args) {
  struct Verb {
    std::set<std::string> flags;
    size_t positional;
    bool names;  // -o name makes sense
  };
  static const std::map<std::string, Verb> kVerbs = {
      {"submit", {{"follow", "set", "no-logs"}, 1, true}},
      {"watch", {{"no-logs"}, 1, false}},
      {"status", {{}, 1, true}},
      {"list", {{"state", "limit"}, 0, true}},
      {"logs", {{"follow", "rank", "tail", "steps"}, 1, false}},
      {"report", {{"out"}, 1, false}},
      {"cancel", {{"reason"}, 1, true}},
      {"plan", {{"set"}, 1, false}},
      {"node", {{}, 0, false}},
  };
  if (args.empty()) return UsageError("a command is needed");
  const std::string& cmd = args[0];
  auto verb = kVerbs.find(cmd);
  if (verb == kVerbs.end()) return UsageError(absl::StrCat("unknown command \"", cmd, "\""));
  Flags f;
  if (std::string err = ParseFlags(args, verb->second.flags, &f); !err.empty()) {
    return UsageError(err);
  }
  if (f.positional.size() != verb->second.positional) {
    return UsageError(absl::StrCat(cmd, ": takes ", verb->second.positional,
                                   verb->second.positional == 1 ? " argument" : " arguments",
                                   ", got ", f.positional.size()));
  }
  if (c.output == Output::kName && !verb->second.names) {
    return UsageError(absl::StrCat(cmd, ": -o name is not supported (json, wide)"));
  }
  const std::string arg = f.positional.empty() ? "" : f.positional[0];
  if (cmd == "submit") return SubmitCommand(c, arg, f);
  if (cmd == "watch") return FollowJob(c, arg, !f.no_logs);
  if (cmd == "status") return StatusCommand(c, arg);
  if (cmd == "list") return ListCommand(c, f);
  if (cmd == "logs" && f.steps) {
    if (f.follow || f.rank || f.tail)
      return UsageError("logs: --steps takes no -f, --rank or --tail");
    return StepsCommand(c, arg);
  }
  if (cmd == "logs") return LogsCommand(c, arg, f);
  if (cmd == "report") return ReportCommand(c, arg, f.out);
  if (cmd == "cancel") return CancelCommand(c, arg, f);
  if (cmd == "plan") return PlanCommand(c, arg, f);
  return NodeCommand(c);
}

}  // namespace ithaca
