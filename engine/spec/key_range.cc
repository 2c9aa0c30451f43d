// A number key's range, as its row in the key table states it: the words errors and docs use,
// and the one check Validate runs for every key.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/spec/job_spec_internal.h"

namespace ithaca {
namespace spec_internal {
namespace {

// A bound as a person writes it: 134217728, 0, 0.5 (the shortest text that reads back).
std::string Bound(double v) {
  if (std::abs(v) < 1e15 && v == std::trunc(v)) return absl::StrCat(static_cast<int64_t>(v));
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace

bool Range::Contains(double v) const {
  if (!zero.empty() && v == 0) return true;
  const bool above = min_exclusive ? v > min : v >= min;
  const bool below = max_exclusive ? v < max : v <= max;
  return above && below;
}

std::string Range::Text() const {
  const double inf = std::numeric_limits<double>::infinity();
  std::string text;
  if (min > -inf && max < inf) {
    text = absl::StrCat("in ", min_exclusive ? "(" : "[", Bound(min), ", ", Bound(max),
                        max_exclusive ? ")" : "]");
  } else if (min > -inf) {
    text = absl::StrCat(min_exclusive ? "> " : ">= ", Bound(min));
  } else {
    text = absl::StrCat(max_exclusive ? "< " : "<= ", Bound(max));
  }
  if (!zero.empty()) text = absl::StrCat("0 (", zero, ") or ", text);
  if (!note.empty()) absl::StrAppend(&text, " (", note, ")");
  return text;
}

Range Range::OrZero(std::string meaning) const {
  Range r = *this;
  r.zero = std::move(meaning);
  return r;
}

Range Range::Noting(std::string what) const {
  Range r = *this;
  r.note = std::move(what);
  return r;
}

Range Range::WhenGiven() const {
  Range r = *this;
  r.only_given = true;
  return r;
}

Range AtLeast(double min) {
  Range r;
  r.min = min;
  return r;
}

Range Above(double min) {
  Range r = AtLeast(min);
  r.min_exclusive = true;
  return r;
}

Range Between(double min, double max) {
  Range r = AtLeast(min);
  r.max = max;
  return r;
}

Range From(double min, double below) {
  Range r = Between(min, below);
  r.max_exclusive = true;
  return r;
}

std::string KindInRange(const std::string& kind, const Range& range) {
  if (!range.set()) return kind;
  return absl::StrCat(kind, range.zero.empty() ? " " : ", ", range.Text(),
                      range.only_given ? " when given" : "");
}

absl::Status CheckRange(const Key& key, const JobSpec& s, const SpecReader& r) {
  const Range& range = key.codec.range;
  if (!range.set() || (range.only_given && !r.Given(key.path))) return absl::OkStatus();
  return r.Require(range.Contains(key.codec.number(s)), key.path,
                   absl::StrCat("must be ", range.Text(), ", got ", key.codec.write(s)));
}

}  // namespace spec_internal
}  // namespace ithaca
