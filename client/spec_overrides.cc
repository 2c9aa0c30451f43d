#include "client/spec_overrides.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#include "engine/spec/toml_text.h"  // toml++ with the engine's settings and guards

namespace ithaca {

absl::StatusOr<std::string> ApplyOverrides(const std::string& toml_text, const std::string& source,
                                           const std::vector<std::string>& overrides) {
  if (overrides.empty()) return toml_text;
  ASSIGN_OR_RETURN(toml::table spec, ParseTomlText(toml_text, source));
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", o, ": expected KEY=VALUE (e.g. training.steps=10)"));
    }
    const std::string key = o.substr(0, eq);
    const std::string text = o.substr(eq + 1);
    std::vector<std::string> parts = absl::StrSplit(key, '.');
    if (parts.size() > static_cast<size_t>(kMaxTomlKeyParts)) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", key.substr(0, 64), "...: more than ",
                                                     kMaxTomlKeyParts, " key parts"));
    }
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
    absl::StatusOr<toml::table> value = ParseTomlText("v = " + text, "--set");
    if (value.ok() && value->size() == 1 && value->contains("v")) {
      table->insert_or_assign(parts.back(), *value->get("v"));
    } else {
      table->insert_or_assign(parts.back(), text);
    }
  }
  std::ostringstream out;
  out << toml::toml_formatter(spec);
  return out.str() + "\n";
}

}  // namespace ithaca
