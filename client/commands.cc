#include "client/commands.h"

#include "daemon_link/connection.h"
#include "proto/version.h"

#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <sys/stat.h>
#include <cstring>
#include <cerrno>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/follow.h"
#include "client/format.h"
#include "client/max_seq_len.h"
#include "launch/layout.h"
#include "client/json.h"
#include "client/report.h"

namespace ithaca {

const char* const kVersion = kIthacaVersion;

namespace {

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "ithaca: %s (ithaca --help lists every command and flag)\n", msg.c_str());
  return 2;
}

// The spec file's text and its absolute directory (relative paths in it resolve there). "-" is
// stdin, whose relative paths resolve against the current directory.
bool ReadSpec(const std::string& path, std::string* text, std::string* dir) {
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    *text = ss.str();
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == nullptr) {
      std::fprintf(stderr, "ithaca: cannot read the current directory\n");
      return false;
    }
    *dir = cwd;
    return true;
  }
  std::ifstream in(path);
  if (!in) {
    // Say why: no such file, a permission, a directory.
    std::fprintf(stderr, "ithaca: %s: cannot read: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "ithaca: %s: is a directory, not a job spec\n", path.c_str());
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

// Fills a SubmitJobRequest or a PlanJobRequest (the same spec fields) from the spec file and
// the --set overrides, which ithacad applies (engine/spec/overrides.h): 0, or the exit code
// after saying what is wrong.
template <typename Request>
int FillSpecRequest(const Flags& f, Request* req) {
  std::string text;
  if (!ReadSpec(f.spec, &text, req->mutable_base_dir())) return 2;
  req->set_spec_toml(text);
  req->set_source(f.spec == "-" ? "<stdin>" : f.spec);
  for (const std::string& o : f.sets) req->add_overrides(o);
  return 0;
}

}  // namespace

int SubmitCommand(CliContext& c, const Flags& f) {
  v1::SubmitJobRequest req;
  if (int rc = FillSpecRequest(f, &req); rc != 0) return rc;
  req.set_after(f.after);
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->SubmitJob(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  for (const std::string& w : resp.job().warnings()) {
    std::fprintf(stderr, "warning: %s\n", Printable(w).c_str());
  }
  if (c.output == Output::kJson) {
    PrintJson(resp.job());
  } else if (c.output == Output::kName) {
    std::printf("%s\n", resp.job().id().c_str());
  } else {
    std::printf("submitted %s (%s): %s%s\n", resp.job().id().c_str(),
                Printable(resp.job().name()).c_str(), StateName(resp.job().state()).c_str(),
                resp.job().after().empty()
                    ? ""
                    : absl::StrCat(", after ", Printable(resp.job().after(), false, 64)).c_str());
  }
  std::fflush(stdout);
  return f.follow ? FollowJob(c, resp.job().id(), !f.no_logs) : 0;
}

int WatchCommand(CliContext& c, const std::string& id, bool logs) { return FollowJob(c, id, logs); }

int WaitCommand(CliContext& c, const Flags& f) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  std::set<std::string> pending(f.ids.begin(), f.ids.end());
  std::map<std::string, v1::Job> ended;
  auto backoff = std::chrono::milliseconds(100);
  while (!pending.empty()) {
    for (auto it = pending.begin(); it != pending.end();) {
      v1::GetJobRequest req;
      req.set_id(*it);
      v1::Job job;
      grpc::ClientContext ctx;
      grpc::Status st = c.stub->GetJob(&ctx, req, &job);
      if (!st.ok()) return RpcError(c, st);
      if (!IsTerminal(job.state())) {
        ++it;
        continue;
      }
      ended[*it] = job;
      if (c.output == Output::kJson) {
        PrintJson(job);
      } else if (c.output == Output::kName) {
        std::printf("%s\n", job.id().c_str());
      } else {
        std::printf("%s: %s%s\n", job.id().c_str(), StateName(job.state()).c_str(),
                    job.reason().empty() ? "" : (" (" + Printable(job.reason()) + ")").c_str());
      }
      std::fflush(stdout);
      it = pending.erase(it);
    }
    if (pending.empty()) break;
    if (f.timeout_s > 0 && std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "ithaca: wait: timed out after %g s; still running: %s\n", f.timeout_s,
                   absl::StrJoin(pending, " ").c_str());
      return 1;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  for (const auto& [id, job] : ended) {
    if (job.state() != v1::JOB_STATE_SUCCEEDED) return 1;
  }
  return 0;
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
  // The daemon answers a page at a time (at most 1000 jobs, 2 MiB): follow the pages until
  // --limit jobs (0: all of them).
  v1::ListJobsResponse resp;
  do {
    req.set_limit(f.limit > 0 ? f.limit - resp.jobs_size() : 0);
    v1::ListJobsResponse page;
    grpc::ClientContext ctx;
    grpc::Status st = c.stub->ListJobs(&ctx, req, &page);
    if (!st.ok()) return RpcError(c, st);
    for (v1::Job& j : *page.mutable_jobs()) *resp.add_jobs() = std::move(j);
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty() && (f.limit <= 0 || resp.jobs_size() < f.limit));
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

namespace {

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

}  // namespace

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

int CancelCommand(CliContext& c, const Flags& f) {
  int rc = 0;
  for (const std::string& id : f.ids) {
    v1::CancelJobRequest req;
    req.set_id(id);
    req.set_reason(f.reason);
    v1::Job job;
    grpc::ClientContext ctx;
    grpc::Status st = c.stub->CancelJob(&ctx, req, &job);
    if (!st.ok()) {
      rc = RpcError(c, st);
      continue;
    }
    if (c.output == Output::kJson) {
      PrintJson(job);
    } else if (c.output == Output::kName) {
      std::printf("%s\n", job.id().c_str());
    } else {
      std::printf("%s: %s\n", job.id().c_str(), StateName(job.state()).c_str());
    }
    std::fflush(stdout);
  }
  return rc;
}

int DeleteCommand(CliContext& c, const Flags& f) {
  int rc = 0;
  for (const std::string& id : f.ids) {
    v1::DeleteJobRequest req;
    req.set_id(id);
    v1::DeleteJobResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = c.stub->DeleteJob(&ctx, req, &resp);
    if (!st.ok()) {
      rc = RpcError(c, st);
      continue;
    }
    if (c.output == Output::kJson) {
      PrintJson(resp.job());
    } else if (c.output == Output::kName) {
      std::printf("%s\n", resp.job().id().c_str());
    } else {
      std::printf("%s: deleted (was %s)\n", resp.job().id().c_str(),
                  StateName(resp.job().state()).c_str());
    }
    std::fflush(stdout);
  }
  return rc;
}

// plan SPEC --then SPEC2 ...: every phase's plan, then the chain's whole run.
int PlanChainCommand(CliContext& c, const Flags& f) {
  std::vector<std::string> sources = {f.spec};
  sources.insert(sources.end(), f.then.begin(), f.then.end());
  std::vector<v1::PlanJobResponse> plans;
  for (const std::string& spec : sources) {
    Flags phase = f;
    phase.spec = spec;
    v1::PlanJobRequest req;
    if (int rc = FillSpecRequest(phase, &req); rc != 0) return rc;
    req.set_hardware(f.hardware);
    v1::PlanJobResponse& resp = plans.emplace_back();
    grpc::ClientContext ctx;
    grpc::Status st = c.stub->PlanJob(&ctx, req, &resp);
    if (!st.ok()) return RpcError(c, st);
  }
  bool fits = true;
  for (const v1::PlanJobResponse& p : plans) fits = fits && p.plan().fits();
  if (c.output == Output::kJson) {
    // {"phases": [PlanJobResponse, ...], "run_seconds": the predicted phases' sum}
    std::vector<std::string> phases;
    for (const v1::PlanJobResponse& p : plans) phases.push_back(ProtoJson(p));
    std::printf("{\"phases\":[%s],\"run_seconds\":%.17g}\n", absl::StrJoin(phases, ",").c_str(),
                ChainRunSeconds(plans));
  } else {
    for (const v1::PlanJobResponse& p : plans) std::printf("%s\n", PlanText(p).c_str());
    std::printf("%s", ChainPlanText(sources, plans).c_str());
  }
  std::fflush(stdout);
  return fits ? 0 : 1;
}

int PlanCommand(CliContext& c, const Flags& f) {
  if (!f.then.empty()) return PlanChainCommand(c, f);
  v1::PlanJobRequest req;
  if (int rc = FillSpecRequest(f, &req); rc != 0) return rc;
  req.set_hardware(f.hardware);
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

int MaxSeqLenCommand(CliContext& c, const Flags& f) {
  constexpr int64_t kMaxSeqLen = int64_t{1} << 27;  // data.seq_len's own bound
  const int64_t m = f.multiple_of;
  v1::PlanJobRequest base;
  if (int rc = FillSpecRequest(f, &base); rc != 0) return rc;
  base.set_hardware(f.hardware);
  const auto started = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  // The plan at seq_len n. Each length asks only whether it fits (the first plan found that
  // fits, without the fastest-plan search or a step-time prediction); the answer's plan is then
  // asked in full. A plan that runs past the daemon's bound (DEADLINE_EXCEEDED) is narrowed
  // below (client/max_seq_len.h); any other error ends the search.
  grpc::Status failed;
  v1::PlanJobResponse first;  // the shortest length's answer
  std::map<int64_t, v1::PlanJobResponse> fitting;
  auto plan_at = [&](int64_t n, v1::PlanJobResponse* resp, bool fit_only) -> grpc::Status {
    v1::PlanJobRequest req = base;
    req.set_fit_only(fit_only);
    req.add_overrides(absl::StrCat("data.seq_len=", n));  // after the user's: it wins
    grpc::ClientContext ctx;
    return c.stub->PlanJob(&ctx, req, resp);
  };
  auto ask = [&](int64_t n) -> absl::StatusOr<LengthVerdict> {
    v1::PlanJobResponse resp;
    grpc::Status st = plan_at(n, &resp, /*fit_only=*/true);
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Progress on stderr: each length tried, its verdict, the time so far.
      std::fprintf(stderr,
                   "  data.seq_len %lld: did not finish within the daemon's bound (%.1f s)\n",
                   static_cast<long long>(n), seconds());
      return LengthVerdict::kTimedOut;
    }
    if (!st.ok()) {
      failed = st;
      return absl::UnknownError("plan failed");
    }
    std::fprintf(stderr, "  data.seq_len %lld: %s (%.1f s)\n", static_cast<long long>(n),
                 resp.plan().fits() ? "fits" : "does not fit", seconds());
    if (n == m) first = resp;
    if (!resp.plan().fits()) return LengthVerdict::kDoesNotFit;
    fitting[n] = resp;
    return LengthVerdict::kFits;
  };
  MaxSeqLenSearch so_far;
  absl::StatusOr<MaxSeqLenSearch> found = FindMaxSeqLen(m, kMaxSeqLen, ask, &so_far);
  const MaxSeqLenSearch& s = found.ok() ? *found : so_far;
  // The longest length proven, whatever ended the search.
  auto proven_line = [&](const char* why) {
    std::vector<std::string> above;
    if (s.not_fitting > 0) above.push_back(absl::StrCat(s.not_fitting, " does not fit"));
    if (!s.timed_out.empty()) {
      above.push_back(absl::StrCat(*std::min_element(s.timed_out.begin(), s.timed_out.end()),
                                   " did not finish within the daemon's planning bound"));
    }
    if (above.empty()) above.push_back(why);
    return absl::StrFormat(
        "longest data.seq_len that fits: %lld (multiples of %lld; %s; %d plans)\n",
        static_cast<long long>(s.longest), static_cast<long long>(m), absl::StrJoin(above, "; "),
        s.asked);
  };
  if (!found.ok()) {
    if (s.longest > 0) std::printf("%s", proven_line("the search stopped").c_str());
    return RpcError(c, failed);
  }
  if (s.longest == 0) {
    if (!s.timed_out.empty()) {
      std::printf("data.seq_len = %lld: the plan did not finish within the daemon's bound\n",
                  static_cast<long long>(m));
      return 1;
    }
    std::printf("not even data.seq_len = %lld fits: %s\n", static_cast<long long>(m),
                first.plan().summary().c_str());
    return 1;
  }
  // The plan a job of that length gets: the fastest that fits, with its prediction. Past the
  // daemon's bound, the answer stands with the first plan found that fits.
  v1::PlanJobResponse best = fitting[s.longest];
  std::string note;
  grpc::Status full = plan_at(s.longest, &best, /*fit_only=*/false);
  if (full.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    best = fitting[s.longest];
    note =
        "(the full plan, the fastest settings and their predicted step, did not finish within "
        "the daemon's bound: below is the first plan found that fits)\n";
  } else if (!full.ok()) {
    std::printf("%s", proven_line("the most data.seq_len allows").c_str());
    return RpcError(c, full);
  }
  if (c.output == Output::kJson) {
    std::printf("{\"max_seq_len\":%lld,\"multiple_of\":%lld,\"full_plan\":%s,\"plan\":%s}\n",
                static_cast<long long>(s.longest), static_cast<long long>(m),
                note.empty() ? "true" : "false", ProtoJson(best).c_str());
    return 0;
  }
  std::printf("%s%s", proven_line("the most data.seq_len allows").c_str(), note.c_str());
  std::printf("%s", PlanText(best).c_str());
  return 0;
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

int DrainCommand(CliContext& c, const Flags& f) {
  v1::DrainRequest req;
  req.set_undo(f.undo);
  req.set_timeout_seconds(static_cast<int32_t>(f.timeout_s));
  v1::DrainResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->Drain(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  if (c.output == Output::kJson) {
    PrintJson(resp);
  } else if (f.undo) {
    std::printf("scheduling resumed: queued jobs start again\n");
  } else {
    std::printf(
        "scheduling paused: jobs are admitted and queued, none starts until "
        "`ithaca drain --undo` (or a daemon restart)\n");
    for (const std::string& id : resp.drained()) {
      std::printf(
          "%s drained: checkpointed, stopped and queued; it resumes from that "
          "checkpoint\n",
          id.c_str());
    }
    for (const std::string& id : resp.still_running()) {
      std::printf(
          "%s still running: it has no checkpoint.dir to resume from, or did not stop "
          "in time\n",
          id.c_str());
    }
  }
  return resp.still_running_size() > 0 ? 1 : 0;
}

std::string DefaultServer() {
  if (const char* env = std::getenv(kEnvServer); env && *env) return env;
  // The address file of a daemon serving the default state directory, as ithacad picks it.
  std::ifstream in(DaemonAddrFilePath(DefaultStateDir()));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "grpc=")) {
      return std::string(absl::StripAsciiWhitespace(line.substr(5)));
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

bool ShowLogLine(const v1::LogLine& l) {
  if (l.rank() == 0) {
    return !absl::StartsWith(l.text(), "step ") && !absl::StartsWith(l.text(), "eval step ");
  }
  const std::string lower = absl::AsciiStrToLower(l.text());
  return absl::StrContains(lower, "error") || absl::StrContains(lower, "warn") ||
         absl::StrContains(lower, "fatal");
}

}  // namespace ithaca
