// The guards in front of toml++ and the one call into its parser (toml_text.h).
#include "engine/spec/toml_text.h"

#include "absl/strings/ascii.h"

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

// The parts of every dotted key and table header, counted outside strings and comments: a run
// of key characters, spaces, quoted parts and dots, ended by anything else ('=', a bracket, a
// comma, a new line). A float or a date has at most one dot per run, so no value is refused.
// Quoted parts are skipped as single-line strings, so a quoted '=' or '.' does not end or count.
absl::Status CheckKeyDepth(const std::string& text, const std::string& source) {
  int line = 1, dots = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"' || c == '\'') {
      const bool multi = text.compare(i, 3, c == '"' ? "\"\"\"" : "'''") == 0;
      if (multi) {  // a multi-line string is a value, never a key: skip it whole
        size_t end = text.find(c == '"' ? "\"\"\"" : "'''", i + 3);
        if (end == std::string::npos) return absl::OkStatus();  // toml++ reports it
        for (size_t j = i; j < end; ++j) line += text[j] == '\n';
        i = end + 2;
        continue;
      }
      size_t j = i + 1;
      while (j < text.size() && text[j] != c && text[j] != '\n')
        j += (c == '"' && text[j] == '\\') ? 2 : 1;
      if (j >= text.size() || text[j] == '\n') return absl::OkStatus();  // toml++ reports it
      i = j;
      continue;
    }
    if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '.') {
      if (++dots >= kMaxTomlKeyParts) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ":", line, ": invalid TOML: a dotted key or table header of more than ",
            kMaxTomlKeyParts, " parts"));
      }
      continue;
    }
    const bool in_run = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                        c == '-' || c == '+' || c == ' ' || c == '\t' ||
                        static_cast<unsigned char>(c) >= 0x80;
    if (!in_run) dots = 0;
    if (c == '\n') ++line;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<toml::table> ParseTomlText(const std::string& text, const std::string& source) {
  if (text.size() > kMaxTomlBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", text.size(), " bytes of TOML; at most ", kMaxTomlBytes, " are read"));
  }
  RETURN_IF_ERROR(CheckNonAsciiPlacement(text, source));
  RETURN_IF_ERROR(CheckKeyDepth(text, source));
  toml::parse_result parsed = toml::parse(text, source);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.source().begin.line, ":", e.source().begin.column,
                     ": invalid TOML: ", std::string(e.description())));
  }
  return std::move(parsed).table();
}

}  // namespace ithaca
