// safetensors reading: mmap, every header validated at Open (the writers are in
// safetensors_writer.cc).
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

#include "engine/core/enum_names.h"
#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "engine/model/safetensors_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as is"
#endif

namespace ithaca {

namespace {

// The dtypes safetensors files hold, by the names the format gives them.
constexpr EnumName<DType> kFileDTypeNames[] = {
    {DType::kF32, "F32"},
    {DType::kBF16, "BF16"},
    {DType::kI32, "I32"},
};

}  // namespace

const char* FileDTypeName(DType t) { return NameOf(kFileDTypeNames, t); }

namespace {

using Json = nlohmann::json;

// The reference implementation refuses larger headers; so do we (a corrupt length is far larger).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

bool ParseFileDType(const std::string& s, DType* out) {
  const std::optional<DType> t = ValueOf(kFileDTypeNames, s);
  if (t) *out = *t;
  return t.has_value();
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
  // The reasons say what is wrong, never the file's size or bytes (its first 8 are the header
  // length): a reason reaches whoever submitted the job.
  if (f.size() < 8) return loss("too short for a safetensors header: not a safetensors file");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8) {
    return loss("the header length exceeds the file: truncated or not a safetensors file");
  }
  if (n > kMaxHeaderBytes) return loss("the header length is implausibly large: corrupt");
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
    // Under ithacad, the roots it gives its workers (and holds itself): engine/core/path_policy.h.
    ASSIGN_OR_RETURN(const std::vector<std::string> roots, AllowedRootsFromEnvironment());
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxIndexBytes));
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
    r->index_ = true;
    const std::string dir = Dirname(path);
    std::map<std::string, std::map<std::string, Entry>> shards;  // by shard file name
    for (const auto& [name, shard] : wm->items()) {
      if (!shard.is_string()) return bad(absl::StrCat("weight_map['", name, "'] is not a string"));
      const std::string file = shard.get<std::string>();
      auto it = shards.find(file);
      if (it == shards.end()) {
        // A shard is a file beside its index (as Hugging Face writes them), and one inside the
        // job's roots (a sibling may be a link out of them): both decided before it is opened, so
        // a file elsewhere is never read, quoted or told apart from a missing one.
        if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
          return bad(absl::StrCat("weight_map['", name, "'] names \"", file,
                                  "\", which is not a file name beside the index"));
        }
        const std::string shard_path = absl::StrCat(dir, "/", file);
        RETURN_IF_ERROR(CheckAllowedPath(
            path, absl::StrCat("shard ", file, " (holding '", name, "')"), shard_path, roots));
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

  std::vector<std::string> Files() const override {
    std::vector<std::string> files;
    if (index_) files.push_back(source_);
    for (const auto& f : files_) files.push_back(f->path());
    return files;
  }

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
  bool index_ = false;  // source_ is an index
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write (a view of SafetensorsWriter's private Entry).
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

}  // namespace ithaca
