#include "client/commands.h"

#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/format.h"
#include "google/protobuf/util/json_util.h"

namespace ithaca {
namespace {

void PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  std::printf("%s\n", out.c_str());
  std::fflush(stdout);
}

int RpcError(const CliContext& c, const grpc::Status& st) {
  std::fprintf(
      stderr, "ithaca: %s: %s\n", c.server.c_str(),
      absl::StrCat(st.error_code() == grpc::StatusCode::UNAVAILABLE
                       ? "UNAVAILABLE (is ithacad running?)"
                       : absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                   ": ", st.error_message())
          .c_str());
  return 2;
}

// The spec file's text, its absolute directory (relative paths in it resolve there), its name.
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

}  // namespace

int SubmitCommand(CliContext& c, const std::string& spec_path, bool follow) {
  v1::SubmitJobRequest req;
  if (!ReadSpec(spec_path, req.mutable_spec_toml(), req.mutable_base_dir())) return 2;
  req.set_source(spec_path);
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->SubmitJob(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  if (c.json) {
    PrintJson(resp.job());
  } else {
    std::printf("submitted %s (%s): %s\n", resp.job().id().c_str(), resp.job().name().c_str(),
                StateName(resp.job().state()).c_str());
    std::fflush(stdout);
  }
  return follow ? FollowJob(c, resp.job().id()) : 0;
}

int FollowJob(CliContext& c, const std::string& id) {
  grpc::ClientContext ctx;
  v1::WatchJobRequest req;
  req.set_id(id);
  auto reader = c.stub->WatchJob(&ctx, req);
  const bool tty = isatty(1);
  auto last_print = std::chrono::steady_clock::now() - std::chrono::hours(1);
  double avg_step = -1;  // moving average of step seconds, for the ETA
  bool progress_open = false;
  v1::JobState final_state = v1::JOB_STATE_UNSPECIFIED;
  std::string final_reason;
  v1::JobEvent e;
  while (reader->Read(&e)) {
    if (c.json) PrintJson(e);
    if (e.has_step() && e.step().rank() == 0) {
      const v1::StepReport& r = e.step();
      avg_step = avg_step < 0 ? r.seconds() : 0.9 * avg_step + 0.1 * r.seconds();
      const auto now = std::chrono::steady_clock::now();
      const bool last = r.step() == r.total_steps();
      if (!c.json && (tty || last || now - last_print > std::chrono::seconds(1))) {
        const std::string line = ProgressLine(r, avg_step * (r.total_steps() - r.step()));
        if (tty) {
          std::printf("\r\033[K%s", line.c_str());
          progress_open = true;
        } else {
          std::printf("%s\n", line.c_str());
        }
        std::fflush(stdout);
        last_print = now;
      }
    }
    if (e.has_eval() && !c.json) {
      if (progress_open) std::printf("\n");
      progress_open = false;
      std::printf("%s\n", EvalLine(e.eval()).c_str());
      std::fflush(stdout);
    }
    if (e.has_state()) {
      final_state = e.state().to();
      final_reason = e.state().reason();
      if (!c.json && e.state().from() != v1::JOB_STATE_UNSPECIFIED) {
        if (progress_open) std::printf("\n");
        progress_open = false;
        std::printf("%s: %s%s\n", id.c_str(), StateName(e.state().to()).c_str(),
                    e.state().reason().empty() ? "" : (" (" + e.state().reason() + ")").c_str());
        std::fflush(stdout);
      }
    }
  }
  if (progress_open) std::printf("\n");
  grpc::Status st = reader->Finish();
  if (!st.ok()) return RpcError(c, st);
  const bool terminal = final_state == v1::JOB_STATE_SUCCEEDED ||
                        final_state == v1::JOB_STATE_FAILED ||
                        final_state == v1::JOB_STATE_CANCELLED;
  if (!terminal) {
    std::fprintf(stderr, "ithaca: the watch of %s ended while it was %s (daemon stopping?)\n",
                 id.c_str(), StateName(final_state).c_str());
    return 2;
  }
  return final_state == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

int StatusCommand(CliContext& c, const std::string& id) {
  v1::GetJobRequest req;
  req.set_id(id);
  v1::Job job;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->GetJob(&ctx, req, &job);
  if (!st.ok()) return RpcError(c, st);
  if (c.json) {
    PrintJson(job);
  } else {
    std::printf("%s", JobDetails(job).c_str());
  }
  return 0;
}

int ListCommand(CliContext& c) {
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->ListJobs(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  if (c.json) {
    PrintJson(resp);
    return 0;
  }
  if (resp.jobs_size() == 0) std::printf("no jobs\n");
  for (const v1::Job& j : resp.jobs()) std::printf("%s\n", JobLine(j).c_str());
  return 0;
}

int LogsCommand(CliContext& c, const std::string& id, bool follow, std::optional<int> rank) {
  v1::ReadLogsRequest req;
  req.set_id(id);
  req.set_follow(follow);
  if (rank) req.set_rank(*rank);
  grpc::ClientContext ctx;
  auto reader = c.stub->ReadLogs(&ctx, req);
  v1::LogLine line;
  while (reader->Read(&line)) {
    if (c.json) {
      PrintJson(line);
    } else {
      std::printf("%s%s\n", rank ? "" : absl::StrCat("[rank ", line.rank(), "] ").c_str(),
                  Printable(line.text(), /*keep_newlines=*/true).c_str());
    }
  }
  std::fflush(stdout);
  grpc::Status st = reader->Finish();
  return st.ok() ? 0 : RpcError(c, st);
}

int CancelCommand(CliContext& c, const std::string& id) {
  v1::CancelJobRequest req;
  req.set_id(id);
  v1::Job job;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->CancelJob(&ctx, req, &job);
  if (!st.ok()) return RpcError(c, st);
  if (c.json) {
    PrintJson(job);
  } else {
    std::printf("%s: %s\n", job.id().c_str(), StateName(job.state()).c_str());
  }
  return 0;
}

int PlanCommand(CliContext& c, const std::string& spec_path) {
  v1::PlanJobRequest req;
  if (!ReadSpec(spec_path, req.mutable_spec_toml(), req.mutable_base_dir())) return 2;
  req.set_source(spec_path);
  v1::PlanJobResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->PlanJob(&ctx, req, &resp);
  if (!st.ok()) return RpcError(c, st);
  if (c.json) {
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
  if (c.json) {
    PrintJson(node);
  } else {
    std::printf("%s", NodeText(node).c_str());
  }
  return 0;
}

}  // namespace ithaca
