// An enum's names, written once: one table of {value, name} gives the name of each value, the
// value of each name and the list of names for messages. The enums the spec, config.json,
// safetensors, the link model and the reports spell each keep their table beside the enum.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ithaca {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `value` in `table`, or `unknown` when the table has none.
template <typename E, size_t N>
constexpr const char* NameOf(const EnumName<E> (&table)[N], E value, const char* unknown = "?") {
  for (const EnumName<E>& e : table) {
    if (e.value == value) return e.name;
  }
  return unknown;
}

// The value named `name` in `table`, or nullopt.
template <typename E, size_t N>
std::optional<E> ValueOf(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& e : table) {
    if (name == e.name) return e.value;
  }
  return std::nullopt;
}

// The names in table order.
template <typename E, size_t N>
std::vector<std::string> NamesOf(const EnumName<E> (&table)[N]) {
  std::vector<std::string> out;
  for (const EnumName<E>& e : table) out.push_back(e.name);
  return out;
}

// The names for a message: "a, b or c" (`last`: " or ", " and "), each in `quote` when given.
template <typename E, size_t N>
std::string NamesText(const EnumName<E> (&table)[N], const char* last = " or ",
                      const char* quote = "") {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? last : ", ";
    out += quote;
    out += table[i].name;
    out += quote;
  }
  return out;
}

}  // namespace ithaca
