#include "engine/spec/overrides.h"

#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#include "engine/spec/toml_text.h"  // toml++ with the engine's settings and guards

namespace ithaca {

absl::StatusOr<std::string> ApplyOverrides(const std::string& toml_text, const std::string& source,
                                           const std::vector<std::string>& overrides,
                                           const std::string& flag_in) {
  const std::string flag = flag_in.empty() ? "--set" : flag_in;
  if (overrides.empty()) return toml_text;
  if (overrides.size() > kMaxOverrides) {
    return absl::InvalidArgumentError(absl::StrCat(
        overrides.size(), " ", flag, " overrides: at most ", kMaxOverrides, " in one request"));
  }
  ASSIGN_OR_RETURN(toml::table spec, ParseTomlText(toml_text, source));
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", o, ": expected KEY=VALUE (e.g. training.steps=10)"));
    }
    const std::string key = o.substr(0, eq);
    const std::string text = o.substr(eq + 1);
    std::vector<std::string> parts = absl::StrSplit(key, '.');
    if (parts.size() > static_cast<size_t>(kMaxTomlKeyParts)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", key.substr(0, 64), "...: more than ", kMaxTomlKeyParts, " key parts"));
    }
    toml::table* table = &spec;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].empty())
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", o, ": empty key"));
      toml::node* next = table->get(parts[i]);
      if (next == nullptr) {
        next = &table->insert_or_assign(parts[i], toml::table{}).first->second;
      }
      if (!next->is_table()) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, " ", o, ": ", absl::StrJoin(parts.begin(), parts.begin() + i + 1, "."),
            " is not a table in ", source));
      }
      table = next->as_table();
    }
    if (parts.back().empty())
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", o, ": empty key"));
    absl::StatusOr<toml::table> value = ParseTomlText("v = " + text, flag);
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

namespace {

// The line of every key of `table` (dotted path -> line), as the daemon's parser counts them.
void KeyLines(const toml::table& table, const std::string& prefix,
              std::map<std::string, int>* out) {
  for (auto&& [k, node] : table) {
    const std::string path =
        prefix.empty() ? std::string(k.str()) : absl::StrCat(prefix, ".", std::string(k.str()));
    (*out)[path] = static_cast<int>(k.source().begin.line);
    if (node.is_table()) KeyLines(*node.as_table(), path, out);
  }
}

}  // namespace

std::string ExplainSpecError(const std::string& message, const std::string& toml_text,
                             const std::string& source, const std::vector<std::string>& overrides,
                             const std::string& flag) {
  if (overrides.empty()) return message;
  // "SOURCE: KEY: what (line N)hint", as engine/spec/job_spec.cc writes it.
  const std::string head = source + ": ";
  const size_t at = message.find(head);
  if (at == std::string::npos) return message;
  const size_t key_start = at + head.size();
  const size_t key_end = message.find(": ", key_start);
  if (key_end == std::string::npos) return message;
  const std::string key = message.substr(key_start, key_end - key_start);
  const size_t line_at = message.find(" (line ", key_end);
  const size_t line_end = line_at == std::string::npos ? line_at : message.find(')', line_at);
  int sent_line = 0;
  if (line_end == std::string::npos ||
      !absl::SimpleAtoi(message.substr(line_at + 7, line_end - line_at - 7), &sent_line)) {
    return message;
  }
  std::string where;
  // The last --set of the key (or of a table above it) wins, as in ApplyOverrides.
  for (const std::string& o : overrides) {
    const std::string set_key = o.substr(0, o.find('='));
    // The key itself, a key under a table the --set replaced, or (an unknown section) the
    // section of the --set's key.
    if (set_key == key || absl::StartsWith(key, set_key + ".") ||
        absl::StartsWith(set_key, key + ".")) {
      where = absl::StrCat("from ", flag.empty() ? "--set" : flag, " ", o);
    }
  }
  if (where.empty()) {
    absl::StatusOr<toml::table> parsed = ParseTomlText(toml_text, source);
    if (!parsed.ok()) return message;
    std::map<std::string, int> lines;
    KeyLines(*parsed, "", &lines);
    auto it = lines.find(key);
    if (it == lines.end()) return message;
    where = absl::StrCat("line ", it->second);
  }
  return absl::StrCat(message.substr(0, line_at), " (", where, message.substr(line_end));
}

}  // namespace ithaca
