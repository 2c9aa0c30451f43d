// What config.cc's files share: the JSON reader that names each bad key, and the rotary
// embedding's part of config.json. For engine/model:config's own files only (in its srcs):
//   config.cc       LlamaConfig's methods, ModelTypeName and ValidateConfig
//   config_json.cc  config.json <-> LlamaConfig (ParseConfigJson, LoadConfigJson, ConfigToJson)
//   rope_json.cc    rope_scaling / rope_parameters read and written, and the RoPE in words
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/core/enum_names.h"
#include "engine/core/status.h"
#include "engine/model/config.h"

namespace ithaca {
namespace config_internal {

using Json = nlohmann::json;

// config.json's model_type of each family (ModelTypeName, and the families it reads).
inline constexpr EnumName<ModelFamily> kModelTypeNames[] = {
    {ModelFamily::kLlama, "llama"},
    {ModelFamily::kQwen2, "qwen2"},
    {ModelFamily::kQwen3, "qwen3"},
    {ModelFamily::kMistral, "mistral"},
};

// A short description of a JSON value for error messages; containers are not dumped, so a
// hostile file cannot make the message (or the recursion printing it) large.
std::string Describe(const Json& v);

// Reads typed keys out of one JSON object; every problem becomes an INVALID_ARGUMENT naming the
// source and the key's full path ("config.json: rope_scaling.factor: ...").
class KeyReader {
 public:
  KeyReader(const Json& obj, const std::string& source, const std::string& prefix)
      : obj_(obj), source_(source), prefix_(prefix) {}

  absl::Status Error(const std::string& key, const std::string& problem) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, key, ": ", problem));
  }

  // The value, or nullptr when the key is absent or null (Hugging Face writes null for unset).
  const Json* Find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  // Leaves *out untouched when an optional key is absent.
  absl::Status Int(const std::string& key, bool required, int64_t* out) const {
    const Json* v = Find(key);
    if (!v) return required ? Error(key, "missing (required)") : absl::OkStatus();
    if (v->is_number_unsigned() && v->get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
      return Error(key, absl::StrCat("out of range, got ", Describe(*v)));
    }
    if (v->is_number_integer()) {
      *out = v->get<int64_t>();
      return absl::OkStatus();
    }
    // 2048.0 is an integer written by a sloppy tool; 2048.5 is not.
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
        *out = static_cast<int64_t>(d);
        return absl::OkStatus();
      }
    }
    return Error(key, absl::StrCat("expected an integer, got ", Describe(*v)));
  }

  absl::Status Number(const std::string& key, bool required, double* out) const {
    const Json* v = Find(key);
    if (!v) return required ? Error(key, "missing (required)") : absl::OkStatus();
    if (!v->is_number()) return Error(key, absl::StrCat("expected a number, got ", Describe(*v)));
    *out = v->get<double>();
    return absl::OkStatus();
  }

  absl::Status Bool(const std::string& key, bool* out) const {
    const Json* v = Find(key);
    if (!v) return absl::OkStatus();
    if (!v->is_boolean()) return Error(key, absl::StrCat("expected a boolean, got ", Describe(*v)));
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  // Optional string; *present tells whether it was there.
  absl::Status String(const std::string& key, std::string* out, bool* present) const {
    const Json* v = Find(key);
    *present = v != nullptr;
    if (!v) return absl::OkStatus();
    if (!v->is_string()) return Error(key, absl::StrCat("expected a string, got ", Describe(*v)));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

 private:
  const Json& obj_;
  const std::string& source_;
  std::string prefix_;
};

// ---- rope_json.cc.

// Fills cfg->rope_theta and cfg->rope from either dialect (rope_scaling, rope_parameters). Where a
// file states a value twice (rope_theta at the top level and inside the rope object; both rope
// objects), the statements must agree: picking one silently could train a model the file's
// author did not mean.
absl::Status ParseRope(const Json& root, const std::string& source, LlamaConfig* cfg);
// The rope object transformers reads back as `cfg.rope` (null for the default rope).
Json RopeJson(const RopeConfig& r);

}  // namespace config_internal
}  // namespace ithaca
