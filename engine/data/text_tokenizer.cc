#include "engine/data/text_tokenizer.h"

#include <sys/stat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"

namespace ithaca {
namespace {

class ByteTokenizer final : public TextTokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size());
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  int32_t bos() const override { return static_cast<int32_t>(kByteBos); }
  std::string name() const override { return "byte-level"; }
};

// GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others for code points
// from 256 on; each as UTF-8.
std::vector<std::string> ByteSymbols() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    out[b] = s;
  }
  return out;
}

// How the pre-tokenizer's regex splits ASCII text. Every known pattern (GPT-2's, Llama 3's,
// Qwen2's) ends in the same whitespace rules; they differ in what may lead a run of letters and
// in how digits group.
struct Split {
  bool letter_prefix_any = false;  // [^\r\n\p{L}\p{N}]?\p{L}+ (else " ?\p{L}+")
  bool digit_space = false;        // " ?\p{N}+"
  int digit_group = 0;             // \p{N}{1,k}: k; 0: a whole run
  bool punct_newlines = false;     // " ?[^\s\p{L}\p{N}]+[\r\n]*"
};

bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNewline(char c) { return c == '\n' || c == '\r'; }
bool IsOther(char c) { return !IsSpace(c) && !IsLetter(c) && !IsDigit(c); }

// The pieces the pattern's alternatives match, in order, for ASCII text (no contractions: the
// callers' text has no apostrophes; Encode refuses them).
std::vector<std::string> PreTokenize(const std::string& t, const Split& sp) {
  std::vector<std::string> out;
  const size_t n = t.size();
  size_t i = 0;
  auto run = [&](size_t j, bool (*pred)(char)) {
    while (j < n && pred(t[j])) ++j;
    return j;
  };
  while (i < n) {
    const char c = t[i];
    size_t j = i;
    // Letters, with the one character the pattern lets lead them.
    const bool lead =
        sp.letter_prefix_any ? !IsLetter(c) && !IsDigit(c) && !IsNewline(c) : c == ' ';
    if (IsLetter(c)) {
      j = run(i, IsLetter);
    } else if (lead && i + 1 < n && IsLetter(t[i + 1])) {
      j = run(i + 1, IsLetter);
    } else if (IsDigit(c) || (sp.digit_space && c == ' ' && i + 1 < n && IsDigit(t[i + 1]))) {
      const size_t start = c == ' ' ? i + 1 : i;
      j = run(start, IsDigit);
      if (sp.digit_group > 0) j = std::min(j, start + sp.digit_group);
    } else if (IsOther(c) || (c == ' ' && i + 1 < n && IsOther(t[i + 1]))) {
      j = run(c == ' ' ? i + 1 : i, IsOther);
      if (sp.punct_newlines) j = run(j, IsNewline);
    } else {
      // Whitespace: \s*[\r\n]+ (Llama 3, Qwen2), then \s+(?!\S), then \s+.
      const size_t end = run(i, IsSpace);
      size_t last_newline = end;
      for (size_t k = i; k < end; ++k) {
        if (IsNewline(t[k])) last_newline = k;
      }
      if (sp.punct_newlines && last_newline != end) {
        j = last_newline + 1;
      } else if (end == n || end - i == 1) {
        j = end;
      } else {
        j = end - 1;  // the last space goes with what follows
      }
    }
    out.push_back(t.substr(i, j - i));
    i = j;
  }
  return out;
}

// The BOS a tokenizer.json's post-processor puts first (TemplateProcessing's "single" template
// starting with a special token, alone or inside a Sequence), or -1.
int32_t PostProcessorBos(const nlohmann::json& post) {
  if (!post.is_object()) return -1;
  const std::string type = post.value("type", std::string());
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const nlohmann::json& p : post["processors"]) {
      const int32_t bos = PostProcessorBos(p);
      if (bos >= 0) return bos;
    }
    return -1;
  }
  if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array() ||
      post["single"].empty()) {
    return -1;
  }
  const nlohmann::json& first = post["single"][0];
  if (!first.is_object() || !first.contains("SpecialToken")) return -1;
  const std::string name = first["SpecialToken"].value("id", std::string());
  const nlohmann::json& specials = post.value("special_tokens", nlohmann::json());
  if (!specials.is_object() || !specials.contains(name)) return -1;
  const nlohmann::json& ids = specials[name].value("ids", nlohmann::json());
  if (!ids.is_array() || ids.empty() || !ids[0].is_number_integer()) return -1;
  return ids[0].get<int32_t>();
}

class BpeTokenizer final : public TextTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<TextTokenizer>> Load(const std::string& path) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxTokenizerBytes));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto refuse = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", why,
                       "; the engine's own encoder (for the passkey eval's prompts) reads "
                       "byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2/2.5/3)"));
    };
    if (j.is_discarded() || !j.is_object()) return refuse("not valid JSON");
    const nlohmann::json& model = j.value("model", nlohmann::json());
    if (!model.is_object() || model.value("type", std::string()) != "BPE") {
      return refuse("its model is not of type \"BPE\"");
    }
    std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
    t->path_ = path;
    t->bos_ = PostProcessorBos(j.value("post_processor", nlohmann::json()));
    t->ignore_merges_ = model.value("ignore_merges", false);
    const nlohmann::json& vocab = model.value("vocab", nlohmann::json());
    if (!vocab.is_object()) return refuse("model.vocab is not an object");
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer()) return refuse("a model.vocab id is not an integer");
      t->vocab_[it.key()] = it.value().get<int32_t>();
    }
    const nlohmann::json& merges = model.value("merges", nlohmann::json());
    if (!merges.is_array()) return refuse("model.merges is not an array");
    int rank = 0;
    for (const nlohmann::json& m : merges) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos)
          return refuse("a merge \"" + s.substr(0, 64) + "\" has no space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        return refuse("a merge is neither \"a b\" nor [a, b]");
      }
      t->ranks_.emplace(std::make_pair(std::move(a), std::move(b)), rank++);
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const std::string type = j["normalizer"].value("type", std::string());
      // NFC leaves ASCII as it is; anything else could change the text.
      if (type != "NFC") return refuse("its normalizer is " + type);
    }
    ASSIGN_OR_RETURN(t->split_,
                     ReadPreTokenizer(j.value("pre_tokenizer", nlohmann::json()), refuse));
    t->bytes_ = ByteSymbols();
    return std::unique_ptr<TextTokenizer>(std::move(t));
  }

  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    for (char c : text) {
      const bool ok = (c >= 0x20 && c < 0x7f && c != '\'') || c == '\n';
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the engine's BPE encoder takes printable ASCII without apostrophes, got byte ",
            static_cast<int>(static_cast<unsigned char>(c))));
      }
    }
    std::string input = text;
    if (add_prefix_space_ && !input.empty() && input[0] != ' ') input = " " + input;
    std::vector<int32_t> out;
    for (const std::string& piece : PreTokenize(input, split_)) {
      RETURN_IF_ERROR(EncodePiece(piece, &out));
    }
    return out;
  }
  int32_t bos() const override { return bos_; }
  std::string name() const override { return path_; }

 private:
  BpeTokenizer() = default;

  template <typename Refuse>
  static absl::StatusOr<Split> ReadPreTokenizer(const nlohmann::json& pre, Refuse refuse) {
    // ByteLevel with use_regex (GPT-2), or Sequence[Split(Regex), ByteLevel(use_regex false)].
    std::string pattern;
    bool byte_level = false;
    std::vector<nlohmann::json> parts;
    if (pre.is_object() && pre.value("type", std::string()) == "Sequence" &&
        pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
      for (const nlohmann::json& p : pre["pretokenizers"]) parts.push_back(p);
    } else if (pre.is_object()) {
      parts.push_back(pre);
    }
    Split sp;
    for (const nlohmann::json& p : parts) {
      const std::string type = p.is_object() ? p.value("type", std::string()) : "";
      if (type == "ByteLevel") {
        byte_level = true;
        if (p.value("use_regex", true)) {
          pattern = "GPT-2";
        }
        if (p.value("add_prefix_space", false)) return refuse("ByteLevel add_prefix_space is set");
      } else if (type == "Split" && p.contains("pattern") && p["pattern"].is_object() &&
                 p["pattern"].contains("Regex") && p["pattern"]["Regex"].is_string()) {
        if (p.value("behavior", std::string()) != "Isolated" || p.value("invert", false)) {
          return refuse("its Split pre-tokenizer is not Isolated");
        }
        pattern = p["pattern"]["Regex"].get<std::string>();
      } else {
        return refuse("its pre-tokenizer has a part of type \"" + type + "\"");
      }
    }
    if (!byte_level) return refuse("its pre-tokenizer is not ByteLevel");
    auto has = [&](const char* s) { return pattern.find(s) != std::string::npos; };
    if (pattern == "GPT-2") {
      sp.digit_space = true;
    } else if (has("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+") || has("[^\\r\\n\\p{L}\\p{N}]?[\\p{L}")) {
      sp.letter_prefix_any = true;
      sp.punct_newlines = has("[\\r\\n]*");
      if (has("\\p{N}{1,3}")) {
        sp.digit_group = 3;
      } else if (has("\\p{N}+")) {
        sp.digit_group = 0;
      } else if (has("\\p{N}")) {
        sp.digit_group = 1;
      } else {
        return refuse("its Split pattern's digits are not recognised");
      }
    } else {
      return refuse("its Split pattern is not GPT-2's, Llama 3's or Qwen2's");
    }
    return sp;
  }

  absl::Status EncodePiece(const std::string& piece, std::vector<int32_t>* out) const {
    std::vector<std::string> sym;
    std::string whole;
    for (unsigned char c : piece) {
      sym.push_back(bytes_[c]);
      whole += bytes_[c];
    }
    if (ignore_merges_) {
      auto it = vocab_.find(whole);
      if (it != vocab_.end()) {
        out->push_back(it->second);
        return absl::OkStatus();
      }
    }
    // The pair of lowest merge rank merges first, leftmost on a tie, until none is left.
    while (sym.size() > 1) {
      int best = -1;
      size_t at = 0;
      for (size_t k = 0; k + 1 < sym.size(); ++k) {
        auto it = ranks_.find({sym[k], sym[k + 1]});
        if (it != ranks_.end() && (best < 0 || it->second < best)) {
          best = it->second;
          at = k;
        }
      }
      if (best < 0) break;
      sym[at] += sym[at + 1];
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (const std::string& s : sym) {
      auto it = vocab_.find(s);
      if (it == vocab_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path_, ": \"", piece, "\" encodes to \"", s,
                                                       "\", which is not in its vocab"));
      }
      out->push_back(it->second);
    }
    return absl::OkStatus();
  }

  std::string path_;
  int32_t bos_ = -1;
  bool ignore_merges_ = false, add_prefix_space_ = false;
  Split split_;
  std::map<std::string, int32_t> vocab_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::vector<std::string> bytes_;
};

}  // namespace

std::unique_ptr<TextTokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadBpeTokenizer(const std::string& json_path) {
  return BpeTokenizer::Load(json_path);
}

std::string ModelSourceDir(const JobSpec& spec) {
  if (!spec.model.config.empty()) {
    size_t slash = spec.model.config.rfind('/');
    return slash == std::string::npos ? "." : spec.model.config.substr(0, slash);
  }
  if (!spec.model.weights.empty()) {
    struct stat st;
    const std::string& w = spec.model.weights;
    if (stat(w.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return w;
    size_t slash = w.rfind('/');
    return slash == std::string::npos ? "." : w.substr(0, slash);
  }
  return "";
}

std::string ModelTokenizerJson(const JobSpec& spec) {
  const std::string dir = ModelSourceDir(spec);
  if (dir.empty()) return "";
  std::string json = dir + "/tokenizer.json";
  return PathExists(json) ? json : "";
}

absl::StatusOr<std::unique_ptr<TextTokenizer>> OpenModelTokenizer(const JobSpec& spec) {
  const std::string json = ModelTokenizerJson(spec);
  if (json.empty() || spec.data.byte_tokens) return MakeByteTokenizer();
  return LoadBpeTokenizer(json);
}

}  // namespace ithaca
