// NCCL behind a header without CUDA types, so that code which only picks a communicator
// (engine/comm/bootstrap) builds on machines without CUDA. A build with CUDA links
// nccl_connect.cc; one without it links nccl_connect_stub.cc, whose functions answer
// FAILED_PRECONDITION "built without CUDA".
#pragma once

#include <memory>
#include <string>

#include "engine/comm/comm.h"
#include "engine/core/status.h"

namespace ithaca {

// NcclComm::Create for `world` ranks meeting at `rendezvous`, on GPU `gpu`, each wait bounded
// by `timeout_s`.
absl::StatusOr<std::unique_ptr<Comm>> ConnectNccl(int rank, int world,
                                                  const std::string& rendezvous, int gpu,
                                                  double timeout_s);

// The NCCL this binary was compiled against and the one it loaded (ncclGetVersion), e.g.
// "NCCL 2.28.9 (built with 2.28.9)". An error naming both when the loaded library is older.
absl::StatusOr<std::string> NcclVersionReport();

}  // namespace ithaca
