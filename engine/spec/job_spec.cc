// JobSpec <-> TOML. Every key is one row of the key table (Keys() below): its dotted path, a
// codec made from the member it fills (how it is read, written back, and whether it is still
// "auto") and its documentation. Parsing, JobSpecToToml, CheckResolved and the reference in
// docs/spec.md all walk that one table, so unknown keys, wrong types and bad values all report
// the same "file: section.key: ..." prefix and no key can be written in one place and forgotten in
// another.
#include "engine/spec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/backend/attention_choice.h"
#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "engine/spec/toml_text.h"

namespace ithaca {

namespace {

// The [slurm] values go on #SBATCH lines of the batch script ithacad writes: a value with a
// space, a quote or a newline could add options of its own, so each key has its alphabet.
bool SlurmValueOk(const std::string& key, const std::string& v) {
  if (v.size() > 256) return false;
  if (key == "slurm.time_limit") {
    if (v.empty()) return true;
    // minutes | MM:SS | HH:MM:SS | D-HH | D-HH:MM | D-HH:MM:SS (sbatch --time)
    size_t dash = v.find('-');
    std::string days = dash == std::string::npos ? "" : v.substr(0, dash);
    std::string rest = dash == std::string::npos ? v : v.substr(dash + 1);
    std::vector<std::string> parts = absl::StrSplit(rest, ':');
    if (dash != std::string::npos && days.empty()) return false;
    for (char c : days) {
      if (c < '0' || c > '9') return false;
    }
    if (parts.size() > 3) return false;
    for (const std::string& p : parts) {
      if (p.empty() || p.size() > 6) return false;
      for (char c : p) {
        if (c < '0' || c > '9') return false;
      }
    }
    return true;
  }
  const std::string extra = key == "slurm.constraint" ? "_.,-&|!*()[]:" : "_.,-";
  for (char c : v) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && extra.find(c) == std::string::npos) return false;
  }
  return true;
}

std::string SlurmValueRule(const std::string& key) {
  if (key == "slurm.time_limit") {
    return " (sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)";
  }
  if (key == "slurm.constraint") {
    return " (letters, digits and _ . , - & | ! * ( ) [ ] :, at most 256)";
  }
  return " (letters, digits and _ . , -, at most 256)";
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

// Keys this spec format used to have, by their dotted path, and the key each is now. A new
// spec that uses one is refused with "did you mean NEW?" (Suggest, below); a spec stored by an
// older ithacad is read with the new names (UpgradeStoredSpec).
const std::vector<std::pair<std::string, std::string>>& RenamedKeys() {
  // memory.checkpoint said "checkpoint" for activation recompute while [checkpoint] is the saved
  // training state (docs/schedules.md, "Names").
  static const auto* renamed = new std::vector<std::pair<std::string, std::string>>{
      {"memory.checkpoint", "memory.recompute"},
      {"memory.checkpoint_interval", "memory.recompute_interval"}};
  return *renamed;
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
      {"activation_checkpointing", "recompute"},
      {"gradient_checkpointing", "recompute"}};
  return *aliases;
}

// The valid key of section `section` ("" at the top) closest to `bad`, or "" when none is close
// enough to be a likely typo. `valid` holds the section's keys by their last part.
std::string Suggest(const std::string& bad, const std::string& section,
                    const std::vector<std::string>& valid) {
  std::vector<std::pair<std::string, std::string>> candidates;  // (spelling, valid key)
  for (const std::string& v : valid) candidates.emplace_back(v, v);
  std::vector<std::pair<std::string, std::string>> aliases = Aliases();
  // A renamed key of this section is one more alias of its new name.
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const auto& [old_path, new_path] : RenamedKeys()) {
    if (absl::StartsWith(old_path, prefix) && absl::StartsWith(new_path, prefix)) {
      aliases.emplace_back(old_path.substr(prefix.size()), new_path.substr(prefix.size()));
    }
  }
  for (const auto& [alias, key] : aliases) {
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

// Where a key sits in the file, for error messages: "job.toml: training.lr: must be > 0, got -1
// (line 7)".
class SpecReader {
 public:
  explicit SpecReader(std::string source) : source_(std::move(source)) {}

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
  absl::Status WrongType(const toml::node& n, const std::string& path,
                         const std::string& want) const {
    return Error(path, absl::StrCat("must be ", want, ", got ", TypeName(n.type())));
  }
  bool Given(const std::string& path) const { return lines_.count(path) > 0; }
  void Saw(const std::string& path, int line) { lines_[path] = line; }

 private:
  std::string source_;
  std::map<std::string, int> lines_;  // dotted path -> line, for every key present in the file
};

// ---- Codecs: one per kind of value. `get` is FIELD(member): it returns a pointer to the member
// of a JobSpec, const or not.

struct Codec {
  std::string kind;  // what the value must be, as errors and docs say it: "an integer"
  std::function<absl::Status(const toml::node&, const std::string& path, const SpecReader&,
                             JobSpec&)>
      read;
  std::function<std::string(const JobSpec&)> write;  // the value as TOML text
  // Whether the value is still the "auto" that ResolveJob replaces; empty: never.
  std::function<bool(const JobSpec&)> unresolved;
};

#define FIELD(member) [](auto& spec) { return &spec.member; }

std::string QuotedList(const std::vector<std::string>& values) {
  std::string list;
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppend(&list,
                    i == 0                   ? ""
                    : i + 1 == values.size() ? " or "
                                             : ", ",
                    "\"", values[i], "\"");
  }
  return list;
}

// A string of at most kMaxSpecStringBytes; with `values`, one of them (or empty, with
// `or_empty`).
template <typename Get>
Codec Str(Get get, std::vector<std::string> values = {}, bool or_empty = false) {
  const std::string choices = QuotedList(values);
  std::string kind = values.empty() ? "a string" : choices;
  if (or_empty) absl::StrAppend(&kind, ", or empty");
  return {kind,
          [get, values, choices, or_empty](const toml::node& n, const std::string& path,
                                           const SpecReader& r, JobSpec& s) {
            if (!n.is_string()) return r.WrongType(n, path, "a string");
            const std::string& v = n.as_string()->get();
            RETURN_IF_ERROR(r.Require(
                v.size() <= kMaxSpecStringBytes, path,
                absl::StrCat("must be at most ", kMaxSpecStringBytes, " bytes, got ", v.size())));
            if (!values.empty() && !(or_empty && v.empty()) &&
                std::find(values.begin(), values.end(), v) == values.end()) {
              return r.Error(path,
                             absl::StrCat("must be ", choices, ", got \"", v.substr(0, 64), "\""));
            }
            *get(s) = v;
            return absl::OkStatus();
          },
          [get](const JobSpec& s) { return Quote(*get(s)); }};
}

// One of `values` where "auto" (the first) is left for ResolveJob to choose.
template <typename Get>
Codec StrOrAuto(Get get, std::vector<std::string> values) {
  Codec c = Str(get, std::move(values));
  c.unresolved = [get](const JobSpec& s) { return *get(s) == "auto"; };
  return c;
}

template <typename Get>
Codec Int(Get get) {
  return {"an integer",
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (!n.is_integer()) return r.WrongType(n, path, "an integer");
            *get(s) = n.as_integer()->get();
            return absl::OkStatus();
          },
          [get](const JobSpec& s) { return absl::StrCat(*get(s)); }};
}

// An integer >= 1, or "auto" (stored as 0) for ResolveJob to choose.
template <typename Get>
Codec IntOrAuto(Get get) {
  const std::string kind = "an integer >= 1 or \"auto\"";
  return {
      kind,
      [get, kind](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
        if (n.is_string()) {
          RETURN_IF_ERROR(r.Require(n.as_string()->get() == "auto", path,
                                    absl::StrCat("must be ", kind, ", got \"",
                                                 n.as_string()->get().substr(0, 64), "\"")));
          *get(s) = 0;
          return absl::OkStatus();
        }
        if (!n.is_integer()) return r.WrongType(n, path, kind);
        *get(s) = n.as_integer()->get();
        return r.Require(*get(s) >= 1, path, absl::StrCat("must be ", kind, ", got ", *get(s)));
      },
      [get](const JobSpec& s) {
        return *get(s) == 0 ? std::string("\"auto\"") : absl::StrCat(*get(s));
      },
      [get](const JobSpec& s) { return *get(s) == 0; }};
}

// An integer >= 0, or "all" (stored as -1).
template <typename Get>
Codec IntOrAll(Get get) {
  const std::string kind = "an integer >= 0 or \"all\"";
  return {
      kind,
      [get, kind](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
        if (n.is_string()) {
          RETURN_IF_ERROR(r.Require(n.as_string()->get() == "all", path,
                                    absl::StrCat("must be ", kind, ", got \"",
                                                 n.as_string()->get().substr(0, 64), "\"")));
          *get(s) = -1;
          return absl::OkStatus();
        }
        if (!n.is_integer()) return r.WrongType(n, path, kind);
        *get(s) = n.as_integer()->get();
        return r.Require(*get(s) >= 0, path, absl::StrCat("must be ", kind, ", got ", *get(s)));
      },
      [get](const JobSpec& s) {
        return *get(s) < 0 ? std::string("\"all\"") : absl::StrCat(*get(s));
      }};
}

// A finite number; integers are accepted where floats are expected.
template <typename Get>
Codec Float(Get get) {
  return {"a number",
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (n.is_integer()) {
              *get(s) = static_cast<double>(n.as_integer()->get());
            } else if (n.is_floating_point()) {
              *get(s) = n.as_floating_point()->get();
            } else {
              return r.WrongType(n, path, "a number");
            }
            return r.Require(std::isfinite(*get(s)), path, "must be a finite number");
          },
          [get](const JobSpec& s) { return FormatDouble(*get(s)); }};
}

// A number where 0 means "from the node", which ResolveJob replaces.
template <typename Get>
Codec FloatOrNode(Get get) {
  Codec c = Float(get);
  c.kind = "a number (0: from the node)";
  c.unresolved = [get](const JobSpec& s) { return *get(s) == 0; };
  return c;
}

// An array of finite numbers (integers accepted), at most kMaxDataSources of them.
template <typename Get>
Codec FloatList(Get get) {
  return {"an array of numbers",
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (!n.is_array()) return r.WrongType(n, path, "an array of numbers");
            const toml::array& a = *n.as_array();
            RETURN_IF_ERROR(
                r.Require(a.size() <= kMaxDataSources, path,
                          absl::StrCat("at most ", kMaxDataSources, " numbers, got ", a.size())));
            std::vector<double> v;
            for (const toml::node& e : a) {
              if (e.is_integer()) {
                v.push_back(static_cast<double>(e.as_integer()->get()));
              } else if (e.is_floating_point()) {
                v.push_back(e.as_floating_point()->get());
              } else {
                return r.WrongType(e, path, "an array of numbers");
              }
              RETURN_IF_ERROR(r.Require(std::isfinite(v.back()), path, "must be finite numbers"));
            }
            *get(s) = std::move(v);
            return absl::OkStatus();
          },
          [get](const JobSpec& s) {
            std::vector<std::string> parts;
            for (double d : *get(s)) parts.push_back(FormatDouble(d));
            return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
          }};
}

// An array of integers, at most kMaxDataSources of them.
template <typename Get>
Codec IntList(Get get) {
  return {"an array of integers",
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (!n.is_array()) return r.WrongType(n, path, "an array of integers");
            const toml::array& a = *n.as_array();
            RETURN_IF_ERROR(
                r.Require(a.size() <= kMaxDataSources, path,
                          absl::StrCat("at most ", kMaxDataSources, " integers, got ", a.size())));
            std::vector<int64_t> v;
            for (const toml::node& e : a) {
              if (!e.is_integer()) return r.WrongType(e, path, "an array of integers");
              v.push_back(e.as_integer()->get());
            }
            *get(s) = std::move(v);
            return absl::OkStatus();
          },
          [get](const JobSpec& s) { return absl::StrCat("[", absl::StrJoin(*get(s), ", "), "]"); }};
}

template <typename Get>
Codec Bool(Get get) {
  return {"a boolean",
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (!n.is_boolean()) return r.WrongType(n, path, "a boolean");
            *get(s) = n.as_boolean()->get();
            return absl::OkStatus();
          },
          [get](const JobSpec& s) { return std::string(*get(s) ? "true" : "false"); }};
}

// true | false | "auto" (for ResolveJob to choose).
template <typename Get>
Codec BoolOrAuto(Get get) {
  const std::string kind = "true, false or \"auto\"";
  return {
      kind,
      [get, kind](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
        if (n.is_boolean()) {
          *get(s) = n.as_boolean()->get() ? OffloadChoice::kOn : OffloadChoice::kOff;
          return absl::OkStatus();
        }
        if (!n.is_string()) return r.WrongType(n, path, kind);
        RETURN_IF_ERROR(r.Require(
            n.as_string()->get() == "auto", path,
            absl::StrCat("must be ", kind, ", got \"", n.as_string()->get().substr(0, 64), "\"")));
        *get(s) = OffloadChoice::kAuto;
        return absl::OkStatus();
      },
      [get](const JobSpec& s) {
        return std::string(*get(s) == OffloadChoice::kAuto ? "\"auto\""
                           : *get(s) == OffloadChoice::kOn ? "true"
                                                           : "false");
      },
      [get](const JobSpec& s) { return *get(s) == OffloadChoice::kAuto; }};
}

// TOML integers are signed 64-bit, so seeds above INT64_MAX are written as decimal strings.
template <typename Get>
Codec Seed(Get get) {
  return {"an integer >= 0 (a decimal string for seeds >= 2^63)",
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (n.is_string()) {
              return r.Require(absl::SimpleAtoi(n.as_string()->get(), get(s)), path,
                               "must be an integer >= 0 (or a decimal string for seeds >= 2^63)");
            }
            if (!n.is_integer()) return r.WrongType(n, path, "an integer");
            const int64_t v = n.as_integer()->get();
            RETURN_IF_ERROR(r.Require(v >= 0, path, absl::StrCat("must be >= 0, got ", v)));
            *get(s) = static_cast<uint64_t>(v);
            return absl::OkStatus();
          },
          [get](const JobSpec& s) {
            const uint64_t v = *get(s);
            return v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                       ? absl::StrCat(v)
                       : Quote(absl::StrCat(v));
          }};
}

// An enum spelled by its names.
template <typename Get, typename E>
Codec Enum(Get get, std::vector<std::pair<E, std::string>> names) {
  std::vector<std::string> spellings;
  for (const auto& [value, name] : names) spellings.push_back(name);
  const std::string kind = QuotedList(spellings);
  return {kind,
          [get, names, kind](const toml::node& n, const std::string& path, const SpecReader& r,
                             JobSpec& s) {
            if (!n.is_string()) return r.WrongType(n, path, "a string");
            const std::string& v = n.as_string()->get();
            for (const auto& [value, name] : names) {
              if (v == name) {
                *get(s) = value;
                return absl::OkStatus();
              }
            }
            return r.Error(path, absl::StrCat("must be ", kind, ", got \"", v.substr(0, 64), "\""));
          },
          [get, names](const JobSpec& s) {
            for (const auto& [value, name] : names) {
              if (*get(s) == value) return Quote(name);
            }
            return Quote("?");
          }};
}

// Enum with one value (`auto_value`) left for ResolveJob to choose.
template <typename Get, typename E>
Codec EnumOrAuto(Get get, std::vector<std::pair<E, std::string>> names, E auto_value) {
  Codec c = Enum(get, std::move(names));
  c.unresolved = [get, auto_value](const JobSpec& s) { return *get(s) == auto_value; };
  return c;
}

// ---- The key table.

struct Section {
  std::string name;  // "" for the top level
  std::string doc;
  // Whether JobSpecToToml writes the section; empty: always.
  std::function<bool(const JobSpec&)> written;
};

struct Key {
  std::string path;  // "data.seq_len"; a top-level key has no dot
  Codec codec;
  std::string doc;
  // Unset: always written back. Else whether this spec writes it: never for a key folded into
  // another at parsing (min_lr_ratio into min_lr), not for one another key overrides (a preset
  // beside model.config).
  std::function<bool(const JobSpec&)> written;
  // The section is everything before the last dot ("eval.passkey" for eval.passkey.lengths,
  // "model.rope" for model.rope.theta).
  std::string section() const {
    const size_t dot = path.rfind('.');
    return dot == std::string::npos ? "" : path.substr(0, dot);
  }
  std::string name() const { return path.substr(path.rfind('.') + 1); }
};

const std::vector<Section>& Sections() {
  static const auto* sections = new std::vector<Section>{
      {"", "The job.", {}},
      {"model", "The model: a preset, or a Hugging Face config.json and weights.", {}},
      {"model.rope",
       "The rotary embedding, overriding the model's config.json (or preset): how a phase of "
       "long-context training extends the model (docs/long_context.md). Unset keys keep the "
       "model's own; `scaling` replaces the model's scaling type and parameters (a parameter "
       "left unset takes transformers' default). Checkpoints record it, a resume with another "
       "RoPE is refused (start a new phase with `[init] from`), and the export's config.json "
       "writes it in the model's dialect. Written only when a key is set.",
       [](const JobSpec& s) { return s.model.rope.set(); }},
      {"init",
       "A weights-only start: only the weights are loaded, and the run starts at step 0 with a "
       "fresh optimizer, learning-rate schedule and data position (a new phase; a resume is "
       "`checkpoint.resume`). Written only when `from` is set.",
       [](const JobSpec& s) { return !s.init.from.empty(); }},
      {"data", "The training data: token files written by `ithaca-tokenize`.", {}},
      {"training",
       "The optimizer (AdamW) and the learning-rate schedule (warmup, then a decay).",
       {}},
      {"parallel", "Ranks, Ulysses context parallelism and FSDP.", {}},
      {"memory",
       "Memory techniques (docs/schedules.md). \"auto\" settings are chosen by the planner to "
       "fit the budgets.",
       {}},
      {"checkpoint", "Saved training state, resume, and the final Hugging Face export.", {}},
      {"metrics", "Step reports.", {}},
      {"eval",
       "Held-out loss, measured with no gradients. Optional: without the section the job never "
       "evaluates.",
       [](const JobSpec& s) { return !s.eval.path.empty() || !s.eval.passkey.lengths.empty(); }},
      {"eval.passkey",
       "Retrieval at length (the passkey test): prompts of filler text with a 5-digit key at a "
       "depth, built with the model's own tokenizer (its tokenizer.json, else byte-level) and "
       "scored teacher-forced under the job's parallel layout, at each `eval.every` and after "
       "the last step (docs/training.md). Optional; `eval.path` is then optional too.",
       [](const JobSpec& s) { return !s.eval.passkey.lengths.empty(); }},
      {"retry",
       "What ithacad does when the job fails in a way that need not repeat (a rank killed or "
       "crashed, a lost heartbeat; not a bad spec, a NaN loss or out of memory): it queues the "
       "job again and it resumes from its newest checkpoint (docs/jobs.md).",
       {}},
      {"slurm",
       "Where ithacad --cluster slurm runs the job: on `nodes` Slurm nodes, parallel.world / "
       "nodes ranks each (docs/jobs.md). The other keys override the daemon's --slurm-* flags. "
       "Written only when one is set.",
       [](const JobSpec& s) {
         return s.slurm.nodes != 1 || !s.slurm.partition.empty() || !s.slurm.account.empty() ||
                !s.slurm.time_limit.empty() || !s.slurm.constraint.empty() ||
                s.slurm.signal_grace != 0;
       }},
      {"kernels",
       "Which kernel runs each pass of attention on the CUDA backend (ignored on the CPU). "
       "\"auto\" is resolved at admission by the measured rule "
       "(engine/backend/attention_choice.cc), "
       "so the stored spec names the kernel that runs. A CPU job's spec is written without it.",
       [](const JobSpec& s) {
         return s.backend == "cuda" || s.kernels.attention_forward != "auto" ||
                s.kernels.attention_backward != "auto";
       }},
  };
  return *sections;
}

const std::vector<Key>& Keys() {
  static const auto* keys = new std::vector<Key>{
      {"name", Str(FIELD(name)), "The job's name, shown by `ithaca list` (at most 256 bytes)."},
      {"backend", Str(FIELD(backend), {"cpu", "cuda"}), "Where the ranks run."},

      {"model.preset", Str(FIELD(model.preset), PresetNames()),
       "A built-in model; `tiny` is the demo and test model.",
       [](const JobSpec& s) { return s.model.config.empty(); }},
      {"model.config", Str(FIELD(model.config)),
       "Path to a Hugging Face config.json; overrides `preset` when set."},
      {"model.weights", Str(FIELD(model.weights)),
       "Safetensors file, index or directory to start from; empty: random initialization."},
      {"model.dtype", StrOrAuto(FIELD(model.dtype), {"auto", "bf16", "f32"}),
       "Activation dtype; \"auto\" is the backend's own (bf16 on CUDA, f32 on the CPU)."},

      {"model.rope.theta", Float(FIELD(model.rope.theta)),
       "RoPE base (`rope_theta`); 0: the model's.",
       [](const JobSpec& s) { return s.model.rope.theta != 0; }},
      {"model.rope.scaling",
       Str(FIELD(model.rope.scaling), {"none", "linear", "llama3", "yarn"},
           /*or_empty=*/true),
       "The scaling type (`rope_scaling`'s `rope_type`), with its parameters below; \"none\": "
       "plain RoPE; empty: the model's type and parameters.",
       [](const JobSpec& s) { return !s.model.rope.scaling.empty(); }},
      {"model.rope.factor", Float(FIELD(model.rope.factor)),
       "linear, llama3, yarn: the context's scaling factor (required with them).",
       [](const JobSpec& s) { return s.model.rope.factor != 0; }},
      {"model.rope.low_freq_factor", Float(FIELD(model.rope.low_freq_factor)), "llama3; 0: 1.",
       [](const JobSpec& s) { return s.model.rope.low_freq_factor != 0; }},
      {"model.rope.high_freq_factor", Float(FIELD(model.rope.high_freq_factor)), "llama3; 0: 4.",
       [](const JobSpec& s) { return s.model.rope.high_freq_factor != 0; }},
      {"model.rope.beta_fast", Float(FIELD(model.rope.beta_fast)), "yarn; 0: 32.",
       [](const JobSpec& s) { return s.model.rope.beta_fast != 0; }},
      {"model.rope.beta_slow", Float(FIELD(model.rope.beta_slow)), "yarn; 0: 1.",
       [](const JobSpec& s) { return s.model.rope.beta_slow != 0; }},
      {"model.rope.attention_factor", Float(FIELD(model.rope.attention_factor)),
       "yarn: what rotated q and k are multiplied by; 0: 0.1 ln(factor) + 1.",
       [](const JobSpec& s) { return s.model.rope.attention_factor != 0; }},
      {"model.rope.original_max_position_embeddings",
       Int(FIELD(model.rope.original_max_position_embeddings)),
       "llama3, yarn: the context the model was trained at before scaling; 0: the model's "
       "(its scaling's, else its max_position_embeddings).",
       [](const JobSpec& s) { return s.model.rope.original_max_position_embeddings != 0; }},

      {"init.from", Str(FIELD(init.from)),
       "Start from these weights only: a `checkpoint.dir` (its newest checkpoint), one step "
       "directory, a Hugging Face model directory, or `job:ID` (that job's newest checkpoint; "
       "ithacad stores its checkpoint.dir). Refused when `checkpoint.dir` already holds a run; not "
       "with `model.weights`."},

      {"data.path", Str(FIELD(data.path)),
       "Token file(s) to train on, or a glob (`shards/*.tok`, `{a.tok,b.tok}`). Required unless "
       "`training.steps = 0`."},
      {"data.weights", FloatList(FIELD(data.weights)),
       "A weighted mix of sources: `data.path` is one brace group `{A,B,...}` (each source a "
       "file, glob or group) and source i gets weights[i] / sum of the samples, exactly (a "
       "fixed interleave, resumable); at most 3 decimals each. Empty: one source."},
      {"data.seq_len", Int(FIELD(data.seq_len)), "Tokens per sample: the context length S."},
      {"data.micro_batch", Int(FIELD(data.micro_batch)), "Samples per micro-step."},
      {"data.shuffle", Bool(FIELD(data.shuffle)),
       "Windows in a seeded (`training.seed`), resumable random order."},
      {"data.document_mask", Bool(FIELD(data.document_mask)),
       "Packed documents: attention stays inside each document and RoPE positions restart at "
       "each; a label that would cross into the next document is not trained."},
      {"data.loss_mask", Bool(FIELD(data.loss_mask)),
       "SFT: train only the tokens the token file's loss mask marks (`ithaca-tokenize --sft`)."},
      {"data.byte_tokens", Bool(FIELD(data.byte_tokens)),
       "Byte-level token files for a model that has its own tokenizer.json are meant (else "
       "refused: tokenize with `ithaca-tokenize --tokenizer MODEL_DIR`)."},

      {"training.steps", Int(FIELD(training.steps)),
       "Optimizer steps; 0: an evaluation-only job (needs [eval])."},
      {"training.lr", Float(FIELD(training.lr)), "Peak learning rate."},
      {"training.min_lr", Float(FIELD(training.min_lr)),
       "Learning rate at the end of the decay, absolute; when not given, `min_lr_ratio` x `lr`."},
      {"training.min_lr_ratio", Float(FIELD(training.min_lr_ratio)),
       "The end of the decay as a fraction of `lr` (TorchTitan's way), unless `min_lr` is given; "
       "not both. The stored spec holds the absolute `min_lr`.",
       /*written=*/[](const JobSpec&) { return false; }},
      {"training.schedule", Str(FIELD(training.schedule), {"cosine", "linear", "wsd", "constant"}),
       "After warmup: cosine or linear decay to `min_lr`, wsd (hold `lr`, then decay linearly "
       "over the last `decay_ratio` of the steps after warmup), or constant."},
      {"training.decay_ratio", Float(FIELD(training.decay_ratio)),
       "wsd: the fraction of the steps after warmup spent decaying."},
      {"training.warmup_steps", Int(FIELD(training.warmup_steps)), "Linear warmup steps."},
      {"training.weight_decay", Float(FIELD(training.weight_decay)),
       "AdamW weight decay, on matrices only."},
      {"training.beta1", Float(FIELD(training.beta1)), "AdamW beta1."},
      {"training.beta2", Float(FIELD(training.beta2)), "AdamW beta2."},
      {"training.eps", Float(FIELD(training.eps)), "AdamW epsilon."},
      {"training.grad_clip", Float(FIELD(training.grad_clip)),
       "Maximum global gradient norm; 0 disables clipping."},
      {"training.grad_accum", Int(FIELD(training.grad_accum)), "Micro-steps per optimizer step."},
      {"training.seed", Seed(FIELD(training.seed)), "Seeds the initialization and the data order."},

      {"parallel.world", Int(FIELD(parallel.world)), "Ranks (one per GPU)."},
      {"parallel.sp", Int(FIELD(parallel.sp)), "Ulysses group size; divides `world`."},
      {"parallel.fsdp", Bool(FIELD(parallel.fsdp)),
       "Shard parameters, gradients and optimizer state over the data-parallel ranks."},

      {"memory.recompute",
       EnumOrAuto(FIELD(memory.recompute),
                  std::vector<std::pair<RecomputePolicy, std::string>>{
                      {RecomputePolicy::kNone, "none"},
                      {RecomputePolicy::kFull, "full"},
                      {RecomputePolicy::kAttentionAware, "attention-aware"},
                      {RecomputePolicy::kAuto, "auto"}},
                  RecomputePolicy::kAuto),
       "Activation recompute: what each block keeps for its backward (the `block_inputs` tier); "
       "the backward computes the rest again. \"auto\": the policy (and per-block mix) of the "
       "plan with the shortest predicted step that fits. Was `memory.checkpoint`."},
      {"memory.attention_aware_blocks", IntOrAll(FIELD(memory.attention_aware_blocks)),
       "Under \"attention-aware\": how many blocks, the last ones, keep their attention's O and "
       "LSE; the others recompute fully (a per-block mix). \"all\": every block."},
      {"memory.offload", Bool(FIELD(memory.offload)),
       "Saved block inputs go to pinned host memory (the `host_block_inputs` tier)."},
      {"memory.offload_keep_last", Int(FIELD(memory.offload_keep_last)),
       "Blocks whose inputs stay on the device when offloading."},
      {"memory.prefetch", Bool(FIELD(memory.prefetch)),
       "Offloaded inputs come back one block ahead (else just in time)."},
      {"memory.recompute_interval", Int(FIELD(memory.recompute_interval)),
       "Save every k-th block's input; regrow the rest in the backward. Was "
       "`memory.checkpoint_interval`."},
      {"memory.saved_block_inputs", Int(FIELD(memory.saved_block_inputs)),
       "Hold at most this many block inputs at once (saved by the forward and regrown by the "
       "backward together), choosing where to save and regrow for the fewest extra block "
       "forwards; 0: `memory.recompute_interval` decides."},
      {"memory.head_chunk", IntOrAuto(FIELD(memory.head_chunk)),
       "Query heads per UPipe attention stage."},
      {"memory.tile_tokens", IntOrAuto(FIELD(memory.tile_tokens)), "Tokens per MLP / loss tile."},
      {"memory.overlap", Bool(FIELD(memory.overlap)),
       "Collectives under compute (FSDP gathers a block ahead, UPipe exchanges a stage ahead), "
       "for more buffers."},
      {"memory.gpu_budget_gib", FloatOrNode(FIELD(memory.gpu_budget_gib)),
       "Per-rank device budget (on the CPU backend the rank's share of host memory)."},
      {"memory.host_budget_gib", FloatOrNode(FIELD(memory.host_budget_gib)),
       "Per-rank pinned host memory for every host tier (offloaded block data, optimizer "
       "state)."},
      {"memory.optimizer_offload", BoolOrAuto(FIELD(memory.optimizer_offload)),
       "The f32 master weights and Adam m, v in pinned host memory, updated by the CPU AdamW "
       "(bit for bit the device's update); \"auto\": when nothing fits the GPU budget without "
       "it, or the planner predicts a step at least 3 % faster with it."},
      {"memory.param_offload", BoolOrAuto(FIELD(memory.param_offload)),
       "The bf16 working copy in pinned host memory too, uploaded a unit ahead of use, so the "
       "GPU holds about two units of weights; needs memory.optimizer_offload on (or \"auto\"); "
       "\"auto\": when the job does not fit the GPU budget with the optimizer's state on the "
       "host alone, or the planner predicts a step at least 3 % faster with it."},
      {"memory.overlap_update", Bool(FIELD(memory.overlap_update)),
       "Under optimizer offload, each step's CPU update runs under the next forward, unit by "
       "unit just before the forward reads each unit (the same bits); false: between the steps, "
       "the device idle."},

      {"checkpoint.dir", Str(FIELD(checkpoint.dir)), "Where checkpoints go; empty: none."},
      {"checkpoint.every", Int(FIELD(checkpoint.every)),
       "Steps between checkpoints; 0: only at the end."},
      {"checkpoint.resume", Bool(FIELD(checkpoint.resume)),
       "Resume from the latest checkpoint in `dir` when one exists."},
      {"checkpoint.keep", Int(FIELD(checkpoint.keep)), "Newest checkpoints kept."},
      {"checkpoint.export", Str(FIELD(checkpoint.export_dtype), {"bf16", "f32"}, /*or_empty=*/true),
       "At the end, also write the final weights as a Hugging Face directory (`dir/export`) in "
       "this dtype; empty: no export."},

      {"metrics.log_every", Int(FIELD(metrics.log_every)), "Steps between step lines."},
      {"metrics.tensorboard", Bool(FIELD(metrics.tensorboard)),
       "Rank 0 also writes TensorBoard event files to `checkpoint.dir/tensorboard` (every step's "
       "loss, lr, grad_norm, tokens/s, memory; each evaluation's loss)."},

      {"eval.path", Str(FIELD(eval.path)),
       "Held-out token file(s) or a glob, read in order from the start each time."},
      {"eval.every", Int(FIELD(eval.every)),
       "Steps between evaluations; 0: only after the last step (always then)."},
      {"eval.batches", Int(FIELD(eval.batches)),
       "Micro-batches of `data.micro_batch` windows per data-parallel replica."},
      {"eval.passkey.lengths", IntList(FIELD(eval.passkey.lengths)),
       "Prompt lengths in tokens, each at most `data.seq_len` and divisible by `parallel.sp`."},
      {"eval.passkey.depths", FloatList(FIELD(eval.passkey.depths)),
       "Where the key sits in the filler, as fractions 0 (the start) to 1 (just before the "
       "question)."},
      {"eval.passkey.samples", Int(FIELD(eval.passkey.samples)),
       "Prompts per (length, depth), each with its own key drawn from `training.seed`."},

      {"retry.max_restarts", Int(FIELD(retry.max_restarts)),
       "Restarts after such failures (0..1000); 0: the first failure is final."},
      {"retry.backoff_seconds", Float(FIELD(retry.backoff_seconds)),
       "Seconds between a failure and the restart (0..86400)."},

      {"slurm.nodes", Int(FIELD(slurm.nodes)),
       "Slurm nodes (1..4096); must divide parallel.world. More than 1 needs ithacad --cluster "
       "slurm."},
      {"slurm.partition", Str(FIELD(slurm.partition)),
       "sbatch --partition; empty: ithacad --slurm-partition (else Slurm's default)."},
      {"slurm.account", Str(FIELD(slurm.account)),
       "sbatch --account; empty: ithacad --slurm-account."},
      {"slurm.time_limit", Str(FIELD(slurm.time_limit)),
       "sbatch --time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); empty: ithacad "
       "--slurm-time-limit."},
      {"slurm.constraint", Str(FIELD(slurm.constraint)),
       "sbatch --constraint (node features, e.g. \"h100&ib\"); empty: ithacad "
       "--slurm-constraint."},
      {"slurm.signal_grace", Int(FIELD(slurm.signal_grace)),
       "Seconds of warning (sbatch --signal=USR1@N) before the time limit, and on preemption, in "
       "which the ranks checkpoint and stop and the job is queued again to resume (0..86400); "
       "0: ithacad --slurm-signal-grace."},

      {"kernels.attention_forward", Str(FIELD(kernels.attention_forward), AttentionKernelNames()),
       "The attention forward's kernel."},
      {"kernels.attention_backward", Str(FIELD(kernels.attention_backward), AttentionKernelNames()),
       "The attention backward's kernel."},
  };
  return *keys;
}

#undef FIELD

// Reads every entry of `table` (whose dotted path is `prefix`, "" at the top) with the keys of
// that section; at the top, sections are walked too. Anything else is unknown.
absl::Status Walk(const toml::table& table, const std::string& prefix, SpecReader& r, JobSpec& s) {
  std::vector<std::string> valid;  // for suggestions
  for (const Key& k : Keys()) {
    if (k.section() == prefix) valid.push_back(prefix.empty() ? k.path : k.name());
  }
  // The sections directly inside this one (every top-level one at the top, eval.passkey in eval,
  // model.rope in model).
  auto subsection = [&](const Section& sec) {
    if (sec.name.empty()) return false;
    const size_t dot = sec.name.rfind('.');
    return prefix.empty() ? dot == std::string::npos
                          : dot != std::string::npos && sec.name.substr(0, dot) == prefix;
  };
  for (const Section& sec : Sections()) {
    if (subsection(sec)) valid.push_back(sec.name.substr(sec.name.rfind('.') + 1));
  }
  for (auto&& [k, node] : table) {
    const std::string name(k.str());
    const std::string path = prefix.empty() ? name : absl::StrCat(prefix, ".", name);
    r.Saw(path, static_cast<int>(k.source().begin.line));
    auto key =
        std::find_if(Keys().begin(), Keys().end(), [&](const Key& x) { return x.path == path; });
    if (key != Keys().end()) {
      RETURN_IF_ERROR(key->codec.read(node, path, r, s));
      continue;
    }
    auto section = std::find_if(Sections().begin(), Sections().end(),
                                [&](const Section& x) { return subsection(x) && x.name == path; });
    if (section != Sections().end()) {
      if (!node.is_table()) return r.WrongType(node, path, "a table");
      RETURN_IF_ERROR(Walk(*node.as_table(), path, r, s));
      continue;
    }
    std::string best = Suggest(name, prefix, valid);
    std::string hint;
    // A key of another section, put here (a top-level `lr`): name where it belongs.
    auto elsewhere = std::find_if(Keys().begin(), Keys().end(), [&](const Key& x) {
      return x.name() == name && x.section() != prefix && !x.section().empty();
    });
    if (elsewhere != Keys().end()) {
      hint = absl::StrCat("; did you mean ", elsewhere->path, "? (it belongs under [",
                          elsewhere->section(), "])");
    } else if (!best.empty()) {
      hint = absl::StrCat("; did you mean ", prefix.empty() ? "" : prefix + ".", best, "?");
    }
    const bool renamed = std::any_of(RenamedKeys().begin(), RenamedKeys().end(),
                                     [&](const auto& old_new) { return old_new.first == path; });
    return r.Error(path.substr(0, 256),
                   renamed                             ? "renamed key"
                   : node.is_table() && prefix.empty() ? "unknown section"
                                                       : "unknown key",
                   hint);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> DataMixSlots(const std::vector<double>& weights) {
  std::vector<int64_t> slots;
  int64_t g = 0;
  for (double w : weights) {
    const double milli = w * 1000;
    if (!(w > 0) || !(milli < 1e15)) {
      return absl::InvalidArgumentError(
          absl::StrCat("must be positive numbers, got ", FormatDouble(w)));
    }
    const int64_t m = static_cast<int64_t>(std::llround(milli));
    if (m < 1 || std::abs(milli - static_cast<double>(m)) > 1e-6 * std::max(1.0, milli)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "at most 3 decimals each (the mix is exact in whole samples), got ", FormatDouble(w)));
    }
    slots.push_back(m);
    g = std::gcd(g, m);
  }
  int64_t period = 0;
  for (int64_t& m : slots) {
    m /= g;
    period += m;
    if (period > kMaxDataMixPeriod) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the mix repeats only every ", period, "+ samples (at most ", kMaxDataMixPeriod,
          "): use weights with fewer digits, such as [7, 3] rather than [0.701, 0.299]"));
    }
  }
  return slots;
}

namespace {

// [model.rope] on its own (ApplyRopeOverride checks it against the model): each parameter only
// under a scaling that reads it, and every value in range.
absl::Status ValidateRope(const JobSpec::Model::Rope& rope, const SpecReader& r) {
  if (r.Given("model.rope.theta")) {
    RETURN_IF_ERROR(r.Require(rope.theta > 0, "model.rope.theta",
                              absl::StrCat("must be > 0, got ", FormatDouble(rope.theta))));
  }
  struct Param {
    const char* key;
    bool given;
    std::vector<std::string> scalings;  // the scalings that read it
  };
  const Param params[] = {
      {"factor", rope.factor != 0 || r.Given("model.rope.factor"), {"linear", "llama3", "yarn"}},
      {"low_freq_factor", r.Given("model.rope.low_freq_factor"), {"llama3"}},
      {"high_freq_factor", r.Given("model.rope.high_freq_factor"), {"llama3"}},
      {"beta_fast", r.Given("model.rope.beta_fast"), {"yarn"}},
      {"beta_slow", r.Given("model.rope.beta_slow"), {"yarn"}},
      {"attention_factor", r.Given("model.rope.attention_factor"), {"yarn"}},
      {"original_max_position_embeddings",
       r.Given("model.rope.original_max_position_embeddings"),
       {"llama3", "yarn"}},
  };
  for (const Param& p : params) {
    if (!p.given) continue;
    const std::string key = absl::StrCat("model.rope.", p.key);
    if (rope.scaling.empty()) {
      return r.Error(key, absl::StrCat("needs model.rope.scaling (", QuotedList(p.scalings),
                                       ": the scaling it is a parameter of)"));
    }
    RETURN_IF_ERROR(r.Require(
        std::find(p.scalings.begin(), p.scalings.end(), rope.scaling) != p.scalings.end(), key,
        absl::StrCat("not a parameter of scaling \"", rope.scaling, "\" (it is one of ",
                     QuotedList(p.scalings), ")")));
  }
  for (const auto& [key, v] : {std::pair<const char*, double>{"factor", rope.factor},
                               {"low_freq_factor", rope.low_freq_factor},
                               {"high_freq_factor", rope.high_freq_factor},
                               {"beta_fast", rope.beta_fast},
                               {"beta_slow", rope.beta_slow},
                               {"attention_factor", rope.attention_factor}}) {
    const std::string path = absl::StrCat("model.rope.", key);
    if (!r.Given(path)) continue;
    RETURN_IF_ERROR(r.Require(v > 0, path, absl::StrCat("must be > 0, got ", FormatDouble(v))));
  }
  if (r.Given("model.rope.original_max_position_embeddings")) {
    RETURN_IF_ERROR(r.Require(rope.original_max_position_embeddings >= 1 &&
                                  rope.original_max_position_embeddings <= kMaxSeqLen,
                              "model.rope.original_max_position_embeddings",
                              absl::StrCat("must be in [1, ", kMaxSeqLen, "], got ",
                                           rope.original_max_position_embeddings)));
  }
  const bool scaled =
      rope.scaling == "linear" || rope.scaling == "llama3" || rope.scaling == "yarn";
  RETURN_IF_ERROR(r.Require(!scaled || rope.factor > 0, "model.rope.factor",
                            absl::StrCat("required with scaling \"", rope.scaling,
                                         "\" (how many times the context is stretched)")));
  if (rope.scaling == "llama3") {
    const double low = rope.low_freq_factor != 0 ? rope.low_freq_factor : 1.0;
    const double high = rope.high_freq_factor != 0 ? rope.high_freq_factor : 4.0;
    RETURN_IF_ERROR(r.Require(high > low, "model.rope.high_freq_factor",
                              absl::StrCat("must exceed low_freq_factor (", FormatDouble(low),
                                           "), got ", FormatDouble(high))));
  }
  return absl::OkStatus();
}

absl::Status Validate(const JobSpec& s, const SpecReader& r) {
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

  // An evaluation-only job (training.steps = 0) trains on nothing: data.path is optional there.
  const bool eval_only = s.training.steps == 0;
  RETURN_IF_ERROR(r.Require(!s.data.path.empty() || eval_only, "data.path",
                            "required: the token file to train on (see ithaca-tokenize)"));
  if (!s.data.weights.empty()) {
    absl::StatusOr<std::vector<int64_t>> slots = DataMixSlots(s.data.weights);
    if (!slots.ok()) return r.Error("data.weights", std::string(slots.status().message()));
    absl::StatusOr<std::vector<std::string>> sources = SplitDataSources(s.data.path);
    RETURN_IF_ERROR(r.Require(sources.ok(), "data.path",
                              sources.ok() ? "" : std::string(sources.status().message())));
    RETURN_IF_ERROR(
        r.Require(sources->size() == s.data.weights.size(), "data.weights",
                  absl::StrCat(s.data.weights.size(), " weights for ", sources->size(),
                               sources->size() == 1 ? " source" : " sources",
                               ": data.path must be one brace group with a source per weight, "
                               "\"{web/*.tok,code/*.tok}\" for weights = [3, 1]")));
  }
  RETURN_IF_ERROR(
      r.Require(s.data.seq_len >= 2 && s.data.seq_len <= kMaxSeqLen, "data.seq_len",
                absl::StrCat("must be in [2, ", kMaxSeqLen, "], got ", s.data.seq_len)));
  RETURN_IF_ERROR(
      r.Require(s.data.micro_batch >= 1 && s.data.micro_batch <= kMaxMicroBatch, "data.micro_batch",
                absl::StrCat("must be in [1, ", kMaxMicroBatch, "], got ", s.data.micro_batch)));

  const JobSpec::Training& t = s.training;
  RETURN_IF_ERROR(
      r.Require(t.steps >= 0, "training.steps", absl::StrCat("must be >= 0, got ", t.steps)));
  const JobSpec::Eval::Passkey& pk = s.eval.passkey;
  RETURN_IF_ERROR(r.Require(!eval_only || !s.eval.path.empty() || !pk.lengths.empty(),
                            "training.steps",
                            "0 (an evaluation-only job) needs an [eval] section with eval.path "
                            "or [eval.passkey]"));
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
  RETURN_IF_ERROR(r.Require(t.decay_ratio >= 0 && t.decay_ratio <= 1, "training.decay_ratio",
                            absl::StrCat("must be in [0, 1], got ", t.decay_ratio)));
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
  RETURN_IF_ERROR(r.Require(m.recompute_interval >= 1, "memory.recompute_interval",
                            absl::StrCat("must be >= 1, got ", m.recompute_interval)));
  RETURN_IF_ERROR(r.Require(m.saved_block_inputs == 0 || m.saved_block_inputs >= 2,
                            "memory.saved_block_inputs",
                            absl::StrCat("must be 0 (off) or >= 2, got ", m.saved_block_inputs)));
  if (m.saved_block_inputs > 0) {
    RETURN_IF_ERROR(r.Require(m.recompute_interval == 1, "memory.saved_block_inputs",
                              "set it or memory.recompute_interval, not both"));
    RETURN_IF_ERROR(r.Require(m.recompute != RecomputePolicy::kNone, "memory.saved_block_inputs",
                              "needs memory.recompute \"full\" or \"attention-aware\" (\"none\" "
                              "keeps every block's input)"));
  }
  RETURN_IF_ERROR(
      r.Require(m.gpu_budget_gib >= 0, "memory.gpu_budget_gib",
                absl::StrCat("must be >= 0 (0: from the node), got ", m.gpu_budget_gib)));
  RETURN_IF_ERROR(
      r.Require(m.host_budget_gib >= 0, "memory.host_budget_gib",
                absl::StrCat("must be >= 0 (0: from the node), got ", m.host_budget_gib)));

  RETURN_IF_ERROR(ValidateRope(s.model.rope, r));
  RETURN_IF_ERROR(r.Require(s.init.from.empty() || s.model.weights.empty(), "init.from",
                            "set either init.from (a new phase's start) or model.weights, not "
                            "both"));
  RETURN_IF_ERROR(r.Require(
      !absl::StartsWith(s.init.from, "job:") || !InitFromJob(s.init.from).empty(), "init.from",
      absl::StrCat("\"", s.init.from.substr(0, 64),
                   "\" names no job: write job:ID with the id `ithaca list` shows (job:job-3)")));

  RETURN_IF_ERROR(r.Require(s.checkpoint.every >= 0, "checkpoint.every",
                            absl::StrCat("must be >= 0, got ", s.checkpoint.every)));
  RETURN_IF_ERROR(r.Require(s.checkpoint.keep >= 1, "checkpoint.keep",
                            absl::StrCat("must be >= 1, got ", s.checkpoint.keep)));
  const std::string& ex = s.checkpoint.export_dtype;
  RETURN_IF_ERROR(
      r.Require(ex.empty() || !s.checkpoint.dir.empty(), "checkpoint.export",
                "needs checkpoint.dir (the export is written to checkpoint.dir/export)"));
  RETURN_IF_ERROR(r.Require(ex.empty() || !eval_only, "checkpoint.export",
                            "an evaluation-only job (training.steps = 0) writes no checkpoint to "
                            "export"));
  RETURN_IF_ERROR(r.Require(!r.Given("eval.passkey") || !pk.lengths.empty(), "eval.passkey.lengths",
                            "required in an [eval.passkey] section: the prompt lengths in tokens, "
                            "e.g. [4096, 8192]"));
  RETURN_IF_ERROR(r.Require(!r.Given("eval") || !s.eval.path.empty() || !pk.lengths.empty(),
                            "eval.path",
                            "required in an [eval] section without [eval.passkey]: the held-out "
                            "token file(s) (see ithaca-tokenize --val-fraction)"));
  if (!pk.lengths.empty()) {
    RETURN_IF_ERROR(r.Require(
        pk.lengths.size() <= kMaxPasskeyPoints, "eval.passkey.lengths",
        absl::StrCat("at most ", kMaxPasskeyPoints, " lengths, got ", pk.lengths.size())));
    for (size_t i = 0; i < pk.lengths.size(); ++i) {
      const int64_t n = pk.lengths[i];
      RETURN_IF_ERROR(r.Require(
          n >= 1 && n <= s.data.seq_len, "eval.passkey.lengths",
          absl::StrCat(n, " is not in [1, data.seq_len = ", s.data.seq_len,
                       "]: the job is planned for data.seq_len tokens, so no prompt may be "
                       "longer (raise data.seq_len)")));
      RETURN_IF_ERROR(r.Require(
          s.parallel.sp < 1 || n % s.parallel.sp == 0, "eval.passkey.lengths",
          absl::StrCat(n, " is not divisible by parallel.sp (", s.parallel.sp,
                       "): every rank of a Ulysses group holds an equal share of a prompt")));
      RETURN_IF_ERROR(r.Require(
          std::find(pk.lengths.begin(), pk.lengths.begin() + i, n) == pk.lengths.begin() + i,
          "eval.passkey.lengths", absl::StrCat(n, " is given twice")));
    }
    RETURN_IF_ERROR(r.Require(
        !pk.depths.empty() && pk.depths.size() <= kMaxPasskeyPoints, "eval.passkey.depths",
        absl::StrCat("must hold 1 to ", kMaxPasskeyPoints, " depths, got ", pk.depths.size())));
    for (size_t i = 0; i < pk.depths.size(); ++i) {
      const double d = pk.depths[i];
      RETURN_IF_ERROR(r.Require(d >= 0 && d <= 1, "eval.passkey.depths",
                                absl::StrCat(FormatDouble(d),
                                             " is not in [0, 1] (0: the key at the start of "
                                             "the filler, 1: at its end)")));
      RETURN_IF_ERROR(
          r.Require(std::find(pk.depths.begin(), pk.depths.begin() + i, d) == pk.depths.begin() + i,
                    "eval.passkey.depths", absl::StrCat(FormatDouble(d), " is given twice")));
    }
    RETURN_IF_ERROR(
        r.Require(pk.samples >= 1 && pk.samples <= kMaxPasskeySamples, "eval.passkey.samples",
                  absl::StrCat("must be in [1, ", kMaxPasskeySamples, "], got ", pk.samples)));
  }
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
  RETURN_IF_ERROR(r.Require(s.slurm.nodes >= 1 && s.slurm.nodes <= 4096, "slurm.nodes",
                            absl::StrCat("must be in 1..4096, got ", s.slurm.nodes)));
  RETURN_IF_ERROR(r.Require(
      s.parallel.world % s.slurm.nodes == 0, "slurm.nodes",
      absl::StrCat("must divide parallel.world (", s.parallel.world, "), got ", s.slurm.nodes)));
  RETURN_IF_ERROR(r.Require(s.slurm.signal_grace >= 0 && s.slurm.signal_grace <= 86400,
                            "slurm.signal_grace",
                            absl::StrCat("must be in 0..86400, got ", s.slurm.signal_grace)));
  for (const auto& [key, value] :
       {std::pair<const char*, const std::string*>{"slurm.partition", &s.slurm.partition},
        {"slurm.account", &s.slurm.account},
        {"slurm.time_limit", &s.slurm.time_limit},
        {"slurm.constraint", &s.slurm.constraint}}) {
    RETURN_IF_ERROR(
        r.Require(SlurmValueOk(key, *value), key,
                  absl::StrCat("\"", *value, "\" is not a valid ", key, SlurmValueRule(key))));
  }
  RETURN_IF_ERROR(r.Require(s.metrics.log_every >= 1, "metrics.log_every",
                            absl::StrCat("must be >= 1, got ", s.metrics.log_every)));
  RETURN_IF_ERROR(r.Require(
      !s.metrics.tensorboard || !s.checkpoint.dir.empty(), "metrics.tensorboard",
      "needs checkpoint.dir (the event files are written to checkpoint.dir/tensorboard)"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& toml_text, const std::string& source) {
  ASSIGN_OR_RETURN(toml::table table, ParseTomlText(toml_text, source));
  JobSpec s;
  SpecReader r(source);
  RETURN_IF_ERROR(Walk(table, "", r, s));
  // One way to say where the decay ends: an absolute min_lr, or a ratio of lr (the default).
  RETURN_IF_ERROR(r.Require(!(r.Given("training.min_lr") && r.Given("training.min_lr_ratio")),
                            "training.min_lr_ratio",
                            "set either training.min_lr (absolute) or training.min_lr_ratio "
                            "(of training.lr), not both"));
  RETURN_IF_ERROR(r.Require(s.training.min_lr_ratio >= 0 && s.training.min_lr_ratio <= 1,
                            "training.min_lr_ratio",
                            absl::StrCat("must be in [0, 1], got ", s.training.min_lr_ratio)));
  if (!r.Given("training.min_lr")) {
    // 15 significant digits, so that 0.1 x 3e-4 is 3e-05 as a person writes it, not
    // 2.9999999999999997e-05.
    s.training.min_lr =
        std::stod(absl::StrFormat("%.15g", s.training.min_lr_ratio * s.training.lr));
  }
  RETURN_IF_ERROR(Validate(s, r));
  return s;
}

std::string UpgradeStoredSpec(const std::string& toml_text) {
  absl::StatusOr<toml::table> spec = ParseTomlText(toml_text, "stored spec");
  if (!spec.ok()) return toml_text;  // the parse that reads the spec reports it
  bool changed = false;
  for (const auto& [old_path, new_path] : RenamedKeys()) {
    // The tables above each key (they are one level down today; the walk takes any depth).
    const std::vector<std::string> from = absl::StrSplit(old_path, '.');
    const std::vector<std::string> to = absl::StrSplit(new_path, '.');
    auto parent = [&](const std::vector<std::string>& parts) -> toml::table* {
      toml::table* t = &*spec;
      for (size_t i = 0; i + 1 < parts.size() && t != nullptr; ++i) {
        toml::node* next = t->get(parts[i]);
        t = next == nullptr ? nullptr : next->as_table();
      }
      return t;
    };
    toml::table* old_parent = parent(from);
    toml::table* new_parent = parent(to);
    if (old_parent == nullptr || new_parent == nullptr) continue;
    const toml::node* value = old_parent->get(from.back());
    // Both spellings present: leave it to the parser, which refuses the old one.
    if (value == nullptr || new_parent->contains(to.back())) continue;
    new_parent->insert_or_assign(to.back(), *value);
    old_parent->erase(from.back());
    changed = true;
  }
  if (!changed) return toml_text;
  std::ostringstream out;
  out << toml::toml_formatter(*spec);
  return out.str() + "\n";
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  ASSIGN_OR_RETURN(JobSpec s, ParseJobSpec(text, path));
  // Paths in a spec are relative to the spec, so a job directory can be moved as a whole.
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "" : slash == 0 ? "/" : path.substr(0, slash);
  for (std::string* p : {&s.data.path, &s.model.config, &s.model.weights, &s.checkpoint.dir,
                         &s.eval.path, &s.init.from}) {
    if (p == &s.init.from && !InitFromJob(*p).empty()) continue;  // a job, not a path
    absl::StatusOr<std::string> resolved = ResolvePattern(dir, *p);
    if (!resolved.ok())
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", resolved.status().message()));
    *p = *resolved;
  }
  return s;
}

std::string JobSpecToToml(const JobSpec& s) {
  std::string out;
  for (const Section& sec : Sections()) {
    if (sec.written && !sec.written(s)) continue;
    if (!sec.name.empty()) absl::StrAppend(&out, "\n[", sec.name, "]\n");
    for (const Key& k : Keys()) {
      if (k.section() != sec.name || (k.written && !k.written(s))) continue;
      absl::StrAppend(&out, sec.name.empty() ? k.path : k.name(), " = ", k.codec.write(s), "\n");
    }
  }
  return out;
}

absl::Status CheckResolved(const JobSpec& spec) {
  for (const Key& k : Keys()) {
    if (k.codec.unresolved && k.codec.unresolved(spec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(k.path, ": still \"auto\"; the job must be resolved first (ResolveJob)"));
    }
  }
  return absl::OkStatus();
}

std::string SpecReferenceMarkdown() {
  const JobSpec defaults;
  std::string out =
      "# The job spec\n\n"
      "A job is a TOML file. This page is generated from the key table in "
      "`engine/spec/job_spec.cc` (`bazel run //engine/spec:spec_reference > docs/spec.md`; a test "
      "fails when it is stale). Unknown keys are errors that name the key and suggest the closest "
      "valid one; paths are relative to the spec's own directory. Keys marked *auto* may be "
      "\"auto\" (or 0 where the kind says so): ResolveJob chooses them at admission, and the "
      "stored spec holds the chosen values.\n";
  for (const Section& sec : Sections()) {
    absl::StrAppend(&out, "\n## ", sec.name.empty() ? "Top level" : "[" + sec.name + "]", "\n\n",
                    sec.doc, "\n\n| key | kind | default | meaning |\n|---|---|---|---|\n");
    for (const Key& k : Keys()) {
      if (k.section() != sec.name) continue;
      std::string kind = k.codec.kind;
      if (k.codec.unresolved) absl::StrAppend(&kind, "; *auto*");
      std::string def = k.codec.write(defaults);
      absl::StrAppend(&out, "| `", sec.name.empty() ? k.path : k.name(), "` | ",
                      absl::StrReplaceAll(kind, {{"|", "\\|"}}), " | `", def, "` | ", k.doc,
                      " |\n");
    }
  }
  return out;
}

absl::StatusOr<LlamaConfig> ResolveModelConfig(const JobSpec& spec) {
  LlamaConfig cfg;
  if (!spec.model.config.empty()) {
    ASSIGN_OR_RETURN(cfg, LoadConfigJson(spec.model.config));
  } else {
    ASSIGN_OR_RETURN(cfg, PresetConfig(spec.model.preset));
  }
  RETURN_IF_ERROR(ApplyRopeOverride(spec.model.rope, &cfg));
  return cfg;
}

absl::Status ApplyRopeOverride(const JobSpec::Model::Rope& o, LlamaConfig* cfg) {
  if (o.theta != 0) {
    if (!(o.theta > 0) || !std::isfinite(o.theta)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.rope.theta: must be > 0, got ", FormatDouble(o.theta)));
    }
    cfg->rope_theta = o.theta;
  }
  if (!o.scaling.empty()) {
    RopeConfig r;
    r.head_dim = cfg->rope.head_dim;
    // The context the model was trained at before this scaling: its own scaling's original
    // context when it has one, else its max_position_embeddings.
    const bool had_original =
        cfg->rope.type == RopeType::kLlama3 || cfg->rope.type == RopeType::kYarn;
    r.original_max_position = o.original_max_position_embeddings > 0
                                  ? o.original_max_position_embeddings
                              : had_original ? cfg->rope.original_max_position
                                             : cfg->max_position_embeddings;
    auto need_factor = [&]() -> absl::Status {
      if (!(o.factor > 0) || !std::isfinite(o.factor)) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.rope.factor: required (> 0) with "
                         "scaling \"",
                         o.scaling, "\""));
      }
      r.factor = o.factor;
      return absl::OkStatus();
    };
    if (o.scaling == "none") {
      r.type = RopeType::kDefault;
    } else if (o.scaling == "linear") {
      r.type = RopeType::kLinear;
      RETURN_IF_ERROR(need_factor());
    } else if (o.scaling == "llama3") {
      r.type = RopeType::kLlama3;
      RETURN_IF_ERROR(need_factor());
      r.low_freq_factor = o.low_freq_factor != 0 ? o.low_freq_factor : 1.0;
      r.high_freq_factor = o.high_freq_factor != 0 ? o.high_freq_factor : 4.0;
      if (!(r.high_freq_factor > r.low_freq_factor)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.rope.high_freq_factor: must exceed low_freq_factor (",
            FormatDouble(r.low_freq_factor), "), got ", FormatDouble(r.high_freq_factor)));
      }
    } else if (o.scaling == "yarn") {
      r.type = RopeType::kYarn;
      RETURN_IF_ERROR(need_factor());
      r.beta_fast = o.beta_fast != 0 ? o.beta_fast : 32.0;
      r.beta_slow = o.beta_slow != 0 ? o.beta_slow : 1.0;
      r.attention_factor =
          o.attention_factor != 0 ? o.attention_factor : YarnDefaultAttentionFactor(o.factor);
      r.truncate = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.rope.scaling: must be \"none\", \"linear\", \"llama3\" or \"yarn\", got \"",
          o.scaling.substr(0, 64), "\""));
    }
    cfg->rope = r;
  }
  cfg->rope.theta = cfg->rope_theta;
  return absl::OkStatus();
}

std::string InitFromJob(const std::string& from) {
  if (!absl::StartsWith(from, "job:")) return "";
  std::string id = from.substr(4);
  if (id.empty() || id.size() > 64) return "";
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok) return "";
  }
  // "job:3" is job-3, as the ids `ithaca list` shows.
  if (std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    id = "job-" + id;
  }
  return id;
}

absl::Status CheckSlurmValue(const std::string& key, const std::string& value,
                             const std::string& what) {
  if (SlurmValueOk(key, value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": \"", value, "\" is not valid", SlurmValueRule(key)));
}

}  // namespace ithaca
