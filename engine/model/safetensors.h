// safetensors files: read (one file, or shards behind model.safetensors.index.json) and write
// (atomically: temporary name, then rename). Only F32 and BF16 tensors (and I32 for state).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace ithaca {

class AtomicFileWriter;

struct TensorInfo {
  DType dtype;
  Shape shape;
};

// Reads tensors by name from one .safetensors file or a sharded set. Every header is validated
// when opening (JSON, dtypes, offsets inside the file, sizes matching shapes, no overlaps), so a
// truncated or corrupt file is an error at Open, naming the file and what is wrong.
class SafetensorsReader {
 public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a directory holding
  // either model.safetensors or model.safetensors.index.json. An index's shards are file names
  // beside it (DATA_LOSS naming the entry otherwise), and under ithacad each must resolve inside
  // $ITHACA_ALLOWED_ROOTS (PERMISSION_DENIED as engine/core/path_policy.h CheckAllowedPath),
  // both decided before the shard is opened: nothing outside the roots is read, quoted, or told
  // apart from a missing file. Errors never quote a file's bytes or size.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  virtual ~SafetensorsReader() = default;

  virtual std::vector<std::string> Names() const = 0;
  virtual bool Has(const std::string& name) const = 0;
  // NOT_FOUND naming the tensor and the file if absent.
  virtual absl::StatusOr<TensorInfo> Info(const std::string& name) const = 0;
  // The "__metadata__" strings (of every shard, merged).
  virtual std::map<std::string, std::string> Metadata() const { return {}; }
  // Every file it read, as it opened them: the index (when opened through one) and each file
  // holding tensors (a checkpoint's manifest must list them all).
  virtual std::vector<std::string> Files() const = 0;
  // Copies the tensor into host memory `dst` as `dst_dtype` (f32 <-> bf16 converted), after
  // checking its shape equals `expected` (INVALID_ARGUMENT naming both shapes otherwise).
  virtual absl::Status Read(const std::string& name, const Shape& expected, DType dst_dtype,
                            void* dst) const = 0;
  // Elements [begin, begin + count) of the tensor (flattened, row-major) into `dst` as
  // `dst_dtype`, touching only their bytes of the file (a rank loading its FSDP slice of a
  // checkpoint). Checks the shape as Read does; OUT_OF_RANGE when the range leaves the tensor.
  virtual absl::Status ReadRange(const std::string& name, const Shape& expected, int64_t begin,
                                 int64_t count, DType dst_dtype, void* dst) const = 0;
};

// One safetensors file whose tensors arrive one at a time, in any order (SafetensorsWriter::
// OpenFile / OpenShard): the header is written when it opens, each Put writes one tensor at its
// place, and Commit checks that every tensor came, then renames the file into place (atomically,
// as WriteFile). For data that is produced piecewise, so that it never has to be held whole.
class SafetensorsPieceWriter {
 public:
  struct Slot {
    uint64_t offset = 0;  // of its data, from the start of the file
    int64_t count = 0;
    DType file_dtype = DType::kF32;
    bool written = false;
  };
  // `file` has the header written already; `slots` says where each tensor goes.
  SafetensorsPieceWriter(std::string name, std::unique_ptr<AtomicFileWriter> file,
                         std::map<std::string, Slot> slots);
  ~SafetensorsPieceWriter();
  SafetensorsPieceWriter(const SafetensorsPieceWriter&) = delete;
  SafetensorsPieceWriter& operator=(const SafetensorsPieceWriter&) = delete;

  // The file's name (relative to the directory it was opened in, for OpenShard).
  const std::string& name() const { return name_; }
  bool Holds(const std::string& tensor) const { return slots_.count(tensor) > 0; }
  // Writes tensor `tensor` from host memory `data` of `data_dtype` (as many elements as its
  // shape has). INVALID_ARGUMENT for a tensor the file does not hold or one put twice.
  absl::Status Put(const std::string& tensor, DType data_dtype, const void* data);
  // FAILED_PRECONDITION naming a tensor never put; the file then does not appear.
  absl::Status Commit();

 private:
  std::string name_;
  std::unique_ptr<AtomicFileWriter> file_;
  std::map<std::string, Slot> slots_;
};

// Collects host tensors (not copied: the data must outlive Write) and writes them.
class SafetensorsWriter {
 public:
  // Adds a tensor to write as `file_dtype`; `data` is host memory of `data_dtype`. `data` may be
  // null for a tensor this writer only names: one in another writer's part (WriteShard), or in
  // the index (WriteShardIndex); writing it is an error.
  void Add(const std::string& name, DType data_dtype, const Shape& shape, const void* data,
           DType file_dtype);
  // Optional string metadata ("__metadata__"), e.g. {"format": "pt"}.
  void SetMetadata(const std::string& key, const std::string& value);

  // One file, written atomically.
  absl::Status WriteFile(const std::string& path) const;
  // Into `dir`: model.safetensors when everything fits in `max_shard_bytes`, else
  // model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json (Hugging Face
  // layout, with metadata.total_size). Each file is written atomically, the index last.
  absl::Status WriteSharded(const std::string& dir, int64_t max_shard_bytes) const;
  // The same layout written by `parts` writers at once (one per rank of a checkpoint): the
  // tensors, in insertion order, are split into exactly `parts` files of about equal size
  // (model-0000i-of-0000n.safetensors; one part: model.safetensors, no index). WriteShard writes
  // file `part` only (every writer must have added the same tensors); WriteShardIndex the index,
  // once all files are written. WriteShard returns the name of the file it wrote.
  absl::StatusOr<std::string> WriteShard(const std::string& dir, int part, int parts) const;
  absl::Status WriteShardIndex(const std::string& dir, int parts) const;
  // The part (file) each added tensor goes to in that split, in insertion order: the one place
  // it is decided, so that a writer knows which tensors it needs before it has their data.
  std::vector<int> PartOfEachTensor(int parts) const;
  // WriteFile and WriteShard for data that arrives piecewise: the file opened with its header,
  // to be filled by SafetensorsPieceWriter::Put (the added tensors need no data).
  absl::StatusOr<std::unique_ptr<SafetensorsPieceWriter>> OpenFile(const std::string& path) const;
  absl::StatusOr<std::unique_ptr<SafetensorsPieceWriter>> OpenShard(const std::string& dir,
                                                                    int part, int parts) const;
  // WriteSharded's files, opened: commit them all, then WriteShardedIndex (nothing to write
  // when everything fits one file).
  absl::StatusOr<std::vector<std::unique_ptr<SafetensorsPieceWriter>>> OpenSharded(
      const std::string& dir, int64_t max_shard_bytes) const;
  absl::Status WriteShardedIndex(const std::string& dir, int64_t max_shard_bytes) const;

 private:
  struct Entry {
    std::string name;
    DType data_dtype;
    Shape shape;
    const void* data;
    DType file_dtype;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ithaca
