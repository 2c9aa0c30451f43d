#include "engine/comm/nccl/nccl_connect.h"

#include <nccl.h>

#include "engine/core/library_version.h"
#include "engine/comm/nccl/nccl_comm.h"

namespace ithaca {

absl::StatusOr<std::unique_ptr<Comm>> ConnectNccl(int rank, int world,
                                                  const std::string& rendezvous, int gpu,
                                                  double timeout_s) {
  NcclOptions options;
  options.timeout_s = timeout_s;
  ASSIGN_OR_RETURN(auto comm, NcclComm::Create(rank, world, rendezvous, gpu, options));
  return std::unique_ptr<Comm>(std::move(comm));
}

absl::StatusOr<std::string> NcclVersionReport() {
  int loaded = 0;
  if (ncclGetVersion(&loaded) != ncclSuccess) loaded = 0;
  return CheckLibraryVersion("NCCL", NCCL_VERSION_CODE, loaded, kMinNcclVersion);
}

}  // namespace ithaca
