// safetensors writing: whole files written atomically, single-file and sharded in Hugging Face's
// layout, and files filled piecewise (SafetensorsPieceWriter).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/file_util.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_internal.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

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

// Part `part` of `parts` of a writer's checked tensors, as WriteShard and OpenShard write it: the
// file's name (model.safetensors when parts is 1) and its tensors; `dir` is made.
struct ShardPart {
  std::string file;
  std::vector<Pending> tensors;
};
absl::StatusOr<ShardPart> TakePart(const std::vector<Pending>& all, const std::string& dir,
                                   int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: part ", part, " is not a part of ", parts));
  }
  RETURN_IF_ERROR(CheckPending(all));
  RETURN_IF_ERROR(MakeDirs(dir));
  std::vector<std::vector<Pending>> shards = Partition(all, parts);
  return ShardPart{parts == 1 ? kSingleName : ShardName(part, parts), std::move(shards[part])};
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
  ASSIGN_OR_RETURN(ShardPart p, TakePart(ToPending(entries_), dir, part, parts));
  RETURN_IF_ERROR(WriteOne(absl::StrCat(dir, "/", p.file), p.tensors, metadata_));
  return p.file;
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
  ASSIGN_OR_RETURN(ShardPart p, TakePart(ToPending(entries_), dir, part, parts));
  return OpenPieces(absl::StrCat(dir, "/", p.file), p.file, std::move(p.tensors), metadata_);
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
