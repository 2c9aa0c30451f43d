// The environment a launcher gives each rank: its place in the job. Named here alone (no
// library) so that the launcher that sets them links nothing of the communicators;
// bootstrap.h's RankInfoFromEnvironment reads them.
#pragma once

namespace ithaca {

inline constexpr char kEnvRank[] = "ITHACA_RANK";
inline constexpr char kEnvWorldSize[] = "ITHACA_WORLD_SIZE";
inline constexpr char kEnvRendezvous[] = "ITHACA_RENDEZVOUS";
inline constexpr char kEnvGpu[] = "ITHACA_GPU";
// The job's ranks on this host (the launcher's --nproc); unset: all of them (one host).
inline constexpr char kEnvLocalWorldSize[] = "ITHACA_LOCAL_WORLD_SIZE";
// Optional: the address Gloo listens on when ranks span machines (default 127.0.0.1).
inline constexpr char kEnvGlooHost[] = "ITHACA_GLOO_HOST";
// Tests only: GlooOptions::issue_delay_ms, milliseconds each issued Gloo collective starts late.
inline constexpr char kEnvGlooIssueDelay[] = "ITHACA_GLOO_ISSUE_DELAY_MS";

}  // namespace ithaca
