// Following a job (`ithaca watch`, `submit --follow`): its events as they happen, under a live
// line that shows the newest step (and, while nothing arrives, a spinner), the watch resumed
// when the connection blinks.
#pragma once

#include <string>

#include "client/commands.h"
#include "google/protobuf/message.h"

namespace ithaca {

// Follows job `id` until it ends (with its log lines when `logs`): 0 when it succeeded, 1 when
// it ended otherwise, 2 when the watch broke for good (the RPC error printed).
int FollowJob(CliContext& c, const std::string& id, bool logs);

// Whether a job in state `s` has ended.
bool IsTerminal(v1::JobState s);

// Prints `m` as one line of JSON (-o json) and flushes.
void PrintJson(const google::protobuf::Message& m);

}  // namespace ithaca
