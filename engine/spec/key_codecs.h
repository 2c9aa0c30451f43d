// The codecs of the key table's rows (key_table.cc alone includes this): one per kind of value,
// each the parser, the writer and the kind in the docs of the member it is made from.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/spec/job_spec_internal.h"

namespace ithaca {
namespace spec_internal {

// `get` is FIELD(member): it returns a pointer to the member of a JobSpec, const or not.
#define FIELD(member) [](auto& spec) { return &spec.member; }

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

// With `range`, the value must be in it (CheckRange; the docs show it in the kind).
template <typename Get>
Codec Int(Get get, Range range = {}) {
  return {KindInRange("an integer", range),
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (!n.is_integer()) return r.WrongType(n, path, "an integer");
            *get(s) = n.as_integer()->get();
            return absl::OkStatus();
          },
          [get](const JobSpec& s) { return absl::StrCat(*get(s)); },
          {},
          range,
          [get](const JobSpec& s) { return static_cast<double>(*get(s)); }};
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

// An integer >= 0, or `word` (stored as -1): "all" where -1 means every one; "auto"
// (`unresolved`) where it is left for ResolveJob to choose.
template <typename Get>
Codec IntOrWord(Get get, const char* word, bool unresolved) {
  const std::string kind = absl::StrCat("an integer >= 0 or \"", word, "\"");
  Codec c = {kind,
             [get, kind, word](const toml::node& n, const std::string& path, const SpecReader& r,
                               JobSpec& s) {
               if (n.is_string()) {
                 RETURN_IF_ERROR(r.Require(n.as_string()->get() == word, path,
                                           absl::StrCat("must be ", kind, ", got \"",
                                                        n.as_string()->get().substr(0, 64), "\"")));
                 *get(s) = -1;
                 return absl::OkStatus();
               }
               if (!n.is_integer()) return r.WrongType(n, path, kind);
               *get(s) = n.as_integer()->get();
               return r.Require(*get(s) >= 0, path,
                                absl::StrCat("must be ", kind, ", got ", *get(s)));
             },
             [get, word](const JobSpec& s) {
               return *get(s) < 0 ? absl::StrCat("\"", word, "\"") : absl::StrCat(*get(s));
             }};
  if (unresolved) c.unresolved = [get](const JobSpec& s) { return *get(s) < 0; };
  return c;
}

template <typename Get>
Codec IntOrAll(Get get) {
  return IntOrWord(get, "all", /*unresolved=*/false);
}

// An integer >= 0, or "auto" (stored as -1) for ResolveJob to choose.
template <typename Get>
Codec IntOrAutoFromZero(Get get) {
  return IntOrWord(get, "auto", /*unresolved=*/true);
}

// A finite number; integers are accepted where floats are expected. With `range`, as Int.
template <typename Get>
Codec Float(Get get, Range range = {}) {
  return {KindInRange("a number", range),
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
          [get](const JobSpec& s) { return FormatDouble(*get(s)); },
          {},
          range,
          [get](const JobSpec& s) { return *get(s); }};
}

// A number >= 0 where 0 means "from the node", which ResolveJob replaces.
template <typename Get>
Codec FloatOrNode(Get get) {
  Codec c = Float(get, AtLeast(0).Noting("0: from the node"));
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

// An array of strings, each one of `values`, no two the same, at most kMaxDataSources.
template <typename Get>
Codec StrList(Get get, std::vector<std::string> values) {
  const std::string kind = absl::StrCat("an array of ", QuotedList(values));
  return {kind,
          [get, values, kind](const toml::node& n, const std::string& path, const SpecReader& r,
                              JobSpec& s) {
            if (!n.is_array()) return r.WrongType(n, path, kind);
            const toml::array& a = *n.as_array();
            RETURN_IF_ERROR(
                r.Require(a.size() <= kMaxDataSources, path,
                          absl::StrCat("at most ", kMaxDataSources, " strings, got ", a.size())));
            std::vector<std::string> v;
            for (const toml::node& e : a) {
              if (!e.is_string()) return r.WrongType(e, path, kind);
              const std::string& x = e.as_string()->get();
              if (std::find(values.begin(), values.end(), x) == values.end()) {
                return r.Error(path, absl::StrCat("must hold only ", QuotedList(values), ", got \"",
                                                  x.substr(0, 64), "\""));
              }
              RETURN_IF_ERROR(r.Require(std::find(v.begin(), v.end(), x) == v.end(), path,
                                        absl::StrCat("\"", x, "\" is given twice")));
              v.push_back(x);
            }
            *get(s) = std::move(v);
            return absl::OkStatus();
          },
          [get](const JobSpec& s) {
            std::vector<std::string> parts;
            for (const std::string& x : *get(s)) parts.push_back(Quote(x));
            return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
          }};
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

// An array of booleans, at most kMaxDataSources of them.
template <typename Get>
Codec BoolList(Get get) {
  return {"an array of booleans",
          [get](const toml::node& n, const std::string& path, const SpecReader& r, JobSpec& s) {
            if (!n.is_array()) return r.WrongType(n, path, "an array of booleans");
            const toml::array& a = *n.as_array();
            RETURN_IF_ERROR(
                r.Require(a.size() <= kMaxDataSources, path,
                          absl::StrCat("at most ", kMaxDataSources, " booleans, got ", a.size())));
            std::vector<bool> v;
            for (const toml::node& e : a) {
              if (!e.is_boolean()) return r.WrongType(e, path, "an array of booleans");
              v.push_back(e.as_boolean()->get());
            }
            *get(s) = std::move(v);
            return absl::OkStatus();
          },
          [get](const JobSpec& s) {
            std::vector<std::string> parts;
            for (bool b : *get(s)) parts.push_back(b ? "true" : "false");
            return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
          }};
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

}  // namespace spec_internal
}  // namespace ithaca
