// JobSpec <-> TOML. Every key is read through one table of (key, reader) per section so that
// unknown keys, wrong types and bad values all report the same "file: section.key: ..." prefix.
#include "engine/spec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "engine/core/file_util.h"

// Parse errors come back in a toml::parse_result instead of being thrown: the rest of the engine
// reports errors through absl::Status, and a throw across the parser would be easy to miss.
#define TOML_EXCEPTIONS 0
// toml++ 3.3 asserts on some malformed documents that its parser then refuses with an error
// anyway ("[#": a key expected after '['; found by fuzz/job_spec_fuzzer.cc). Without NDEBUG
// (Bazel's default build) the assert aborts the process, and ithacad parses specs sent by clients:
// the asserts are off here, as in a release build, and the error comes back as a status.
#define TOML_ASSERT(expr) static_assert(true)
#include <toml++/toml.h>

namespace ithaca {

namespace {

// toml++ 3.3 (Debian's) reaches __builtin_unreachable(), undefined behaviour, when it asks
// whether some non-ASCII characters are whitespace: any non-ASCII character outside a string or
// comment, and the first character after a line-ending backslash in a """ string (upstream
// issues marzer/tomlplusplus#190 and #295, fixed after 3.3). TOML allows non-ASCII characters
// only inside strings and comments, so this scan refuses the rest before toml++ sees them; it
// follows just enough of TOML's string syntax to know where strings and comments are.
absl::Status CheckNonAsciiPlacement(const std::string& text, const std::string& source) {
  enum { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral } state = kCode;
  int line = 1;
  size_t line_start = 0;
  auto error = [&](size_t i, const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", line, ":", i - line_start + 1, ": invalid TOML: ", what));
  };
  auto starts = [&](size_t i, const char* delim) { return text.compare(i, 3, delim) == 0; };
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  // A quote opens a string here only right after `bare.key =` at the start of a line: a string
  // value. Elsewhere toml++ may see a quoted key, or a quote inside a malformed token (`0x"`)
  // that it reads up to a whitespace check. After such a quote, or an array or inline table
  // (which may span lines), where toml++'s strings and comments are is not followed here: the
  // rest of the text counts as outside strings and comments. A job spec has only bare keys and
  // scalar values, so this refuses nothing valid.
  auto bare_key_char = [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  };
  bool seen_equals = false, value_start = false, lost = false;
  int key_chars = 0;  // bare key characters before the line's first '='; -1: something else
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      if (state == kComment || state == kBasic || state == kLiteral) state = kCode;
      if (state == kCode) {  // a new line, not inside a string
        seen_equals = value_start = false;
        key_chars = 0;
      }
      continue;
    }
    // Escapes are ASCII; toml++ asks whether the character after a backslash is whitespace.
    if ((state == kBasic || state == kMultiBasic) && c == '\\' && i + 1 < text.size() &&
        static_cast<unsigned char>(text[i + 1]) >= 0x80) {
      return error(i + 1, "a non-ASCII character after a backslash (not an escape)");
    }
    switch (state) {
      case kCode:
        if (static_cast<unsigned char>(c) >= 0x80) {
          return error(i, "a non-ASCII character outside a string or comment");
        }
        if (blank(c) || lost) break;
        if (c == '#') {
          state = kComment;
        } else if ((c == '"' || c == '\'') && value_start) {
          const bool multi = starts(i, c == '"' ? "\"\"\"" : "'''");
          state = c == '"' ? (multi ? kMultiBasic : kBasic) : (multi ? kMultiLiteral : kLiteral);
          if (multi) i += 2;
        } else if (c == '"' || c == '\'' || (seen_equals && (c == '[' || c == '{'))) {
          lost = true;
          break;
        }
        value_start = c == '=' && !seen_equals && key_chars > 0;
        if (!seen_equals && c != '=' && key_chars >= 0)
          key_chars = bare_key_char(c) ? key_chars + 1 : -1;
        seen_equals = seen_equals || c == '=';
        break;
      case kComment:
        break;
      case kBasic:
        if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') {
          ++i;  // an escaped character
        } else if (c == '"') {
          state = kCode;
        }
        break;
      case kLiteral:
        if (c == '\'') state = kCode;
        break;
      case kMultiBasic:
        if (c == '\\' && i + 1 < text.size() && (blank(text[i + 1]) || text[i + 1] == '\n')) {
          // A line-ending backslash: toml++ skips the whitespace after it, asking of each
          // character whether it is whitespace, whether or not a newline follows.
          size_t j = i + 1;
          while (j < text.size() && (blank(text[j]) || text[j] == '\n')) {
            if (text[j] == '\n') {
              ++line;
              line_start = j + 1;
            }
            ++j;
          }
          if (j < text.size() && static_cast<unsigned char>(text[j]) >= 0x80) {
            return error(j, "a non-ASCII character right after a line-ending backslash");
          }
          i = j - 1;
        } else if (c == '\\') {
          ++i;  // an escaped character
        } else if (starts(i, "\"\"\"")) {
          i += 2;
          // Up to two more quotes belong to the string: """a""""" is "a" followed by "".
          for (int k = 0; k < 2 && i + 1 < text.size() && text[i + 1] == '"'; ++k) ++i;
          state = kCode;
        }
        break;
      case kMultiLiteral:
        if (starts(i, "'''")) {
          i += 2;
          for (int k = 0; k < 2 && i + 1 < text.size() && text[i + 1] == '\''; ++k) ++i;
          state = kCode;
        }
        break;
    }
  }
  return absl::OkStatus();
}

const char* TypeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "nothing";
  }
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Names other trainers use for our keys; a typo of one of these still finds the right key.
const std::vector<std::pair<std::string, std::string>>& Aliases() {
  static const auto* aliases = new std::vector<std::pair<std::string, std::string>>{
      {"learning_rate", "lr"},
      {"max_steps", "steps"},
      {"warmup", "warmup_steps"},
      {"batch_size", "micro_batch"},
      {"max_grad_norm", "grad_clip"},
      {"gradient_accumulation_steps", "grad_accum"},
      {"context_length", "seq_len"},
      {"seq_length", "seq_len"},
      {"precision", "dtype"},
      {"world_size", "world"},
      {"keep_last", "keep"},
      {"save_every", "every"},
      {"activation_checkpointing", "checkpoint"}};
  return *aliases;
}

// The valid key closest to `bad`, or "" when none is close enough to be a likely typo.
std::string Suggest(const std::string& bad, const std::vector<std::string>& valid) {
  std::vector<std::pair<std::string, std::string>> candidates;  // (spelling, valid key)
  for (const std::string& v : valid) candidates.emplace_back(v, v);
  for (const auto& [alias, key] : Aliases()) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) {
      candidates.emplace_back(alias, key);
    }
  }
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& [spelling, key] : candidates) {
    size_t d = EditDistance(bad, spelling);
    size_t limit = spelling.size() <= 4 ? 1 : 2;
    bool prefix = bad.size() >= 3 && spelling.compare(0, bad.size(), bad) == 0;
    if ((d <= limit || prefix) && d < best_d) {
      best = key;
      best_d = d;
    }
  }
  return best;
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // The shortest %g form that reads back to the same double, so round trips are exact.
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";  // TOML floats need '.' or 'e'
  return s;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

class SpecReader {
 public:
  using ReadFn = std::function<absl::Status(const toml::node&, const std::string& path)>;
  struct Key {
    const char* name;
    ReadFn read;
  };

  explicit SpecReader(std::string source) : source_(std::move(source)) {}

  // "job.toml: training.lr: must be > 0, got -1 (line 7)".
  absl::Status Error(const std::string& path, const std::string& msg,
                     const std::string& hint = "") const {
    std::string where;
    auto it = lines_.find(path);
    if (it != lines_.end()) where = absl::StrCat(" (line ", it->second, ")");
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", path, ": ", msg, where, hint));
  }
  absl::Status Require(bool ok, const std::string& path, const std::string& msg) const {
    return ok ? absl::OkStatus() : Error(path, msg);
  }
  bool Given(const std::string& path) const { return lines_.count(path) > 0; }

  absl::Status WrongType(const toml::node& n, const std::string& path, const char* want) const {
    return Error(path, absl::StrCat("must be ", want, ", got ", TypeName(n.type())));
  }

  ReadFn Str(std::string* out) {
    return [this, out](const toml::node& n, const std::string& path) {
      if (!n.is_string()) return WrongType(n, path, "a string");
      *out = n.as_string()->get();
      return absl::OkStatus();
    };
  }
  ReadFn Int(int64_t* out) {
    return [this, out](const toml::node& n, const std::string& path) {
      if (!n.is_integer()) return WrongType(n, path, "an integer");
      *out = n.as_integer()->get();
      return absl::OkStatus();
    };
  }
  ReadFn Float(double* out) {  // integers are accepted where floats are expected
    return [this, out](const toml::node& n, const std::string& path) {
      if (n.is_integer()) {
        *out = static_cast<double>(n.as_integer()->get());
      } else if (n.is_floating_point()) {
        *out = n.as_floating_point()->get();
      } else {
        return WrongType(n, path, "a number");
      }
      return Require(std::isfinite(*out), path, "must be a finite number");
    };
  }
  ReadFn Bool(bool* out) {
    return [this, out](const toml::node& n, const std::string& path) {
      if (!n.is_boolean()) return WrongType(n, path, "a boolean");
      *out = n.as_boolean()->get();
      return absl::OkStatus();
    };
  }
  // An integer >= 1, or "auto" (stored as 0).
  ReadFn IntOrAuto(int64_t* out) {
    return [this, out](const toml::node& n, const std::string& path) {
      if (n.is_string()) {
        RETURN_IF_ERROR(Require(n.as_string()->get() == "auto", path,
                                absl::StrCat("must be an integer >= 1 or \"auto\", got \"",
                                             n.as_string()->get(), "\"")));
        *out = 0;
        return absl::OkStatus();
      }
      if (!n.is_integer()) return WrongType(n, path, "an integer >= 1 or \"auto\"");
      *out = n.as_integer()->get();
      return Require(*out >= 1, path,
                     absl::StrCat("must be an integer >= 1 or \"auto\", got ", *out));
    };
  }
  // TOML integers are signed 64-bit, so seeds above INT64_MAX are written as decimal strings.
  ReadFn Seed(uint64_t* out) {
    return [this, out](const toml::node& n, const std::string& path) {
      if (n.is_string()) {
        return Require(absl::SimpleAtoi(n.as_string()->get(), out), path,
                       "must be an integer >= 0 (or a decimal string for seeds >= 2^63)");
      }
      if (!n.is_integer()) return WrongType(n, path, "an integer");
      int64_t v = n.as_integer()->get();
      RETURN_IF_ERROR(Require(v >= 0, path, absl::StrCat("must be >= 0, got ", v)));
      *out = static_cast<uint64_t>(v);
      return absl::OkStatus();
    };
  }
  ReadFn Policy(CheckpointPolicy* out) {
    return [this, out](const toml::node& n, const std::string& path) {
      if (!n.is_string()) return WrongType(n, path, "a string");
      const std::string& v = n.as_string()->get();
      for (CheckpointPolicy p :
           {CheckpointPolicy::kNone, CheckpointPolicy::kFull, CheckpointPolicy::kAttentionAware}) {
        if (v == CheckpointPolicyName(p)) {
          *out = p;
          return absl::OkStatus();
        }
      }
      return Error(
          path, absl::StrCat("must be \"none\", \"full\" or \"attention-aware\", got \"", v, "\""));
    };
  }

  // Reads every entry of `table` (whose dotted path is `prefix`, "" at the top) with `keys`;
  // tables in `sections` are walked recursively. Anything else is unknown.
  absl::Status Walk(const toml::table& table, const std::string& prefix,
                    const std::vector<Key>& keys,
                    const std::vector<std::pair<std::string, std::vector<Key>>>& sections) {
    for (auto&& [k, node] : table) {
      std::string name(k.str());
      std::string path = prefix.empty() ? name : absl::StrCat(prefix, ".", name);
      lines_[path] = static_cast<int>(k.source().begin.line);
      auto key =
          std::find_if(keys.begin(), keys.end(), [&](const Key& x) { return name == x.name; });
      if (key != keys.end()) {
        RETURN_IF_ERROR(key->read(node, path));
        continue;
      }
      auto section = std::find_if(sections.begin(), sections.end(),
                                  [&](const auto& s) { return name == s.first; });
      if (section != sections.end()) {
        if (!node.is_table()) return WrongType(node, path, "a table");
        RETURN_IF_ERROR(Walk(*node.as_table(), path, section->second, {}));
        continue;
      }
      std::vector<std::string> valid;
      for (const Key& x : keys) valid.push_back(x.name);
      for (const auto& s : sections) valid.push_back(s.first);
      std::string best = Suggest(name, valid);
      std::string hint;
      if (!best.empty()) {
        hint = absl::StrCat("; did you mean ", prefix.empty() ? "" : prefix + ".", best, "?");
      }
      return Error(path, node.is_table() && prefix.empty() ? "unknown section" : "unknown key",
                   hint);
    }
    return absl::OkStatus();
  }

 private:
  std::string source_;
  std::map<std::string, int> lines_;  // dotted path -> line, for every key present in the file
};

absl::Status Validate(const JobSpec& s, const SpecReader& r) {
  auto one_of = [&](const std::string& v, const std::vector<std::string>& allowed,
                    const char* path) {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return absl::OkStatus();
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) {
      absl::StrAppend(&list,
                      i == 0                    ? ""
                      : i + 1 == allowed.size() ? " or "
                                                : ", ",
                      "\"", allowed[i], "\"");
    }
    return r.Error(path, absl::StrCat("must be ", list, ", got \"", v, "\""));
  };
  RETURN_IF_ERROR(r.Require(!s.name.empty(), "name", "must not be empty"));
  // Every value is range-checked here, before any arithmetic or planning uses it: admission runs
  // inside the daemon, and a spec from any client must not be able to exhaust it.
  RETURN_IF_ERROR(
      r.Require(s.name.size() <= kMaxJobNameBytes, "name",
                absl::StrCat("must be at most ", kMaxJobNameBytes, " bytes, got ", s.name.size())));
  RETURN_IF_ERROR(r.Require(
      std::none_of(s.name.begin(), s.name.end(),
                   [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }),
      "name", "must not contain control characters"));
  RETURN_IF_ERROR(one_of(s.backend, {"cpu", "cuda"}, "backend"));
  RETURN_IF_ERROR(one_of(s.model.preset, {"tiny", "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b"},
                         "model.preset"));
  RETURN_IF_ERROR(one_of(s.model.dtype, {"auto", "bf16", "f32"}, "model.dtype"));

  // An evaluation-only job (training.steps = 0) trains on nothing: data.path is optional there.
  const bool eval_only = s.training.steps == 0;
  RETURN_IF_ERROR(r.Require(!s.data.path.empty() || eval_only, "data.path",
                            "required: the token file to train on (see ithaca-tokenize)"));
  RETURN_IF_ERROR(
      r.Require(s.data.seq_len >= 2 && s.data.seq_len <= kMaxSeqLen, "data.seq_len",
                absl::StrCat("must be in [2, ", kMaxSeqLen, "], got ", s.data.seq_len)));
  RETURN_IF_ERROR(
      r.Require(s.data.micro_batch >= 1 && s.data.micro_batch <= kMaxMicroBatch, "data.micro_batch",
                absl::StrCat("must be in [1, ", kMaxMicroBatch, "], got ", s.data.micro_batch)));

  const JobSpec::Training& t = s.training;
  RETURN_IF_ERROR(
      r.Require(t.steps >= 0, "training.steps", absl::StrCat("must be >= 0, got ", t.steps)));
  RETURN_IF_ERROR(r.Require(!eval_only || !s.eval.path.empty(), "training.steps",
                            "0 (an evaluation-only job) needs an [eval] section with eval.path"));
  // An evaluation-only job never takes an optimizer step, so its learning rates do not matter.
  RETURN_IF_ERROR(r.Require(
      t.lr > 0 || (eval_only && t.lr == 0), "training.lr",
      absl::StrCat("must be > 0, got ", t.lr,
                   t.lr == 0 ? " (0 only for an evaluation-only job, training.steps = 0)" : "")));
  RETURN_IF_ERROR(
      r.Require(t.min_lr >= 0, "training.min_lr", absl::StrCat("must be >= 0, got ", t.min_lr)));
  // Says so when min_lr is the default: lowering only lr is the likely way to get here.
  RETURN_IF_ERROR(r.Require(
      t.min_lr <= t.lr || eval_only, "training.min_lr",
      absl::StrCat("must be <= training.lr (", t.lr, "), got ", t.min_lr,
                   r.Given("training.min_lr") ? "" : " (the default; set training.min_lr)")));
  RETURN_IF_ERROR(r.Require(t.warmup_steps >= 0, "training.warmup_steps",
                            absl::StrCat("must be >= 0, got ", t.warmup_steps)));
  RETURN_IF_ERROR(r.Require(t.weight_decay >= 0, "training.weight_decay",
                            absl::StrCat("must be >= 0, got ", t.weight_decay)));
  RETURN_IF_ERROR(r.Require(t.beta1 >= 0 && t.beta1 < 1, "training.beta1",
                            absl::StrCat("must be in [0, 1), got ", t.beta1)));
  RETURN_IF_ERROR(r.Require(t.beta2 >= 0 && t.beta2 < 1, "training.beta2",
                            absl::StrCat("must be in [0, 1), got ", t.beta2)));
  RETURN_IF_ERROR(r.Require(t.eps > 0, "training.eps", absl::StrCat("must be > 0, got ", t.eps)));
  RETURN_IF_ERROR(r.Require(t.grad_clip >= 0, "training.grad_clip",
                            absl::StrCat("must be >= 0 (0 disables clipping), got ", t.grad_clip)));
  RETURN_IF_ERROR(
      r.Require(t.grad_accum >= 1 && t.grad_accum <= kMaxGradAccum, "training.grad_accum",
                absl::StrCat("must be in [1, ", kMaxGradAccum, "], got ", t.grad_accum)));
  // A step's samples are held in host memory together; each factor is bounded above, so the
  // product cannot overflow.
  const int64_t step_tokens = s.data.micro_batch * t.grad_accum * (s.data.seq_len + 1);
  RETURN_IF_ERROR(r.Require(
      step_tokens <= kMaxStepTokens, "training.grad_accum",
      absl::StrCat("data.micro_batch x training.grad_accum x (data.seq_len + 1) = ", step_tokens,
                   " tokens per step; at most ", kMaxStepTokens, " are allowed")));

  const JobSpec::Parallel& p = s.parallel;
  RETURN_IF_ERROR(r.Require(p.world >= 1 && p.world <= kMaxWorld, "parallel.world",
                            absl::StrCat("must be in [1, ", kMaxWorld, "], got ", p.world)));
  RETURN_IF_ERROR(r.Require(p.sp >= 1, "parallel.sp", absl::StrCat("must be >= 1, got ", p.sp)));
  RETURN_IF_ERROR(
      r.Require(p.world % p.sp == 0, "parallel.sp",
                absl::StrCat("must divide parallel.world (", p.world, "), got ", p.sp)));

  const JobSpec::Memory& m = s.memory;
  RETURN_IF_ERROR(r.Require(m.offload_keep_last >= 0, "memory.offload_keep_last",
                            absl::StrCat("must be >= 0, got ", m.offload_keep_last)));
  RETURN_IF_ERROR(r.Require(m.checkpoint_interval >= 1, "memory.checkpoint_interval",
                            absl::StrCat("must be >= 1, got ", m.checkpoint_interval)));
  RETURN_IF_ERROR(
      r.Require(m.gpu_budget_gib >= 0, "memory.gpu_budget_gib",
                absl::StrCat("must be >= 0 (0: from the node), got ", m.gpu_budget_gib)));
  RETURN_IF_ERROR(
      r.Require(m.host_budget_gib >= 0, "memory.host_budget_gib",
                absl::StrCat("must be >= 0 (0: from the node), got ", m.host_budget_gib)));

  RETURN_IF_ERROR(r.Require(s.checkpoint.every >= 0, "checkpoint.every",
                            absl::StrCat("must be >= 0, got ", s.checkpoint.every)));
  RETURN_IF_ERROR(r.Require(s.checkpoint.keep >= 1, "checkpoint.keep",
                            absl::StrCat("must be >= 1, got ", s.checkpoint.keep)));
  const std::string& ex = s.checkpoint.export_dtype;
  RETURN_IF_ERROR(r.Require(ex.empty() || ex == "bf16" || ex == "f32", "checkpoint.export",
                            absl::StrCat("must be \"bf16\" or \"f32\", got \"", ex, "\"")));
  RETURN_IF_ERROR(
      r.Require(ex.empty() || !s.checkpoint.dir.empty(), "checkpoint.export",
                "needs checkpoint.dir (the export is written to checkpoint.dir/export)"));
  RETURN_IF_ERROR(r.Require(ex.empty() || !eval_only, "checkpoint.export",
                            "an evaluation-only job (training.steps = 0) writes no checkpoint to "
                            "export"));
  RETURN_IF_ERROR(r.Require(!r.Given("eval") || !s.eval.path.empty(), "eval.path",
                            "required in an [eval] section: the held-out token file(s) (see "
                            "ithaca-tokenize --val-fraction)"));
  RETURN_IF_ERROR(
      r.Require(s.eval.every >= 0, "eval.every",
                absl::StrCat("must be >= 0 (0: only after the last step), got ", s.eval.every)));
  RETURN_IF_ERROR(
      r.Require(s.eval.batches >= 1 && s.eval.batches <= kMaxEvalBatches, "eval.batches",
                absl::StrCat("must be in [1, ", kMaxEvalBatches, "], got ", s.eval.batches)));
  RETURN_IF_ERROR(r.Require(s.retry.max_restarts >= 0 && s.retry.max_restarts <= 1000,
                            "retry.max_restarts",
                            absl::StrCat("must be in 0..1000, got ", s.retry.max_restarts)));
  RETURN_IF_ERROR(r.Require(
      s.retry.backoff_seconds >= 0 && s.retry.backoff_seconds <= 86400, "retry.backoff_seconds",
      absl::StrCat("must be in 0..86400, got ", FormatDouble(s.retry.backoff_seconds))));
  RETURN_IF_ERROR(r.Require(s.metrics.log_every >= 1, "metrics.log_every",
                            absl::StrCat("must be >= 1, got ", s.metrics.log_every)));
  return absl::OkStatus();
}

std::string ResolvePath(const std::string& dir, const std::string& p) {
  if (p.empty() || p[0] == '/' || dir.empty()) return p;
  return dir == "/" ? "/" + p : absl::StrCat(dir, "/", p);
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& toml_text, const std::string& source) {
  RETURN_IF_ERROR(CheckNonAsciiPlacement(toml_text, source));
  toml::parse_result parsed = toml::parse(toml_text, source);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.source().begin.line, ":", e.source().begin.column,
                     ": invalid TOML: ", std::string(e.description())));
  }
  JobSpec s;
  SpecReader r(source);
  using Key = SpecReader::Key;
  std::vector<Key> top = {{"name", r.Str(&s.name)}, {"backend", r.Str(&s.backend)}};
  std::vector<std::pair<std::string, std::vector<Key>>> sections = {
      {"model",
       {{"preset", r.Str(&s.model.preset)},
        {"config", r.Str(&s.model.config)},
        {"weights", r.Str(&s.model.weights)},
        {"dtype", r.Str(&s.model.dtype)}}},
      {"data",
       {{"path", r.Str(&s.data.path)},
        {"seq_len", r.Int(&s.data.seq_len)},
        {"micro_batch", r.Int(&s.data.micro_batch)},
        {"shuffle", r.Bool(&s.data.shuffle)},
        {"document_mask", r.Bool(&s.data.document_mask)},
        {"loss_mask", r.Bool(&s.data.loss_mask)}}},
      {"training",
       {{"steps", r.Int(&s.training.steps)},
        {"lr", r.Float(&s.training.lr)},
        {"min_lr", r.Float(&s.training.min_lr)},
        {"warmup_steps", r.Int(&s.training.warmup_steps)},
        {"weight_decay", r.Float(&s.training.weight_decay)},
        {"beta1", r.Float(&s.training.beta1)},
        {"beta2", r.Float(&s.training.beta2)},
        {"eps", r.Float(&s.training.eps)},
        {"grad_clip", r.Float(&s.training.grad_clip)},
        {"grad_accum", r.Int(&s.training.grad_accum)},
        {"seed", r.Seed(&s.training.seed)}}},
      {"parallel",
       {{"world", r.Int(&s.parallel.world)},
        {"sp", r.Int(&s.parallel.sp)},
        {"fsdp", r.Bool(&s.parallel.fsdp)}}},
      {"memory",
       {{"checkpoint", r.Policy(&s.memory.checkpoint)},
        {"offload", r.Bool(&s.memory.offload)},
        {"offload_keep_last", r.Int(&s.memory.offload_keep_last)},
        {"prefetch", r.Bool(&s.memory.prefetch)},
        {"checkpoint_interval", r.Int(&s.memory.checkpoint_interval)},
        {"head_chunk", r.IntOrAuto(&s.memory.head_chunk)},
        {"tile_tokens", r.IntOrAuto(&s.memory.tile_tokens)},
        {"overlap", r.Bool(&s.memory.overlap)},
        {"gpu_budget_gib", r.Float(&s.memory.gpu_budget_gib)},
        {"host_budget_gib", r.Float(&s.memory.host_budget_gib)}}},
      {"checkpoint",
       {{"dir", r.Str(&s.checkpoint.dir)},
        {"every", r.Int(&s.checkpoint.every)},
        {"resume", r.Bool(&s.checkpoint.resume)},
        {"keep", r.Int(&s.checkpoint.keep)},
        {"export", r.Str(&s.checkpoint.export_dtype)}}},
      {"metrics", {{"log_every", r.Int(&s.metrics.log_every)}}},
      {"retry",
       {{"max_restarts", r.Int(&s.retry.max_restarts)},
        {"backoff_seconds", r.Float(&s.retry.backoff_seconds)}}},
      {"eval",
       {{"path", r.Str(&s.eval.path)},
        {"every", r.Int(&s.eval.every)},
        {"batches", r.Int(&s.eval.batches)}}},
  };
  RETURN_IF_ERROR(r.Walk(parsed.table(), "", top, sections));
  RETURN_IF_ERROR(Validate(s, r));
  return s;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  ASSIGN_OR_RETURN(JobSpec s, ParseJobSpec(text, path));
  // Paths in a spec are relative to the spec, so a job directory can be moved as a whole.
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "" : slash == 0 ? "/" : path.substr(0, slash);
  for (std::string* p :
       {&s.data.path, &s.model.config, &s.model.weights, &s.checkpoint.dir, &s.eval.path}) {
    *p = ResolvePath(dir, *p);
  }
  return s;
}

std::string JobSpecToToml(const JobSpec& s) {
  auto auto_or = [](int64_t v) { return v == 0 ? std::string("\"auto\"") : absl::StrCat(v); };
  auto b = [](bool v) { return v ? "true" : "false"; };
  const JobSpec::Training& t = s.training;
  std::string seed = t.seed <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                         ? absl::StrCat(t.seed)
                         : Quote(absl::StrCat(t.seed));
  std::string out;
  absl::StrAppend(&out, "name = ", Quote(s.name), "\nbackend = ", Quote(s.backend), "\n");
  absl::StrAppend(&out, "\n[model]\npreset = ", Quote(s.model.preset),
                  "\nconfig = ", Quote(s.model.config), "\nweights = ", Quote(s.model.weights),
                  "\ndtype = ", Quote(s.model.dtype), "\n");
  absl::StrAppend(&out, "\n[data]\npath = ", Quote(s.data.path), "\nseq_len = ", s.data.seq_len,
                  "\nmicro_batch = ", s.data.micro_batch, "\nshuffle = ", b(s.data.shuffle),
                  "\ndocument_mask = ", b(s.data.document_mask),
                  "\nloss_mask = ", b(s.data.loss_mask), "\n");
  absl::StrAppend(&out, "\n[training]\nsteps = ", t.steps, "\nlr = ", FormatDouble(t.lr),
                  "\nmin_lr = ", FormatDouble(t.min_lr), "\nwarmup_steps = ", t.warmup_steps,
                  "\nweight_decay = ", FormatDouble(t.weight_decay),
                  "\nbeta1 = ", FormatDouble(t.beta1), "\nbeta2 = ", FormatDouble(t.beta2),
                  "\neps = ", FormatDouble(t.eps), "\ngrad_clip = ", FormatDouble(t.grad_clip),
                  "\ngrad_accum = ", t.grad_accum, "\nseed = ", seed, "\n");
  absl::StrAppend(&out, "\n[parallel]\nworld = ", s.parallel.world, "\nsp = ", s.parallel.sp,
                  "\nfsdp = ", b(s.parallel.fsdp), "\n");
  const JobSpec::Memory& m = s.memory;
  absl::StrAppend(&out, "\n[memory]\ncheckpoint = ", Quote(CheckpointPolicyName(m.checkpoint)),
                  "\noffload = ", b(m.offload), "\noffload_keep_last = ", m.offload_keep_last,
                  "\nprefetch = ", b(m.prefetch), "\ncheckpoint_interval = ", m.checkpoint_interval,
                  "\nhead_chunk = ", auto_or(m.head_chunk),
                  "\ntile_tokens = ", auto_or(m.tile_tokens), "\noverlap = ", b(m.overlap),
                  "\ngpu_budget_gib = ", FormatDouble(m.gpu_budget_gib),
                  "\nhost_budget_gib = ", FormatDouble(m.host_budget_gib), "\n");
  absl::StrAppend(&out, "\n[checkpoint]\ndir = ", Quote(s.checkpoint.dir),
                  "\nevery = ", s.checkpoint.every, "\nresume = ", b(s.checkpoint.resume),
                  "\nkeep = ", s.checkpoint.keep, "\nexport = ", Quote(s.checkpoint.export_dtype),
                  "\n");
  absl::StrAppend(&out, "\n[metrics]\nlog_every = ", s.metrics.log_every, "\n");
  absl::StrAppend(&out, "\n[retry]\nmax_restarts = ", s.retry.max_restarts,
                  "\nbackoff_seconds = ", FormatDouble(s.retry.backoff_seconds), "\n");
  if (!s.eval.path.empty()) {  // no section: no evaluation
    absl::StrAppend(&out, "\n[eval]\npath = ", Quote(s.eval.path), "\nevery = ", s.eval.every,
                    "\nbatches = ", s.eval.batches, "\n");
  }
  return out;
}

absl::Status CheckResolved(const JobSpec& spec) {
  const JobSpec::Memory& m = spec.memory;
  const char* left = spec.model.dtype == "auto" ? "model.dtype"
                     : m.head_chunk == 0        ? "memory.head_chunk"
                     : m.tile_tokens == 0       ? "memory.tile_tokens"
                     : m.gpu_budget_gib == 0    ? "memory.gpu_budget_gib"
                     : m.host_budget_gib == 0   ? "memory.host_budget_gib"
                                                : nullptr;
  if (left == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(left, ": still \"auto\"; the job must be resolved first (ResolveJob)"));
}

absl::StatusOr<LlamaConfig> ResolveModelConfig(const JobSpec& spec) {
  if (!spec.model.config.empty()) return LoadConfigJson(spec.model.config);
  return PresetConfig(spec.model.preset);
}

}  // namespace ithaca
