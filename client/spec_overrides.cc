#include "client/spec_overrides.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

// As engine/spec/job_spec.cc: errors as values, and toml++'s asserts off (they abort on some
// malformed documents its parser refuses anyway).
#define TOML_EXCEPTIONS 0
#define TOML_ASSERT(expr) static_assert(true)
#include <toml++/toml.h>

namespace ithaca {

absl::StatusOr<std::string> ApplyOverrides(const std::string& toml_text, const std::string& source,
                                           const std::vector<std::string>& overrides) {
  if (overrides.empty()) return toml_text;
  toml::parse_result parsed = toml::parse(toml_text, source);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.source().begin.line, ": ", std::string(e.description())));
  }
  toml::table spec = std::move(parsed).table();
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", o, ": expected KEY=VALUE (e.g. training.steps=10)"));
    }
    const std::string key = o.substr(0, eq);
    const std::string text = o.substr(eq + 1);
    std::vector<std::string> parts = absl::StrSplit(key, '.');
    toml::table* table = &spec;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].empty())
        return absl::InvalidArgumentError(absl::StrCat("--set ", o, ": empty key"));
      toml::node* next = table->get(parts[i]);
      if (next == nullptr) {
        next = &table->insert_or_assign(parts[i], toml::table{}).first->second;
      }
      if (!next->is_table()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--set ", o, ": ", absl::StrJoin(parts.begin(), parts.begin() + i + 1, "."),
            " is not a table in ", source));
      }
      table = next->as_table();
    }
    if (parts.back().empty())
      return absl::InvalidArgumentError(absl::StrCat("--set ", o, ": empty key"));
    toml::parse_result value = toml::parse("v = " + text);
    if (value && value.table().size() == 1 && value.table().contains("v")) {
      table->insert_or_assign(parts.back(), *value.table().get("v"));
    } else {
      table->insert_or_assign(parts.back(), text);
    }
  }
  std::ostringstream out;
  out << toml::toml_formatter(spec);
  return out.str() + "\n";
}

}  // namespace ithaca
