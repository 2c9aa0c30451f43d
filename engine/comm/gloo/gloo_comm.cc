#include "engine/comm/gloo/gloo_comm.h"

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "engine/comm/comm_checks.h"
#include "engine/comm/rendezvous.h"
#include "engine/comm/self_comm.h"
#include "engine/comm/tcp_store.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

// Store keys of the communicator Create makes; splits append ".s<n>.c<color>".
constexpr char kRootPrefix[] = "ithaca";
constexpr size_t kHostBytes = 64;
constexpr size_t kAddressBytes = 64;

// SendRecv's Gloo slots: a top byte no Gloo collective uses (theirs are 0x01-0x08), the sender's
// rank, and the count of the sender's earlier messages to that receiver. Both ends count the
// same messages, so successive exchanges and both directions of a pair never share a slot.
constexpr uint64_t kSendRecvSlotPrefix = uint64_t{0x49} << 56;
constexpr int kSendRecvRankShift = 40;  // 16 bits of rank, 40 of count

uint64_t SendRecvSlot(int sender, uint64_t count) {
  return kSendRecvSlotPrefix | (static_cast<uint64_t>(sender) << kSendRecvRankShift) | count;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Gloo writes to sockets with writev(2), which raises SIGPIPE when a peer has gone; its default
// action would kill this rank before Gloo could report the broken connection as an error.
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old = {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

bool LooksLikeTimeout(const std::string& message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout");
}

// Gloo's messages start with "[./gloo/...cc:123] "; the source location helps no user.
// Some messages carry it twice.
std::string StripLocation(std::string message) {
  while (!message.empty() && message[0] == '[') {
    size_t end = message.find("] ");
    if (end == std::string::npos || message.find(".cc:") > end) break;
    message = message.substr(end + 2);
  }
  return message;
}

// The FileStore's "Wait timeout for key(s): <prefix>/2 <prefix>/3" names the ranks that never
// published their address, i.e. never joined: say so in those words.
std::string MissingRanks(const std::string& message, const std::string& prefix) {
  const std::string marker = "Wait timeout for key(s): ";
  size_t pos = message.find(marker);
  if (pos == std::string::npos) return "";
  std::vector<std::string> ranks;
  const std::string key_prefix = prefix + "/";
  for (pos = message.find(key_prefix, pos); pos != std::string::npos;
       pos = message.find(key_prefix, pos + 1)) {
    size_t begin = pos + key_prefix.size(), end = begin;
    while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
    if (end > begin) ranks.push_back(message.substr(begin, end - begin));
  }
  if (ranks.empty()) return "";
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "),
                      " did not join");
}

// True when `pid` (on this host) has exited: gone, or a zombie not yet reaped by its parent.
bool ProcessGone(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

std::string HostName() {
  char buf[kHostBytes] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// `needle` occurs in `haystack` not followed by another digit (so port 630 does not match 6300).
bool ContainsAddress(const std::string& haystack, const std::string& needle) {
  if (needle.empty()) return false;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1)) {
    size_t after = pos + needle.size();
    if (after >= haystack.size() || !std::isdigit(static_cast<unsigned char>(haystack[after]))) {
      return true;
    }
  }
  return false;
}

// Gloo's Store interface over the TCP store of a "tcp:host:port" rendezvous. Gloo expects
// failures as exceptions; a timeout is worded like the FileStore's so MissingRanks reads it.
class TcpGlooStore : public gloo::rendezvous::Store {
 public:
  TcpGlooStore(std::unique_ptr<TcpStoreClient> client, double timeout_s)
      : client_(std::move(client)), timeout_s_(timeout_s) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status st = client_->Set(key, std::string(data.begin(), data.end()));
    if (!st.ok()) throw std::runtime_error(std::string(st.message()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = Fetch(key, timeout_s_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000)));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      Fetch(key, std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count()));
    }
  }

 private:
  std::string Fetch(const std::string& key, double timeout_s) {
    absl::StatusOr<std::string> v = client_->Get(key, timeout_s);
    if (absl::IsDeadlineExceeded(v.status())) {
      throw std::runtime_error(
          absl::StrCat(v.status().message(), "; Wait timeout for key(s): ", key));
    }
    if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
    return *std::move(v);
  }

  std::unique_ptr<TcpStoreClient> client_;
  double timeout_s_;
};

}  // namespace

struct GlooComm::Shared {
  std::string dir;  // the rendezvous address, for messages
  GlooOptions options;
  std::unique_ptr<gloo::rendezvous::Store> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::string host = HostName();
};

struct GlooComm::PeerInfo {
  int64_t pid = 0;
  std::string host;
  std::vector<std::string> addresses;  // the peer's listening addresses, "[ip]:port"
};

GlooComm::GlooComm(std::shared_ptr<Shared> shared, std::shared_ptr<gloo::Context> context, int rank,
                   int size, std::string prefix, std::vector<int> global_ranks)
    : shared_(std::move(shared)),
      context_(std::move(context)),
      rank_(rank),
      size_(size),
      prefix_(std::move(prefix)),
      global_ranks_(std::move(global_ranks)),
      sent_(size, 0),
      received_(size, 0) {}

struct GlooComm::Background {
  std::mutex mu;
  std::condition_variable changed;
  std::deque<std::pair<int64_t, std::function<absl::Status()>>> queue;
  std::map<int64_t, absl::Status> finished;  // results not waited for yet
  int64_t next_id = 1;
  bool busy = false, stop = false;
  std::thread thread;

  void Loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      changed.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stopping, and nothing left to run
      auto [id, collective] = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      absl::Status st = collective();
      lock.lock();
      busy = false;
      finished[id] = std::move(st);
      changed.notify_all();
    }
  }
};

GlooComm::~GlooComm() {
  if (background_) {
    {
      std::lock_guard<std::mutex> lock(background_->mu);
      background_->stop = true;
    }
    background_->changed.notify_all();
    background_->thread.join();
  }
}

absl::StatusOr<Issued> GlooComm::Defer(std::function<absl::Status()> collective) {
  if (!background_) {
    background_ = std::make_unique<Background>();
    background_->thread = std::thread([b = background_.get()] { b->Loop(); });
  }
  if (const int delay_ms = shared_->options.issue_delay_ms; delay_ms > 0) {
    collective = [delay_ms, run = std::move(collective)] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      return run();
    };
  }
  std::lock_guard<std::mutex> lock(background_->mu);
  const int64_t id = background_->next_id++;
  background_->queue.emplace_back(id, std::move(collective));
  background_->changed.notify_all();
  return Issued(this, id);
}

void GlooComm::Drain() {
  if (!background_ || std::this_thread::get_id() == background_->thread.get_id()) return;
  std::unique_lock<std::mutex> lock(background_->mu);
  background_->changed.wait(lock, [&] { return background_->queue.empty() && !background_->busy; });
}

absl::Status GlooComm::WaitIssued(int64_t id) {
  std::unique_lock<std::mutex> lock(background_->mu);
  background_->changed.wait(lock, [&] { return background_->finished.count(id) > 0; });
  absl::Status st = std::move(background_->finished[id]);
  background_->finished.erase(id);
  return st;
}

// The arguments are checked here, so a misuse is reported by the call that made it.
absl::StatusOr<Issued> GlooComm::IssueAllGather(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllGather(in, out, rank_, size_, Device::kCpu));
  return Defer([this, in, out] { return AllGather(in, out); });
}

absl::StatusOr<Issued> GlooComm::IssueReduceScatter(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckReduceScatter(in, out, rank_, size_, Device::kCpu));
  return Defer([this, in, out] { return ReduceScatter(in, out); });
}

absl::StatusOr<Issued> GlooComm::IssueAllToAll(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllToAll(in, out, size_, Device::kCpu));
  return Defer([this, in, out] { return AllToAll(in, out); });
}

absl::StatusOr<Issued> GlooComm::IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                               int src) {
  RETURN_IF_ERROR(CheckSendRecv(send, dst, recv, src, rank_, size_, Device::kCpu));
  return Defer([this, send, dst, recv, src] { return SendRecv(send, dst, recv, src); });
}

absl::StatusOr<std::unique_ptr<GlooComm>> GlooComm::Create(int rank, int world,
                                                           const std::string& rendezvous,
                                                           const GlooOptions& options) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is not a rank of a world of ", world));
  }
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: timeout must be positive, got ", options.timeout_s, " s"));
  }
  ASSIGN_OR_RETURN(Rendezvous rdzv, ParseRendezvous(rendezvous));
  IgnoreSigpipe();
  auto shared = std::make_shared<Shared>();
  shared->dir = rdzv.kind == Rendezvous::Kind::kFile ? rdzv.path : rdzv.address;
  shared->options = options;
  if (rdzv.kind == Rendezvous::Kind::kTcp) {
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
        TcpStoreClient::Connect(rdzv.host, rdzv.port, options.timeout_s);
    if (!client.ok()) {
      return absl::Status(client.status().code(), absl::StrCat("gloo rank ", rank, " of ", world,
                                                               ": ", client.status().message()));
    }
    shared->store = std::make_unique<TcpGlooStore>(std::move(*client), options.timeout_s);
  }
  try {
    if (!shared->store) shared->store = std::make_unique<gloo::rendezvous::FileStore>(rdzv.path);
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    shared->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rank ", rank, " of ", world,
                                               ": cannot listen on ", options.hostname, ": ",
                                               StripLocation(e.what())));
  }
  std::vector<int> global(world);
  for (int i = 0; i < world; ++i) global[i] = i;
  const std::string prefix = kRootPrefix;
  std::shared_ptr<gloo::Context> context;
  if (world > 1) {
    ASSIGN_OR_RETURN(context, Connect(*shared, rank, world, prefix));
  }
  std::unique_ptr<GlooComm> comm(
      new GlooComm(std::move(shared), std::move(context), rank, world, prefix, global));
  RETURN_IF_ERROR(comm->ExchangePeerInfo());
  return comm;
}

absl::StatusOr<std::shared_ptr<gloo::Context>> GlooComm::Connect(const Shared& shared, int rank,
                                                                 int size,
                                                                 const std::string& prefix) {
  const auto start = Clock::now();
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(
        std::chrono::milliseconds(static_cast<int64_t>(shared.options.timeout_s * 1000.0)));
    gloo::rendezvous::PrefixStore store(prefix, *shared.store);
    std::shared_ptr<gloo::transport::Device> device = shared.device;
    context->connectFullMesh(store, device);
    return std::shared_ptr<gloo::Context>(std::move(context));
  } catch (const std::exception& e) {
    std::string what = StripLocation(e.what());
    std::string missing = MissingRanks(what, prefix);
    std::string text =
        absl::StrCat("gloo rank ", rank, " of ", size, ": connecting through ", shared.dir, " (",
                     prefix, ") failed after ", absl::StrFormat("%.1f", SecondsSince(start)),
                     " s: ", missing.empty() ? "" : missing + "; ", "gloo: ", what);
    if (LooksLikeTimeout(what)) {
      return absl::DeadlineExceededError(
          absl::StrCat(text, " (not every rank joined within ", shared.options.timeout_s,
                       " s: did they all start, with the same rendezvous and world size?)"));
    }
    if (absl::StrContains(what, "already exists")) {
      text += " (the rendezvous directory was used by an earlier run; give each job a fresh one)";
    }
    return absl::UnavailableError(text);
  }
}

std::string GlooComm::RankName(int r) const {
  // Ranks of a split are also named by their rank in the communicator Create made.
  if (prefix_ == kRootPrefix) return absl::StrCat("rank ", r);
  return absl::StrCat("rank ", r, " (global rank ", global_ranks_[r], ")");
}

std::string GlooComm::Name() const { return absl::StrCat("gloo ", RankName(rank_), " of ", size_); }

absl::Status GlooComm::ExchangePeerInfo() {
  peers_.assign(size_, PeerInfo());
  if (size_ == 1) return absl::OkStatus();
  // One fixed-size record per rank: pid, host name, then its listening address toward each rank.
  const size_t record = 8 + kHostBytes + kAddressBytes * size_;
  std::vector<char> mine(record, 0), all(record * size_, 0);
  int64_t pid = ::getpid();
  std::memcpy(mine.data(), &pid, 8);
  std::memcpy(mine.data() + 8, shared_->host.data(),
              std::min(shared_->host.size(), kHostBytes - 1));
  RETURN_IF_ERROR(Run("connect", [&] {
    for (int i = 0; i < size_; ++i) {
      if (i == rank_) continue;
      std::string addr = context_->getPair(i)->address().str();
      std::memcpy(mine.data() + 8 + kHostBytes + kAddressBytes * i, addr.data(),
                  std::min(addr.size(), kAddressBytes - 1));
    }
    RawAllGather(mine.data(), all.data(), record);
  }));
  for (int r = 0; r < size_; ++r) {
    const char* rec = all.data() + record * r;
    PeerInfo& p = peers_[r];
    std::memcpy(&p.pid, rec, 8);
    p.host.assign(rec + 8, strnlen(rec + 8, kHostBytes));
    for (int i = 0; i < size_; ++i) {
      const char* a = rec + 8 + kHostBytes + kAddressBytes * i;
      p.addresses.emplace_back(a, strnlen(a, kAddressBytes));
    }
  }
  return absl::OkStatus();
}

std::string GlooComm::DescribePeers(const std::string& gloo_message,
                                    const std::vector<int>& involved) const {
  auto suspect = [&](int r) {
    return r != rank_ &&
           (involved.empty() || std::find(involved.begin(), involved.end(), r) != involved.end());
  };
  std::vector<std::string> parts;
  // A peer on this host that exited is the likeliest cause. Its sockets close as it exits, so
  // give a dying process a moment to finish before concluding it is alive.
  const bool timeout = LooksLikeTimeout(gloo_message);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout ? 0 : 300);
  while (true) {
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (!suspect(r) || peers_[r].host != shared_->host) continue;
      if (ProcessGone(peers_[r].pid)) {
        parts.push_back(absl::StrCat(RankName(r), " (pid ", peers_[r].pid, ") has exited"));
      }
    }
    if (!parts.empty() || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (parts.empty()) {
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (!suspect(r)) continue;
      for (const std::string& a : peers_[r].addresses) {
        if (ContainsAddress(gloo_message, a)) {
          parts.push_back(absl::StrCat("the connection to ", RankName(r), " broke"));
          break;
        }
      }
    }
  }
  return absl::StrJoin(parts, ", ");
}

absl::Status GlooComm::Fail(const char* op, const std::string& what, double elapsed_s,
                            const std::vector<int>& involved) {
  const std::string message = StripLocation(what);
  const bool timeout = LooksLikeTimeout(message);
  std::string peers = DescribePeers(message, involved);
  std::string text =
      absl::StrCat(Name(), ": ", op, " failed after ", absl::StrFormat("%.1f", elapsed_s),
                   " s: ", peers.empty() ? "" : peers + "; ", "gloo: ", message);
  if (timeout) {
    absl::StrAppend(&text, " (timeout ", shared_->options.timeout_s,
                    " s: a peer is stuck, gone, or not calling the same collective)");
  }
  broken_ = timeout ? absl::DeadlineExceededError(text) : absl::UnavailableError(text);
  // Closing our connections makes peers blocked on us fail now rather than at their timeout.
  try {
    if (context_) context_->closeConnections();
  } catch (...) {
  }
  return broken_;
}

template <typename Fn>
absl::Status GlooComm::Run(const char* op, Fn&& fn, const std::vector<int>& involved) {
  if (!broken_.ok()) {
    return absl::Status(
        broken_.code(),
        absl::StrCat(op, " on a communicator that already failed: ", broken_.message()));
  }
  const auto start = Clock::now();
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Fail(op, e.what(), SecondsSince(start), involved);
  } catch (...) {
    return Fail(op, "unknown exception", SecondsSince(start), involved);
  }
}

uint8_t* GlooComm::Scratch(int which, size_t bytes) {
  std::vector<uint8_t>& s = scratch_[which];
  if (s.size() < bytes) s.resize(bytes);
  return s.data();
}

void GlooComm::RawAllToAll(const void* in, void* out, size_t bytes) {
  gloo::AlltoallOptions opts(context_);
  opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
  opts.setOutput(static_cast<uint8_t*>(out), bytes);
  opts.setTag(NextTag());
  gloo::alltoall(opts);
}

void GlooComm::RawAllGather(const void* in, void* out, size_t in_bytes) {
  uint8_t* out_bytes = static_cast<uint8_t*>(out);
  const size_t total = in_bytes * size_;
  gloo::AllgatherOptions opts(context_);
  // In place (Gloo's form: no input) when this rank's part already sits in its slot.
  if (in != out_bytes + rank_ * in_bytes) {
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), in_bytes);
  }
  opts.setOutput(out_bytes, total);
  opts.setTag(NextTag());
  gloo::allgather(opts);
}

absl::Status GlooComm::AllGather(const Tensor& in, const Tensor& out) {
  Drain();
  RETURN_IF_ERROR(CheckAllGather(in, out, rank_, size_, Device::kCpu));
  if (size_ == 1 || in.numel() == 0) {
    if (in.data != out.data && in.bytes() > 0) std::memcpy(out.data, in.data, in.bytes());
    return broken_;
  }
  return Run("all_gather", [&] { RawAllGather(in.data, out.data, in.bytes()); });
}

absl::Status GlooComm::AllToAll(const Tensor& in, const Tensor& out) {
  Drain();
  RETURN_IF_ERROR(CheckAllToAll(in, out, size_, Device::kCpu));
  if (size_ == 1 || in.numel() == 0) {
    if (in.data != out.data && in.bytes() > 0) std::memcpy(out.data, in.data, in.bytes());
    return broken_;
  }
  return Run("all_to_all", [&] { RawAllToAll(in.data, out.data, in.bytes()); });
}

absl::Status GlooComm::ReduceScatter(const Tensor& in, const Tensor& out) {
  Drain();
  RETURN_IF_ERROR(CheckReduceScatter(in, out, rank_, size_, Device::kCpu));
  if (size_ == 1 || in.numel() == 0) {
    if (in.data != out.data && in.bytes() > 0) std::memcpy(out.data, in.data, in.bytes());
    return broken_;
  }
  return Run("reduce_scatter", [&] {
    // Rank i's chunk for this rank lands in slot i; summing the slots in order 0..P-1 makes the
    // result independent of arrival order.
    uint8_t* gathered = Scratch(0, in.bytes());
    RawAllToAll(in.data, gathered, in.bytes());
    SumChunksInOrder(in.dtype, gathered, size_, static_cast<size_t>(out.numel()), out.data);
  });
}

absl::Status GlooComm::AllReduce(const Tensor& x) {
  Drain();
  RETURN_IF_ERROR(CheckAllReduce(x, Device::kCpu));
  if (size_ == 1 || x.numel() == 0) return broken_;
  return Run("all_reduce", [&] {
    // A reduce-scatter over a zero-padded copy, then an all-gather of the reduced chunks: the
    // same per-element summation order as ReduceScatter.
    const size_t es = DTypeSize(x.dtype);
    const size_t n = static_cast<size_t>(x.numel());
    const size_t chunk = (n + size_ - 1) / size_;
    const size_t padded = chunk * size_ * es;
    uint8_t* send = Scratch(1, padded);
    std::memcpy(send, x.data, n * es);
    std::memset(send + n * es, 0, padded - n * es);
    uint8_t* recv = Scratch(0, padded);
    RawAllToAll(send, recv, padded);
    uint8_t* reduced = Scratch(2, chunk * es);
    SumChunksInOrder(x.dtype, recv, size_, chunk, reduced);
    RawAllGather(reduced, send, chunk * es);
    std::memcpy(x.data, send, n * es);
  });
}

absl::Status GlooComm::Broadcast(const Tensor& x, int root) {
  Drain();
  RETURN_IF_ERROR(CheckBroadcast(x, root, size_, Device::kCpu));
  if (size_ == 1 || x.numel() == 0) return broken_;
  return Run("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(x.data), x.bytes());
    opts.setRoot(root);
    opts.setTag(NextTag());
    gloo::broadcast(opts);
  });
}

absl::Status GlooComm::SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  Drain();
  RETURN_IF_ERROR(CheckSendRecv(send, dst, recv, src, rank_, size_, Device::kCpu));
  if (dst == rank_ || send.numel() == 0) {  // a copy to itself (then src == rank_ too), or nothing
    if (send.bytes() > 0) std::memcpy(recv.data, send.data, send.bytes());
    return broken_;
  }
  const std::string op =
      absl::StrCat("send_recv (to ", RankName(dst), ", from ", RankName(src), ")");
  // Whichever wait fails blames its own peer only (a neighbour that finished and exited is not
  // the cause).
  std::vector<int> involved = {dst, src};
  auto exchange = [&] {
    std::unique_ptr<gloo::transport::UnboundBuffer> out =
        context_->createUnboundBuffer(send.data, send.bytes());
    std::unique_ptr<gloo::transport::UnboundBuffer> in =
        context_->createUnboundBuffer(recv.data, recv.bytes());
    // Both are posted before either is waited for (every rank of a ring sends and receives at
    // once), and share one deadline, so the call fails within the timeout, not twice it.
    in->recv(src, SendRecvSlot(src, received_[src]++));
    out->send(dst, SendRecvSlot(rank_, sent_[dst]++));
    const auto deadline = Clock::now() + context_->getTimeout();
    auto remaining = [&] {
      return std::max(
          std::chrono::milliseconds(0),
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    };
    involved = {src};
    in->waitRecv(remaining());
    involved = {dst};
    out->waitSend(remaining());
  };
  return Run(op.c_str(), exchange, involved);
}

absl::Status GlooComm::Barrier() {
  Drain();
  if (size_ == 1) return broken_;
  return Run("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    gloo::barrier(opts);
  });
}

absl::StatusOr<std::unique_ptr<Comm>> GlooComm::Split(int color, int key) {
  Drain();
  std::vector<int32_t> all(2 * size_);
  int32_t mine[2] = {color, key};
  if (size_ == 1) {
    std::memcpy(all.data(), mine, sizeof(mine));
  } else {
    RETURN_IF_ERROR(Run("split", [&] { RawAllGather(mine, all.data(), sizeof(mine)); }));
  }
  RETURN_IF_ERROR(broken_);
  // Every rank sees every color, so all of them reject a bad one together.
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(Name(), ": split: rank ", r, " passed color ",
                                                     all[2 * r], "; colors must be >= 0"));
    }
  }
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const int split_id = splits_++;
  const int n = static_cast<int>(members.size());
  if (n == 1) return std::unique_ptr<Comm>(new SelfComm());
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  std::vector<int> global(n);
  for (int i = 0; i < n; ++i) global[i] = global_ranks_[members[i]];
  const std::string prefix = absl::StrCat(prefix_, ".s", split_id, ".c", color);
  ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context, Connect(*shared_, new_rank, n, prefix));
  std::unique_ptr<GlooComm> comm(
      new GlooComm(shared_, std::move(context), new_rank, n, prefix, std::move(global)));
  RETURN_IF_ERROR(comm->ExchangePeerInfo());
  return std::unique_ptr<Comm>(std::move(comm));
}

}  // namespace ithaca
