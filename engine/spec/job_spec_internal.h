// The job_spec library's shared internals, for its own files only (engine/spec:job_spec lists
// this header in srcs): the reader that knows where each key sits in the file, the key table's
// rows (Section, Key) and the codec each row reads and writes its value with, and the helpers
// its files share. What each file holds:
//   job_spec.cc           parsing (the walk over the table), LoadJobSpec, UpgradeStoredSpec,
//                         JobSpecToToml, CheckResolved, SpecReferenceMarkdown, InitFromJob
//   key_table.cc          the key table: Sections() and Keys()
//   key_codecs.h          the codecs (Int, Float, Str, Enum, ...), for the table alone
//   key_range.cc          a number key's range: its words and CheckRange
//   key_suggestions.cc    "did you mean ...?": renamed keys, other trainers' names, typos
//   spec_values.cc        values as TOML text (FormatDouble, Quote) and TOML type names
//   job_spec_validate.cc  Validate (a spec's own rules, without its model) and DataMixSlots
//   resolve_model.cc      ResolveModelConfig and ApplyRopeOverride ([model.rope])
//   slurm_values.cc       the alphabet of each [slurm] string value (CheckSlurmValue)
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/toml_text.h"

namespace ithaca {
namespace spec_internal {

// ---- Values as text (spec_values.cc).

// "integer", "float", "table", ...: a TOML node's type, as errors name it.
const char* TypeName(toml::node_type t);
// The shortest %g text that reads back to the same double, with a '.' or 'e' (a TOML float).
std::string FormatDouble(double v);
// A TOML basic string: quoted, with quotes, backslashes and control characters escaped.
std::string Quote(const std::string& s);
// "\"a\", \"b\" or \"c\"": the choices of a string key, as errors and docs list them.
std::string QuotedList(const std::vector<std::string>& values);

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

// ---- A number key's range (key_range.cc), written once, in the key's row: Validate enforces it
// (CheckRange, one message for every key) and docs/spec.md shows it in the key's kind.

struct Range {
  // The bounds; an infinite one is open (no bound).
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;  // > min rather than >= min
  bool max_exclusive = false;  // < max rather than <= max
  // Non-empty: 0 is allowed too, outside the bounds, and means this ("0 (off) or >= 2").
  std::string zero;
  // What a value means, said after the range in the kind and the error ("0: from the node").
  std::string note;
  // Checked only where the file gives the key: its default, 0, means "unset" (the model's own).
  bool only_given = false;

  bool set() const {
    return min > -std::numeric_limits<double>::infinity() ||
           max < std::numeric_limits<double>::infinity();
  }
  bool Contains(double v) const;
  // The range in words, as "must be ..." and the docs' kind say it: ">= 1", "> 0",
  // "in [2, 134217728]", "in [0, 1)", "0 (off) or >= 2", each with its note in parentheses.
  std::string Text() const;

  Range OrZero(std::string meaning) const;  // 0 allowed besides, meaning `meaning`
  Range Noting(std::string what) const;     // `note` = what
  Range WhenGiven() const;                  // only_given
};
Range AtLeast(double min);              // >= min
Range Above(double min);                // > min
Range Between(double min, double max);  // in [min, max]
Range From(double min, double below);   // in [min, below)
// A codec's kind with its range: "an integer in [2, 134217728]", "a number > 0 when given",
// "an integer, 0 (off) or >= 2"; `kind` alone without one.
std::string KindInRange(const std::string& kind, const Range& range);

// ---- The key table (key_table.cc); each row's codec is made by key_codecs.h.

// One kind of value: how a key's value is read, written back and documented, and the number it
// holds (for a number key with a range).
struct Codec {
  std::string kind;  // what the value must be, as errors and docs say it: "an integer >= 0"
  std::function<absl::Status(const toml::node&, const std::string& path, const SpecReader&,
                             JobSpec&)>
      read;
  std::function<std::string(const JobSpec&)> write;  // the value as TOML text
  // Whether the value is still the "auto" that ResolveJob replaces; empty: never.
  std::function<bool(const JobSpec&)> unresolved;
  // The key's range (unset: none) and its value as a number (set with a range).
  Range range;
  std::function<double(const JobSpec&)> number;
};

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

const std::vector<Section>& Sections();
const std::vector<Key>& Keys();
// The row of `path`, which must be one.
const Key& KeyAt(const std::string& path);

// `key`'s value in `s` within the range of its row (OK for a key without one): else
// INVALID_ARGUMENT "section.key: must be in [2, 134217728], got 1" with the key's line.
absl::Status CheckRange(const Key& key, const JobSpec& s, const SpecReader& r);

// ---- Unknown keys (key_suggestions.cc).

// Keys this spec format used to have, by their dotted path, and the key each is now. A new
// spec that uses one is refused with "did you mean NEW?" (Suggest); a spec stored by an older
// ithacad is read with the new names (UpgradeStoredSpec).
const std::vector<std::pair<std::string, std::string>>& RenamedKeys();
// The valid key of section `section` ("" at the top) closest to `bad`, or "" when none is close
// enough to be a likely typo. `valid` holds the section's keys by their last part.
std::string Suggest(const std::string& bad, const std::string& section,
                    const std::vector<std::string>& valid);

// ---- A spec's own rules (job_spec_validate.cc): every key's range and the relations between
// keys, without the model (engine/spec/validate.h checks a spec against its model).
absl::Status Validate(const JobSpec& s, const SpecReader& r);

// ---- [slurm] string values (slurm_values.cc): whether `v` is in `key`'s alphabet, and the
// alphabet in words (" (letters, digits and _ . , -, at most 256)").
bool SlurmValueOk(const std::string& key, const std::string& v);
std::string SlurmValueRule(const std::string& key);

}  // namespace spec_internal
}  // namespace ithaca
