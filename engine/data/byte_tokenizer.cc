#include "engine/data/byte_tokenizer.h"

namespace ithaca {

std::vector<uint32_t> ByteTokenize(const std::string& text) {
  std::vector<uint32_t> out;
  out.reserve(text.size() + text.size() / 64 + 1);
  bool in_doc = false;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;  // the line with its newline
    bool blank = text.find_first_not_of(" \t\r\n", start) >= end;
    if (blank) {
      in_doc = false;  // blank lines separate documents and belong to neither
    } else {
      if (!in_doc) out.push_back(kByteBos);
      in_doc = true;
      for (size_t i = start; i < end; ++i) out.push_back(static_cast<unsigned char>(text[i]));
    }
    start = end;
  }
  return out;
}

TokenFileMeta ByteTokenMeta(const std::vector<uint32_t>& tokens) {
  TokenFileMeta m;
  m.vocab_size = kByteVocab;
  m.bos_id = kByteBos;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == kByteBos) m.doc_starts.push_back(i);
  }
  return m;
}

}  // namespace ithaca
