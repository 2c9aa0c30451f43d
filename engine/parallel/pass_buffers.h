// The buffers of one attention pass (UPipe's stages, ring attention's chunks), owned in one
// place and freed together when the pass ends.
#pragma once

#include <initializer_list>
#include <vector>

#include "engine/core/status.h"
#include "engine/memory/allocator.h"

namespace ithaca {

// The stage sets of a pass hold views of these buffers (several views may share one buffer when
// the schedule never needs them at once). Tier::kAttention, the tier the planner counts them in.
class PassBuffers {
 public:
  explicit PassBuffers(Allocator* alloc) : alloc_(alloc) {}
  absl::StatusOr<Tensor> Make(DType t, Shape shape) {
    ASSIGN_OR_RETURN(Buffer b, Buffer::Make(alloc_, t, std::move(shape), Tier::kAttention));
    owned_.push_back(std::move(b));
    return owned_.back().tensor();
  }
  // One buffer of `shape` for each of `views`.
  absl::Status MakeEach(std::initializer_list<Tensor*> views, DType t, const Shape& shape) {
    for (Tensor* v : views) {
      ASSIGN_OR_RETURN(*v, Make(t, shape));
    }
    return absl::OkStatus();
  }

 private:
  Allocator* alloc_;
  std::vector<Buffer> owned_;
};

}  // namespace ithaca
