// safetensors reading (mmap, every header validated at Open) and atomic writing, single-file and
// sharded in Hugging Face's layout.
#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/file_util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as is"
#endif

namespace ithaca {
namespace {

using Json = nlohmann::json;

constexpr char kSingleName[] = "model.safetensors";
constexpr char kIndexName[] = "model.safetensors.index.json";
// The reference implementation refuses larger headers; so do we (a corrupt length is far larger).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

const char* FileDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
  }
  return "?";
}

bool ParseFileDType(const std::string& s, DType* out) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
    if (s == FileDTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A whole file mapped read-only; unmapped on destruction.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));  // never blocks on a FIFO
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
    }
    auto f = std::unique_ptr<MappedFile>(new MappedFile(path, static_cast<size_t>(st.st_size)));
    if (f->size_ > 0) {  // mmap of length 0 fails; such a file is rejected by the caller
      void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        std::string err = std::strerror(errno);
        ::close(fd);
        return absl::ResourceExhaustedError(absl::StrCat(path, ": mmap failed: ", err));
      }
      f->data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping stays valid
    return f;
  }
  ~MappedFile() {
    if (data_) munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, size_t size) : path_(std::move(path)), size_(size) {}
  std::string path_;
  size_t size_ = 0;
  const uint8_t* data_ = nullptr;
};

struct Entry {
  TensorInfo info;
  const MappedFile* file;
  uint64_t begin;  // absolute byte offsets in the file
  uint64_t end;
};

// Parses and validates one file's header, filling `tensors` and `metadata`.
absl::Status ParseHeader(const MappedFile& f, std::map<std::string, Entry>* tensors,
                         std::map<std::string, std::string>* metadata) {
  const std::string& path = f.path();
  auto loss = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  if (f.size() < 8) {
    return loss(absl::StrCat("file is ", f.size(), " bytes, too short for a safetensors header"));
  }
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8) {
    return loss(absl::StrCat("header length ", n, " exceeds the file (", f.size(),
                             " bytes): truncated or not a safetensors file"));
  }
  if (n > kMaxHeaderBytes) return loss(absl::StrCat("header length ", n, " is implausibly large"));
  const uint64_t data_start = 8 + n;
  const uint64_t buffer = f.size() - data_start;
  Json header;
  try {
    header = Json::parse(f.data() + 8, f.data() + data_start);
  } catch (const Json::parse_error& e) {
    // Never the parser's message: it quotes the file's bytes.
    return loss(absl::StrCat("header is not valid JSON (truncated or corrupt; parse error at byte ",
                             8 + (e.byte > 0 ? e.byte - 1 : 0), ")"));
  } catch (const Json::exception&) {
    return loss("header is not valid JSON (truncated or corrupt)");
  }
  if (!header.is_object()) return loss("header is not a JSON object");

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return loss("__metadata__ is not an object");
      for (const auto& [key, value] : v.items()) {
        if (!value.is_string()) {
          return loss(absl::StrCat("__metadata__.", key, " is not a string"));
        }
        (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    // C++17 lambdas cannot capture a structured binding (gcc allows it, clang does not).
    auto bad = [&loss, &tensor = name](const std::string& what) {
      return loss(absl::StrCat("tensor '", tensor, "': ", what));
    };
    if (!v.is_object()) return bad("entry is not an object");
    auto dt = v.find("dtype");
    auto shape = v.find("shape");
    auto offsets = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad("missing or non-string \"dtype\"");
    if (shape == v.end() || !shape->is_array()) return bad("missing or non-array \"shape\"");
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return bad("\"data_offsets\" is not a pair of non-negative integers");
    }
    Entry e;
    e.file = &f;
    const std::string dtype_name = dt->get<std::string>();
    if (!ParseFileDType(dtype_name, &e.info.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' has dtype ", dtype_name,
                       ", which Ithaca does not read (only F32, BF16 and I32)"));
    }
    // Elements times element size, capped so it cannot overflow: anything over the buffer fails.
    constexpr uint64_t kHuge = uint64_t{1} << 62;
    uint64_t bytes = DTypeSize(e.info.dtype);
    bool too_big = false, has_zero = false;
    for (const Json& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > kHuge) {
        return bad("shape has a size that is not an integer in [0, 2^62]");
      }
      const uint64_t dim = d.get<uint64_t>();
      e.info.shape.push_back(static_cast<int64_t>(dim));
      if (dim == 0) {
        has_zero = true;
      } else if (bytes > kHuge / dim) {
        too_big = true;
      } else {
        bytes *= dim;
      }
    }
    // Even with a zero size, a product beyond 2^62 would overflow NumElements() for callers.
    if (too_big) return bad(absl::StrCat("shape ", ShapeString(e.info.shape), " is too large"));
    if (has_zero) bytes = 0;
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin > end) return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
    if (end > buffer) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] extend past the data (",
                              buffer, " bytes): file truncated or corrupt"));
    }
    if (end - begin != bytes) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] span ", end - begin,
                              " bytes, but ", dtype_name, " ", ShapeString(e.info.shape), " needs ",
                              bytes));
    }
    e.begin = data_start + begin;
    e.end = data_start + end;
    auto [it, inserted] = tensors->emplace(name, e);
    if (!inserted) return bad("appears twice");
    ranges.push_back({begin, end, &it->first});
  }

  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;  // empty tensors occupy no bytes
    if (prev && r.begin < prev->end) {
      return loss(absl::StrCat("tensors '", *prev->name, "' and '", *r.name, "' overlap ([",
                               prev->begin, ", ", prev->end, ") and [", r.begin, ", ", r.end,
                               "))"));
    }
    prev = &r;
  }
  return absl::OkStatus();
}

class MappedReader : public SafetensorsReader {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenFile(const std::string& path) {
    auto r = std::unique_ptr<MappedReader>(new MappedReader(path));
    ASSIGN_OR_RETURN(auto f, MappedFile::Open(path));
    RETURN_IF_ERROR(ParseHeader(*f, &r->entries_, &r->metadata_));
    r->files_.push_back(std::move(f));
    return std::unique_ptr<SafetensorsReader>(std::move(r));
  }

  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenIndex(const std::string& path) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    auto bad = [&](const std::string& what) {
      return absl::DataLossError(absl::StrCat(path, ": ", what));
    };
    Json index;
    try {
      index = Json::parse(text);
    } catch (const Json::parse_error& e) {
      // Never the parser's message: it quotes the file's bytes.
      return bad(
          absl::StrCat("not valid JSON (parse error at byte ", e.byte > 0 ? e.byte - 1 : 0, ")"));
    } catch (const Json::exception&) {
      return bad("not valid JSON");
    }
    auto wm = index.is_object() ? index.find("weight_map") : index.end();
    if (wm == index.end() || !wm->is_object()) return bad("no \"weight_map\" object");

    auto r = std::unique_ptr<MappedReader>(new MappedReader(path));
    const std::string dir = Dirname(path);
    std::map<std::string, std::map<std::string, Entry>> shards;  // by shard file name
    for (const auto& [name, shard] : wm->items()) {
      if (!shard.is_string()) return bad(absl::StrCat("weight_map['", name, "'] is not a string"));
      const std::string file = shard.get<std::string>();
      auto it = shards.find(file);
      if (it == shards.end()) {
        const std::string shard_path = absl::StrCat(dir, "/", file);
        auto f = MappedFile::Open(shard_path);
        if (!f.ok()) {
          return absl::Status(f.status().code(), absl::StrCat(path, ": shard ", file, " (holding '",
                                                              name, "'): ", f.status().message()));
        }
        it = shards.emplace(file, std::map<std::string, Entry>()).first;
        RETURN_IF_ERROR(ParseHeader(**f, &it->second, &r->metadata_));
        r->files_.push_back(*std::move(f));
      }
      auto e = it->second.find(name);
      if (e == it->second.end()) {
        return bad(
            absl::StrCat("weight_map puts '", name, "' in ", file, ", which has no such tensor"));
      }
      r->entries_.emplace(name, e->second);
    }
    return std::unique_ptr<SafetensorsReader>(std::move(r));
  }

  std::vector<std::string> Names() const override {
    std::vector<std::string> names;
    for (const auto& kv : entries_) names.push_back(kv.first);
    return names;
  }

  bool Has(const std::string& name) const override { return entries_.count(name) > 0; }

  absl::StatusOr<TensorInfo> Info(const std::string& name) const override {
    ASSIGN_OR_RETURN(const Entry* e, Find(name));
    return e->info;
  }

  std::map<std::string, std::string> Metadata() const override { return metadata_; }

  absl::Status Read(const std::string& name, const Shape& expected, DType dst_dtype,
                    void* dst) const override {
    return ReadRange(name, expected, 0, NumElements(expected), dst_dtype, dst);
  }

  absl::Status ReadRange(const std::string& name, const Shape& expected, int64_t begin,
                         int64_t count, DType dst_dtype, void* dst) const override {
    ASSIGN_OR_RETURN(const Entry* e, Find(name));
    const std::string& path = e->file->path();
    if (e->info.shape != expected) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' has shape ",
                                                     ShapeString(e->info.shape), ", expected ",
                                                     ShapeString(expected)));
    }
    const int64_t numel = NumElements(expected);
    if (begin < 0 || count < 0 || begin > numel || count > numel - begin) {
      return absl::OutOfRangeError(absl::StrCat(path, ": tensor '", name, "' has ", numel,
                                                " elements; cannot read [", begin, ", ",
                                                begin + count, ")"));
    }
    const DType src = e->info.dtype;
    const size_t elem = DTypeSize(src);
    const uint8_t* p = e->file->data() + e->begin + static_cast<size_t>(begin) * elem;
    const size_t n = static_cast<size_t>(count);
    if (n * elem >= (size_t{1} << 20)) {
      // Large ranges: ask for the whole range to be read ahead at once rather than page fault
      // by page fault (a hint: its failure changes nothing).
      const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
      const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
      madvise(reinterpret_cast<void*>(lo), reinterpret_cast<uintptr_t>(p) + n * elem - lo,
              MADV_WILLNEED);
    }
    if (src == dst_dtype) {
      if (n) std::memcpy(dst, p, n * elem);
    } else if (src == DType::kBF16 && dst_dtype == DType::kF32) {
      float* out = static_cast<float*>(dst);
      for (size_t i = 0; i < n; ++i) {
        bf16 b;
        std::memcpy(&b.bits, p + 2 * i, 2);  // the mapping need not be aligned
        out[i] = Bf16ToFloat(b);
      }
    } else if (src == DType::kF32 && dst_dtype == DType::kBF16) {
      bf16* out = static_cast<bf16*>(dst);
      for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        out[i] = FloatToBf16(f);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is ",
                                                     FileDTypeName(src), "; cannot read it as ",
                                                     DTypeName(dst_dtype)));
    }
    return absl::OkStatus();
  }

 private:
  explicit MappedReader(std::string source) : source_(std::move(source)) {}

  absl::StatusOr<const Entry*> Find(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat(source_, ": no tensor named '", name, "'"));
    }
    return &it->second;
  }

  std::string source_;  // what the caller opened, for NOT_FOUND messages
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write (a view of SafetensorsWriter's private Entry).
struct Pending {
  const std::string* name;
  DType data_dtype;
  const Shape* shape;
  const void* data;
  DType file_dtype;
  uint64_t file_bytes() const { return NumElements(*shape) * DTypeSize(file_dtype); }
};

// A template so it can take SafetensorsWriter's private Entry without naming it.
template <typename WriterEntry>
std::vector<Pending> ToPending(const std::vector<WriterEntry>& entries) {
  std::vector<Pending> all;
  for (const WriterEntry& e : entries) {
    all.push_back({&e.name, e.data_dtype, &e.shape, e.data, e.file_dtype});
  }
  return all;
}

absl::Status CheckPending(const std::vector<Pending>& all) {
  std::set<std::string> seen;
  for (const Pending& t : all) {
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", *t.name, "': ", what));
    };
    if (t.name->empty() || *t.name == "__metadata__") return bad("reserved or empty name");
    if (!seen.insert(*t.name).second) return bad("added twice");
    for (int64_t d : *t.shape) {
      if (d < 0) return bad(absl::StrCat("negative size in shape ", ShapeString(*t.shape)));
    }
    const bool is_int = t.data_dtype == DType::kI32, to_int = t.file_dtype == DType::kI32;
    if (is_int != to_int) {
      return bad(absl::StrCat("cannot convert ", DTypeName(t.data_dtype), " to ",
                              DTypeName(t.file_dtype)));
    }
  }
  return absl::OkStatus();
}

// Writes `tensors` and `metadata` as one file, atomically. Data is laid out by decreasing element
// size, then name (as the reference implementation does), so every tensor is aligned to its
// element size; the header is padded with spaces to a multiple of 8 bytes.
// One file's layout: its tensors in file order (the larger dtype first, then by name), each
// one's data offset from the start of the file, and the header (its length prefix included).
struct FileLayout {
  std::vector<Pending> tensors;
  std::vector<uint64_t> offsets;
  std::string header;
};

absl::StatusOr<FileLayout> LayOut(const std::string& path, std::vector<Pending> tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const Pending& a, const Pending& b) {
    const size_t sa = DTypeSize(a.file_dtype), sb = DTypeSize(b.file_dtype);
    return sa != sb ? sa > sb : *a.name < *b.name;
  });
  Json header = Json::object();  // std::map-backed: keys sorted
  if (!metadata.empty()) header["__metadata__"] = metadata;
  FileLayout l;
  uint64_t offset = 0;
  for (const Pending& t : tensors) {
    const uint64_t bytes = t.file_bytes();
    header[*t.name] = {{"dtype", FileDTypeName(t.file_dtype)},
                       {"shape", *t.shape},
                       {"data_offsets", {offset, offset + bytes}}};
    l.offsets.push_back(offset);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {  // names or metadata that are not UTF-8
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot encode header: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  l.header.assign(reinterpret_cast<const char*>(&n), 8);
  l.header += text;
  for (uint64_t& o : l.offsets) o += l.header.size();
  l.tensors = std::move(tensors);
  return l;
}

// Hands `out(bytes, n)` a tensor's `count` elements of `data` as `file_dtype`, converted a chunk
// at a time (or all at once when no conversion is needed).
template <typename Out>
absl::Status ForEachChunk(const void* data, DType data_dtype, DType file_dtype, size_t count,
                          Out&& out) {
  if (data_dtype == file_dtype) return out(data, count * DTypeSize(data_dtype));
  constexpr size_t kChunk = 1 << 16;  // elements converted per write
  std::vector<uint8_t> buf;
  for (size_t i0 = 0; i0 < count; i0 += kChunk) {
    const size_t m = std::min(kChunk, count - i0);
    buf.resize(m * DTypeSize(file_dtype));
    if (data_dtype == DType::kF32) {  // f32 -> bf16
      const float* src = static_cast<const float*>(data) + i0;
      bf16* o = reinterpret_cast<bf16*>(buf.data());
      for (size_t i = 0; i < m; ++i) o[i] = FloatToBf16(src[i]);
    } else {  // bf16 -> f32
      const bf16* src = static_cast<const bf16*>(data) + i0;
      float* o = reinterpret_cast<float*>(buf.data());
      for (size_t i = 0; i < m; ++i) o[i] = Bf16ToFloat(src[i]);
    }
    RETURN_IF_ERROR(out(buf.data(), buf.size()));
  }
  return absl::OkStatus();
}

absl::Status WriteOne(const std::string& path, std::vector<Pending> tensors,
                      const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(FileLayout l, LayOut(path, std::move(tensors), metadata));
  for (const Pending& t : l.tensors) {
    if (!t.data && NumElements(*t.shape) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", *t.name, "': no data to write (null)"));
    }
  }
  ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(w.Write(l.header));
  for (const Pending& t : l.tensors) {
    RETURN_IF_ERROR(ForEachChunk(t.data, t.data_dtype, t.file_dtype,
                                 static_cast<size_t>(NumElements(*t.shape)),
                                 [&](const void* p, size_t n) { return w.Write(p, n); }));
  }
  return w.Commit();
}

// The file of `tensors` opened with its header written, its tensors to come by Put.
absl::StatusOr<std::unique_ptr<SafetensorsPieceWriter>> OpenPieces(
    const std::string& path, std::string name, std::vector<Pending> tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(FileLayout l, LayOut(path, std::move(tensors), metadata));
  ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(w.Write(l.header));
  std::map<std::string, SafetensorsPieceWriter::Slot> slots;
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    SafetensorsPieceWriter::Slot& slot = slots[*l.tensors[i].name];
    slot.offset = l.offsets[i];
    slot.count = NumElements(*l.tensors[i].shape);
    slot.file_dtype = l.tensors[i].file_dtype;
  }
  return std::make_unique<SafetensorsPieceWriter>(
      std::move(name), std::make_unique<AtomicFileWriter>(std::move(w)), std::move(slots));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    const std::string single = absl::StrCat(path, "/", kSingleName);
    const std::string index = absl::StrCat(path, "/", kIndexName);
    const bool has_single = PathExists(single), has_index = PathExists(index);
    // Both present means one is stale (an earlier export of another size); guessing could load
    // the wrong weights, so make the caller choose.
    if (has_single && has_index) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": holds both ", kSingleName, " and ",
                                                        kIndexName, "; open one of them by path"));
    }
    if (has_index) return MappedReader::OpenIndex(index);
    if (has_single) return MappedReader::OpenFile(single);
    return absl::NotFoundError(
        absl::StrCat(path, ": directory holds neither ", kSingleName, " nor ", kIndexName));
  }
  if (EndsWith(path, ".json")) return MappedReader::OpenIndex(path);
  return MappedReader::OpenFile(path);
}

void SafetensorsWriter::Add(const std::string& name, DType data_dtype, const Shape& shape,
                            const void* data, DType file_dtype) {
  entries_.push_back({name, data_dtype, shape, data, file_dtype});
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  std::vector<Pending> all = ToPending(entries_);
  RETURN_IF_ERROR(CheckPending(all));
  return WriteOne(path, std::move(all), metadata_);
}

namespace {

std::string ShardName(int i, int n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
}

// Exactly `parts` runs of `all`, in order, of about equal bytes: a tensor goes to the part whose
// share of the total holds its middle byte (so every writer computes the same split). The part
// of each tensor of `all`.
std::vector<int> PartOf(const std::vector<Pending>& all, int parts) {
  uint64_t total = 0;
  for (const Pending& t : all) total += t.file_bytes();
  std::vector<int> part;
  uint64_t before = 0;
  for (const Pending& t : all) {
    const uint64_t bytes = t.file_bytes();
    const uint64_t middle = before + bytes / 2;
    part.push_back(total == 0 ? 0
                              : static_cast<int>(std::min<uint64_t>(
                                    parts - 1, middle * static_cast<uint64_t>(parts) / total)));
    before += bytes;
  }
  return part;
}

std::vector<std::vector<Pending>> Partition(const std::vector<Pending>& all, int parts) {
  const std::vector<int> part = PartOf(all, parts);
  std::vector<std::vector<Pending>> out(parts);
  for (size_t i = 0; i < all.size(); ++i) out[part[i]].push_back(all[i]);
  return out;
}

// model.safetensors.index.json for `shards` (file i: ShardName(i, n)).
absl::Status WriteIndex(const std::string& dir, const std::vector<std::vector<Pending>>& shards) {
  Json weight_map = Json::object();
  uint64_t total = 0;
  const int n = static_cast<int>(shards.size());
  for (int i = 0; i < n; ++i) {
    for (const Pending& t : shards[i]) {
      weight_map[*t.name] = ShardName(i, n);
      total += t.file_bytes();
    }
  }
  Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": cannot encode index: ", e.what()));
  }
  return WriteFileAtomic(absl::StrCat(dir, "/", kIndexName), text);
}

// Greedy in insertion order, as transformers shards: a new shard starts when the next tensor
// would overflow the current one; a tensor larger than the limit gets a shard to itself.
std::vector<std::vector<Pending>> GreedyShards(const std::vector<Pending>& all,
                                               int64_t max_shard_bytes) {
  std::vector<std::vector<Pending>> shards(1);
  uint64_t in_shard = 0;
  for (const Pending& t : all) {
    const uint64_t bytes = t.file_bytes();
    if (!shards.back().empty() && in_shard + bytes > static_cast<uint64_t>(max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
  }
  return shards;
}

// The checked tensors of a writer in WriteSharded's files.
absl::StatusOr<std::vector<std::vector<Pending>>> GreedyLayout(const std::vector<Pending>& all,
                                                               int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: max_shard_bytes must be positive, got ", max_shard_bytes));
  }
  RETURN_IF_ERROR(CheckPending(all));
  return GreedyShards(all, max_shard_bytes);
}

}  // namespace

absl::Status SafetensorsWriter::WriteSharded(const std::string& dir,
                                             int64_t max_shard_bytes) const {
  const std::vector<Pending> all = ToPending(entries_);
  ASSIGN_OR_RETURN(const std::vector<std::vector<Pending>> shards,
                   GreedyLayout(all, max_shard_bytes));
  RETURN_IF_ERROR(MakeDirs(dir));
  if (shards.size() == 1) return WriteOne(absl::StrCat(dir, "/", kSingleName), all, metadata_);

  const int n = static_cast<int>(shards.size());
  for (int i = 0; i < n; ++i) {
    RETURN_IF_ERROR(WriteOne(absl::StrCat(dir, "/", ShardName(i, n)), shards[i], metadata_));
  }
  // Last, so a reader never finds an index naming shards not yet written.
  return WriteIndex(dir, shards);
}

absl::StatusOr<std::vector<std::unique_ptr<SafetensorsPieceWriter>>> SafetensorsWriter::OpenSharded(
    const std::string& dir, int64_t max_shard_bytes) const {
  ASSIGN_OR_RETURN(std::vector<std::vector<Pending>> shards,
                   GreedyLayout(ToPending(entries_), max_shard_bytes));
  RETURN_IF_ERROR(MakeDirs(dir));
  const int n = static_cast<int>(shards.size());
  std::vector<std::unique_ptr<SafetensorsPieceWriter>> files;
  for (int i = 0; i < n; ++i) {
    const std::string name = n == 1 ? kSingleName : ShardName(i, n);
    ASSIGN_OR_RETURN(
        auto file, OpenPieces(absl::StrCat(dir, "/", name), name, std::move(shards[i]), metadata_));
    files.push_back(std::move(file));
  }
  return files;
}

absl::Status SafetensorsWriter::WriteShardedIndex(const std::string& dir,
                                                  int64_t max_shard_bytes) const {
  ASSIGN_OR_RETURN(const std::vector<std::vector<Pending>> shards,
                   GreedyLayout(ToPending(entries_), max_shard_bytes));
  return shards.size() == 1 ? absl::OkStatus() : WriteIndex(dir, shards);
}

absl::StatusOr<std::string> SafetensorsWriter::WriteShard(const std::string& dir, int part,
                                                          int parts) const {
  if (parts < 1 || part < 0 || part >= parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: part ", part, " is not a part of ", parts));
  }
  std::vector<Pending> all = ToPending(entries_);
  RETURN_IF_ERROR(CheckPending(all));
  RETURN_IF_ERROR(MakeDirs(dir));
  const std::vector<std::vector<Pending>> shards = Partition(all, parts);
  const std::string file = parts == 1 ? kSingleName : ShardName(part, parts);
  RETURN_IF_ERROR(WriteOne(absl::StrCat(dir, "/", file), shards[part], metadata_));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsPieceWriter>> SafetensorsWriter::OpenFile(
    const std::string& path) const {
  std::vector<Pending> all = ToPending(entries_);
  RETURN_IF_ERROR(CheckPending(all));
  const size_t slash = path.find_last_of('/');
  return OpenPieces(path, slash == std::string::npos ? path : path.substr(slash + 1),
                    std::move(all), metadata_);
}

absl::StatusOr<std::unique_ptr<SafetensorsPieceWriter>> SafetensorsWriter::OpenShard(
    const std::string& dir, int part, int parts) const {
  if (parts < 1 || part < 0 || part >= parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: part ", part, " is not a part of ", parts));
  }
  std::vector<Pending> all = ToPending(entries_);
  RETURN_IF_ERROR(CheckPending(all));
  RETURN_IF_ERROR(MakeDirs(dir));
  std::vector<std::vector<Pending>> shards = Partition(all, parts);
  const std::string file = parts == 1 ? kSingleName : ShardName(part, parts);
  return OpenPieces(absl::StrCat(dir, "/", file), file, std::move(shards[part]), metadata_);
}

SafetensorsPieceWriter::SafetensorsPieceWriter(std::string name,
                                               std::unique_ptr<AtomicFileWriter> file,
                                               std::map<std::string, Slot> slots)
    : name_(std::move(name)), file_(std::move(file)), slots_(std::move(slots)) {}

SafetensorsPieceWriter::~SafetensorsPieceWriter() = default;

absl::Status SafetensorsPieceWriter::Put(const std::string& tensor, DType data_dtype,
                                         const void* data) {
  auto it = slots_.find(tensor);
  if (it == slots_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": tensor '", tensor, "' is not one of this file's"));
  }
  Slot& slot = it->second;
  if (slot.written) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": tensor '", tensor, "' put twice"));
  }
  if (data == nullptr && slot.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": tensor '", tensor, "': no data to write (null)"));
  }
  uint64_t at = slot.offset;
  RETURN_IF_ERROR(ForEachChunk(data, data_dtype, slot.file_dtype, static_cast<size_t>(slot.count),
                               [&](const void* p, size_t n) {
                                 RETURN_IF_ERROR(file_->WriteAt(at, p, n));
                                 at += n;
                                 return absl::OkStatus();
                               }));
  slot.written = true;
  return absl::OkStatus();
}

absl::Status SafetensorsPieceWriter::Commit() {
  for (const auto& [tensor, slot] : slots_) {
    if (!slot.written) {
      return absl::FailedPreconditionError(
          absl::StrCat(name_, ": tensor '", tensor, "' was never written"));
    }
  }
  return file_->Commit();
}

std::vector<int> SafetensorsWriter::PartOfEachTensor(int parts) const {
  return PartOf(ToPending(entries_), std::max(parts, 1));
}

absl::Status SafetensorsWriter::WriteShardIndex(const std::string& dir, int parts) const {
  if (parts == 1) return absl::OkStatus();
  std::vector<Pending> all = ToPending(entries_);
  RETURN_IF_ERROR(CheckPending(all));
  return WriteIndex(dir, Partition(all, parts));
}

}  // namespace ithaca
