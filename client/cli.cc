// The `ithaca` command line on CLI11: global flags (anywhere on the line), one subcommand with
// its own flags and help, `--version`, and `ithaca completion bash` made from the same
// definitions.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli.h"

#include <algorithm>
#include "client/commands.h"
#include "daemon_link/connection.h"
#include "client/report.h"

namespace ithaca {
namespace {

const char kStates[] = "queued starting running succeeded failed cancelling cancelled";

// Commands whose output -o name (job ids only) makes sense for.
const std::set<std::string> kNameCommands = {"submit", "status", "list",
                                             "cancel", "wait",   "delete"};

// What a value of the option or positional argument named `name` completes to in bash: a word
// list, "@files", "@jobs" (the daemon's job ids) or "" (nothing to offer).
std::string ValueKind(const std::string& name) {
  static const std::map<std::string, std::string> kKinds = {
      {"--output", "json name wide"},
      {"--state", kStates},
      {"shell", "bash"},
      {"--filename", "@files"},
      {"spec", "@files"},
      {"--out", "@files"},
      {"--token-file", "@files"},
      {"--ca", "@files"},
      {"id", "@jobs"},
      {"ids", "@jobs"},
      {"--after", "@jobs"},
  };
  auto it = kKinds.find(name);
  return it == kKinds.end() ? "" : it->second;
}

std::vector<std::string> OptionNames(const CLI::Option* o) {
  std::vector<std::string> names;
  for (const std::string& s : o->get_snames()) names.push_back("-" + s);
  for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
  return names;
}

std::string LongName(const CLI::Option* o) {
  return o->get_lnames().empty() ? o->get_name() : "--" + o->get_lnames()[0];
}

bool TakesValue(const CLI::Option* o) { return o->get_expected_max() > 0; }

// A bash `compgen` that offers `kind` (ValueKind) for the word being completed.
std::string Offer(const std::string& kind) {
  if (kind == "@files") return "COMPREPLY=($(compgen -f -- \"$cur\"))";
  if (kind == "@jobs") {
    return "COMPREPLY=($(compgen -W \"$(\"${COMP_WORDS[0]}\" \"${global[@]}\" -q list "
           "2>/dev/null)\" -- \"$cur\"))";
  }
  if (kind.empty()) return "COMPREPLY=()";
  return absl::StrCat("COMPREPLY=($(compgen -W \"", kind, "\" -- \"$cur\"))");
}

// Values CLI11 fills directly; Flags' optionals are set from them after parsing.
struct Parsed {
  ConnectionOptions connection;
  std::string output;
  bool json = false, quiet = false;
  int rank = 0, tail = 0;
  CLI::Option* rank_option = nullptr;
  CLI::Option* tail_option = nullptr;
  Flags f;
};

void Define(CLI::App& app, Parsed& p) {
  ConnectionOptions& connection = p.connection;
  std::string& output = p.output;
  bool& json = p.json;
  bool& quiet = p.quiet;
  Flags& f = p.f;
  app.set_version_flag("--version", absl::StrCat("ithaca ", kVersion, " (API ithaca.v1)"));
  app.fallthrough();  // global flags may also come after the command
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 success; 1 the job (or plan) did not succeed; 2 an RPC or usage error.\n"
      "Relative paths in a spec resolve on the daemon's host, against the spec's directory when "
      "it exists there, else against ithacad's state directory.");
  app.add_option("--server", connection.server,
                 "host:port or unix:/path; default $ITHACA_SERVER, else the address in "
                 "$ITHACA_HOME/ithacad.addr (ITHACA_HOME default ~/.ithaca), else "
                 "127.0.0.1:50051");
  app.add_option("--token-file", connection.token_file,
                 "bearer token for a daemon with --auth-token-file ($ITHACA_TOKEN_FILE)");
  app.add_option("--ca", connection.ca_file,
                 "CA certificate (PEM) to verify a daemon with --tls-cert; TLS ($ITHACA_CA)");
  app.add_option("--tls-server-name", connection.tls_server_name,
                 "the name the daemon's certificate carries, if not the host's");
  app.add_option("-o,--output", output,
                 "json: every field, one object per line (streams: one per event); name: job "
                 "ids only (submit, list, status, cancel, delete, wait); wide: list's wide table")
      ->check(CLI::IsMember({"json", "name", "wide"}));
  app.add_flag("--json", json, "the same as -o json");
  app.add_flag("-q,--quiet", quiet, "the same as -o name");

  auto spec_args = [&f](CLI::App* sub) {
    CLI::Option* positional =
        sub->add_option("spec", f.spec, "the job's spec (TOML); - reads it from stdin");
    CLI::Option* file =
        sub->add_option("-f,--filename", f.spec, "the spec file, as kubectl's -f; - is stdin");
    positional->excludes(file);
    sub->add_option("--set", f.sets,
                    "KEY=VALUE: set a key of the spec before it is sent (a TOML value, else a "
                    "string), e.g. --set training.steps=10; repeatable")
        ->allow_extra_args(false)
        ->type_name("KEY=VALUE");
  };
  CLI::App* submit = app.add_subcommand("submit", "queue a job");
  spec_args(submit);
  submit->add_flag("--follow", f.follow,
                   "show its progress, log lines and a spinner during long steps; exit 0 iff it "
                   "succeeds");
  submit->add_flag("--no-logs", f.no_logs, "with --follow: progress and states only");
  submit
      ->add_option("--after", f.after,
                   "ID: start only when job ID has succeeded; cancelled if it fails or is "
                   "cancelled (Slurm's afterok)")
      ->type_name("ID");

  CLI::App* watch = app.add_subcommand(
      "watch",
      "follow a job (as submit --follow); exits 0 iff it succeeds; a dropped stream "
      "is resumed where it stopped");
  watch->add_option("id", f.ids, "the job")->required()->expected(1);
  watch->add_flag("--no-logs", f.no_logs, "progress and states only");

  CLI::App* wait = app.add_subcommand(
      "wait", "wait until the jobs end, printing each one's end; exits 0 iff all succeeded");
  wait->add_option("ids", f.ids, "the jobs")->required()->expected(1, 1 << 20);
  wait->add_option("--timeout", f.timeout_s, "give up after SECONDS (exit 1); 0: no limit")
      ->check(CLI::NonNegativeNumber)
      ->type_name("SECONDS");

  CLI::App* status =
      app.add_subcommand("status", "state, reason, last step, history, memory per tier");
  status->add_option("id", f.ids, "the job")->required()->expected(1);

  CLI::App* list = app.add_subcommand("list", "jobs, newest first");
  list->add_option("--state", f.states, absl::StrCat("only these states: ", kStates))
      ->delimiter(',')
      ->allow_extra_args(false)
      ->type_name("S[,S]");
  list->add_option("--limit", f.limit, "at most N jobs")->check(CLI::NonNegativeNumber);

  CLI::App* logs = app.add_subcommand("logs", "the workers' output");
  logs->add_option("id", f.ids, "the job")->required()->expected(1);
  CLI::Option* follow = logs->add_flag("-f,--follow", f.follow, "until the job ends");
  CLI::Option* rank = p.rank_option =
      logs->add_option("--rank", p.rank, "only this rank's lines")->check(CLI::NonNegativeNumber);
  CLI::Option* tail = p.tail_option =
      logs->add_option("--tail", p.tail, "the last N lines of each rank")
          ->check(CLI::NonNegativeNumber);
  logs->add_flag("--steps", f.steps,
                 "every recorded step and eval report instead, one JSON object a line")
      ->excludes(follow)
      ->excludes(rank)
      ->excludes(tail);

  CLI::App* report =
      app.add_subcommand("report", "a self-contained HTML page: plots, spec, plan (ID.html)");
  report->add_option("id", f.ids, "the job")->required()->expected(1);
  report->add_option("--out", f.out, "where to write it (default ID.html)");

  CLI::App* cancel =
      app.add_subcommand("cancel", "SIGTERM each job's workers, SIGKILL after the grace period");
  cancel->add_option("ids", f.ids, "the jobs")->required()->expected(1, 1 << 20);
  cancel->add_option("--reason", f.reason, "recorded as the job's reason");

  CLI::App* del = app.add_subcommand(
      "delete", "forget ended jobs: their record, history and rank logs (not checkpoint.dir)");
  del->add_option("ids", f.ids, "the jobs")->required()->expected(1, 1 << 20);

  CLI::App* plan = app.add_subcommand("plan", "memory estimate per rank against the node's budget");
  spec_args(plan);
  CLI::Option* max_seq = plan->add_flag(
      "--max-seq-len", f.max_seq_len,
      "the longest data.seq_len that fits (bisection on the planner), with the head_chunk, "
      "tile_tokens and offload it turns on");
  plan->add_option("--hardware", f.hardware,
                   "plan for a node this daemon is not: h100x1, h100x8, h200x1, h200x8, or "
                   "gpus=N,gpu_gib=G,host_gib=H (a preset may be followed by such overrides)")
      ->type_name("NODE");
  plan->add_option("--then", f.then,
                   "SPEC: a later phase of a chain (repeatable, in order): each phase is planned "
                   "(with the same --set and --hardware) and the chain's whole run time printed")
      ->excludes(max_seq)
      ->allow_extra_args(false)
      ->type_name("SPEC");
  plan->add_option("--multiple-of", f.multiple_of, "with --max-seq-len: lengths tried (1024)")
      ->check(CLI::PositiveNumber)
      ->needs(max_seq)
      ->type_name("N");

  app.add_subcommand("node", "GPUs or CPU slots, what runs where, the metrics address");

  CLI::App* drain = app.add_subcommand(
      "drain", "pause scheduling; running jobs checkpoint, stop and are queued again");
  drain->add_flag("--undo", f.undo, "start the queue again (as kubectl uncordon)");
  // Whole seconds from 1 to a day: 0.5 would become the daemon's default, 1e12 overflow.
  drain
      ->add_option("--timeout", f.timeout_s,
                   "whole seconds to wait for the checkpoints, 1 to 86400 (default: the "
                   "daemon's 300)")
      ->check(CLI::Range(1.0, 86400.0))
      ->check(CLI::Validator(
          [](const std::string& v) {
            double d = 0;
            return absl::SimpleAtod(v, &d) && d == static_cast<double>(static_cast<int64_t>(d))
                       ? std::string()
                       : std::string("whole seconds");
          },
          "SECONDS"));

  CLI::App* completion = app.add_subcommand(
      "completion", "print a shell completion script: source <(ithaca completion bash)");
  completion->add_option("shell", f.out, "bash")->required()->check(CLI::IsMember({"bash"}));
}

// "ithaca: CMD: what (where to look)", as every usage error reads.
std::string Usage(const std::string& cmd, const std::string& what) {
  if (cmd.empty()) return absl::StrCat("ithaca: ", what, " (ithaca --help lists every command)");
  return absl::StrCat("ithaca: ", cmd, ": ", what, " (ithaca ", cmd,
                      " --help lists its flags, ithaca --help every command)");
}

// "; did you mean submit?" for a command a typo away (at most 2 edits), else "".
std::string ClosestCommand(const CLI::App& app, const std::string& word) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
        diagonal = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = 3;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    const size_t d = distance(word, sub->get_name());
    if (d < best_distance) {
      best_distance = d;
      best = sub->get_name();
    }
  }
  return best.empty() ? "" : absl::StrCat("; did you mean ", best, "?");
}

std::string UsageMessage(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  std::vector<const CLI::App*> parsed =
      app.get_subcommands([](const CLI::App* s) { return s->parsed(); });
  if (!parsed.empty()) return Usage(parsed[0]->get_name(), e.what());
  // No command was recognised: the first word that is neither a flag nor a flag's value is
  // the command the user meant.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.empty() || a[0] != '-') {
      return Usage("", absl::StrCat("unknown command \"", a, "\"", ClosestCommand(app, a)));
    }
    const CLI::Option* o = nullptr;
    try {
      o = app.get_option(a.substr(0, a.find('=')));
    } catch (const CLI::OptionNotFound&) {
    }
    if (o != nullptr && TakesValue(o) && a.find('=') == std::string::npos) ++i;
  }
  return Usage("", e.what());
}

}  // namespace

std::string BashCompletion() {
  CLI::App app{"ithaca", "ithaca"};
  Parsed p;
  Define(app, p);
  std::vector<std::string> global_words, global_valued, commands;
  std::string value_cases;
  std::set<std::string> cased;
  auto add_value_case = [&](const CLI::Option* o) {
    const std::vector<std::string> names = OptionNames(o);
    const std::string key = absl::StrJoin(names, "|");
    if (!TakesValue(o) || names.empty() || !cased.insert(key).second) return;
    absl::StrAppend(&value_cases, "    ", key, ") ", Offer(ValueKind(LongName(o))),
                    "; return ;;\n");
  };
  for (const CLI::Option* o : app.get_options()) {
    if (!o->nonpositional() || o == app.get_help_ptr()) continue;
    for (const std::string& n : OptionNames(o)) {
      global_words.push_back(n);
      if (TakesValue(o)) global_valued.push_back(n);
    }
    add_value_case(o);
  }
  std::string command_cases;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands.push_back(sub->get_name());
    std::vector<std::string> words = {"--help"};
    std::string positional;
    for (const CLI::Option* o : sub->get_options()) {
      if (!o->nonpositional()) {
        if (positional.empty()) positional = ValueKind(o->get_name());
        continue;
      }
      if (o == sub->get_help_ptr()) continue;
      for (const std::string& n : OptionNames(o)) words.push_back(n);
      add_value_case(o);
    }
    absl::StrAppend(&command_cases, "    ", sub->get_name(), ")\n      if [[ $cur == -* ]]; then ",
                    "COMPREPLY=($(compgen -W \"", absl::StrJoin(words, " "), " ",
                    absl::StrJoin(global_words, " "), "\" -- \"$cur\")); else ", Offer(positional),
                    "; fi ;;\n");
  }
  return absl::StrCat(
      "# bash completion for ithaca (ithaca completion bash), made from its command line.\n"
      "# Load it now: source <(ithaca completion bash); for every shell, write it to\n"
      "# ~/.local/share/bash-completion/completions/ithaca.\n"
      "_ithaca() {\n"
      "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
      "  local cmd=\"\" i\n"
      "  local -a global=()  # the connection flags given, for the job ids' `ithaca list`\n"
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    case \"${COMP_WORDS[i]}\" in\n"
      "      ",
      absl::StrJoin(global_valued, "|"),
      ") global+=(\"${COMP_WORDS[i]}\" \"${COMP_WORDS[i+1]}\"); ((i++)) ;;\n"
      "      -*) ;;\n"
      "      *) [[ -z $cmd ]] && cmd=\"${COMP_WORDS[i]}\" ;;\n"
      "    esac\n"
      "  done\n"
      "  case \"$prev\" in\n",
      value_cases,
      "  esac\n"
      "  case \"$cmd\" in\n"
      "    \"\") COMPREPLY=($(compgen -W \"",
      absl::StrJoin(commands, " "), " ", absl::StrJoin(global_words, " "),
      " --help\" -- \"$cur\")) ;;\n", command_cases,
      "  esac\n"
      "}\n"
      "complete -o default -F _ithaca ithaca\n");
}

int RunCli(int argc, char** argv) {
  CLI::App app{"ithaca: the command line for ithacad (docs/cli.md)", "ithaca"};
  Parsed p;
  Define(app, p);
  ConnectionOptions& connection = p.connection;
  Flags& f = p.f;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "%s\n", UsageMessage(app, e, argc, argv).c_str());
    return 2;
  }
  const CLI::App* sub = app.get_subcommands()[0];
  const std::string cmd = sub->get_name();
  if (cmd == "completion") {
    std::printf("%s", BashCompletion().c_str());
    return 0;
  }
  if (p.rank_option->count() > 0) f.rank = p.rank;
  if (p.tail_option->count() > 0) f.tail = p.tail;
  CliContext c;
  if (p.json) c.output = Output::kJson;
  if (p.quiet) c.output = Output::kName;
  if (!p.output.empty() && !ParseOutput(p.output, &c.output)) return 2;  // IsMember checked it
  if (c.output == Output::kName && !kNameCommands.count(cmd)) {
    std::fprintf(stderr, "%s\n", Usage(cmd, "-o name is not supported (json, wide)").c_str());
    return 2;
  }
  if ((cmd == "submit" || cmd == "plan") && f.spec.empty()) {
    const std::string what =
        absl::StrCat("a spec is needed: ithaca ", cmd, " JOB.toml, or -f - to read it from stdin");
    std::fprintf(stderr, "%s\n", Usage(cmd, what).c_str());
    return 2;
  }
  if (connection.server.empty()) connection.server = DefaultServer();
  ApplyConnectionEnvironment(&connection);
  c.server = connection.server;
  auto channel = Connect(connection);
  if (!channel.ok()) {
    std::fprintf(stderr, "ithaca: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  c.stub = v1::JobService::NewStub(*channel);
  const std::string id = f.ids.empty() ? "" : f.ids[0];
  if (cmd == "submit") return SubmitCommand(c, f);
  if (cmd == "watch") return WatchCommand(c, id, !f.no_logs);
  if (cmd == "wait") return WaitCommand(c, f);
  if (cmd == "status") return StatusCommand(c, id);
  if (cmd == "list") return ListCommand(c, f);
  if (cmd == "logs") return f.steps ? StepsCommand(c, id) : LogsCommand(c, id, f);
  if (cmd == "report") return ReportCommand(c, id, f.out);
  if (cmd == "cancel") return CancelCommand(c, f);
  if (cmd == "delete") return DeleteCommand(c, f);
  if (cmd == "plan") return f.max_seq_len ? MaxSeqLenCommand(c, f) : PlanCommand(c, f);
  if (cmd == "drain") return DrainCommand(c, f);
  return NodeCommand(c);
}

}  // namespace ithaca
