// JobSpec <-> TOML. Every key is one row of the key table (Keys(), key_table.cc): its dotted path,
// a codec made from the member it fills (how it is read, written back, and whether it is still
// "auto") and its documentation. Parsing, JobSpecToToml, CheckResolved and the reference in
// docs/spec.md all walk that one table, so unknown keys, wrong types and bad values all report
// the same "file: section.key: ..." prefix and no key can be written in one place and forgotten in
// another. (job_spec_internal.h says what the library's other files hold.)
#include "engine/spec/job_spec.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "engine/spec/job_spec_internal.h"
#include "engine/spec/toml_text.h"

namespace ithaca {

using spec_internal::CheckRange;
using spec_internal::Key;
using spec_internal::KeyAt;
using spec_internal::Keys;
using spec_internal::RenamedKeys;
using spec_internal::Section;
using spec_internal::Sections;
using spec_internal::SpecReader;
using spec_internal::Suggest;
using spec_internal::Validate;

namespace {

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
  // Its range (its row's) before min_lr is made from it; Validate checks every range again.
  RETURN_IF_ERROR(CheckRange(KeyAt("training.min_lr_ratio"), s, r));
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
                         &s.eval.path, &s.init.from, &s.lora.init}) {
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
      "`engine/spec/key_table.cc` (`bazel run //engine/spec:spec_reference > docs/spec.md`; a test "
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

}  // namespace ithaca
