#include "server/job_store.h"

#include <dirent.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/core/utf8.h"
#include "engine/spec/job_spec.h"
#include "google/protobuf/util/time_util.h"
#include "launch/layout.h"

namespace ithaca {
namespace {

// An evaluation as a record carries it: at most kMaxEvalPasskeyResults passkey points (the
// first ones, lengths outer as the worker sends them).
void BoundEval(v1::EvalReport* e) {
  const int n = e->passkey_size();
  if (n > JobStore::kMaxEvalPasskeyResults) {
    e->mutable_passkey()->DeleteSubrange(JobStore::kMaxEvalPasskeyResults,
                                         n - JobStore::kMaxEvalPasskeyResults);
  }
}

// history.kind: a v1.StepReport or a v1.EvalReport.
constexpr int64_t kHistoryStep = 0, kHistoryEval = 1;

using google::protobuf::util::TimeUtil;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// "database is locked" is another process holding the store (an operator's sqlite3 shell, a
// backup) past the busy timeout: UNAVAILABLE, which callers may retry, not INTERNAL.
absl::Status SqliteError(sqlite3* db, int rc) {
  const int primary = rc & 0xff;
  const std::string msg = absl::StrCat("sqlite: ", sqlite3_errmsg(db));
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) {
    return absl::UnavailableError(
        absl::StrCat("job store is locked by another process (", msg, "); try again"));
  }
  return absl::InternalError(msg);
}

// One prepared statement; binds by position (1-based) and finalizes on destruction.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(s_); }
  absl::Status status() const {
    return rc_ == SQLITE_OK ? absl::OkStatus()
                            : absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // SQLITE_ROW → true, SQLITE_DONE → false, anything else → error: UNAVAILABLE when another
  // process holds the database locked past the busy timeout (the caller may retry), else
  // INTERNAL.
  absl::StatusOr<bool> Step() {
    RETURN_IF_ERROR(status());
    int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc);
  }
  absl::Status Run() { return Step().status(); }
  // Ends the statement's read: a connection that still holds a read snapshot cannot wait for
  // the write lock (SQLite answers "database is locked" at once, without the busy timeout).
  void Reset() { sqlite3_reset(s_); }
  int64_t Int(int col) { return sqlite3_column_int64(s_, col); }
  std::string Text(int col) {
    const void* p = sqlite3_column_blob(s_, col);
    return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(s_, col)) : "";
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

std::string SlotsToText(const std::vector<int>& slots) { return absl::StrJoin(slots, ","); }

// An id as error messages quote it: a client may send any bytes, of any length.
std::string BoundedId(const std::string& id) {
  constexpr size_t kMax = 64;
  std::string out;
  for (size_t i = 0; i < std::min(id.size(), kMax); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    out.push_back(c < 0x20 || c >= 0x7f ? '?' : static_cast<char>(c));
  }
  if (id.size() > kMax) absl::StrAppend(&out, "... (", id.size(), " bytes)");
  return out;
}

// `text` cut to at most about `max` bytes at a word's end, with "..." when cut.
std::string WholeWords(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  const size_t space = text.rfind(' ', max);
  return BoundedUtf8(text.substr(0, space == std::string::npos ? max : space), max) + " ...";
}

// The largest N among `dir`'s entries named job-N (0 when none or no such directory).
int64_t MaxJobDirSeq(const std::string& dir) {
  int64_t max_seq = 0;
  if (dir.empty()) return 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    int64_t n = 0;
    const std::string name = e->d_name;
    if (ParseJobSeq(name, &n)) {
      max_seq = std::max(max_seq, n);
    }
  }
  closedir(d);
  return max_seq;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const Options& options) {
  // The store is the daemon's own file: a link (out of the state directory, to a file another
  // user keeps) would have SQLite write, and chmod change, whatever it leads to.
  if (struct stat st; lstat(options.path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job store ", options.path, ": ",
        S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file",
        "; ithacad keeps its store as a file of its own in the state directory (move it there)"));
  }
  sqlite3* db = nullptr;
  if (sqlite3_open(options.path.c_str(), &db) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("job store ", options.path, ": ", msg));
  }
  std::unique_ptr<JobStore> store(new JobStore(db, options));
  // The store holds every job's spec, reasons and history: its owner's alone (SQLite gives its
  // journal files the same mode).
  chmod(options.path.c_str(), 0600);
  sqlite3_busy_timeout(db, 5000);
  {
    // A damaged file opens fine and fails later, one RPC at a time: check every page now.
    Stmt check(db, "PRAGMA quick_check");
    absl::StatusOr<bool> row = check.Step();
    const std::string verdict = !row.ok() ? std::string(row.status().message())
                                : *row    ? check.Text(0)
                                          : "no answer";
    if (verdict != "ok") {
      return absl::FailedPreconditionError(absl::StrCat(
          "job store ", options.path, " is damaged (PRAGMA quick_check: ", WholeWords(verdict, 200),
          "); move it aside (ithacad then starts with an empty store; job ids continue after "
          "the job directories) or restore a backup"));
    }
  }
  // WAL + FULL: a committed transition is on disk before the call returns, even across a
  // power loss.
  {
    MutexLock lock(&store->mu_);
    RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"));
    RETURN_IF_ERROR(store->Migrate());
  }
  // Scanned once: every job directory made after this is made for an id this store handed out.
  store->first_free_dir_seq_ = MaxJobDirSeq(options.job_dirs) + 1;
  if (options.path != ":memory:") {
    struct stat st;
    if (stat(options.path.c_str(), &st) != 0) {
      return absl::UnavailableError(absl::StrCat("job store ", options.path, ": cannot stat"));
    }
    store->dev_ = st.st_dev;
    store->ino_ = st.st_ino;
  }
  return store;
}

absl::Status JobStore::CheckIntact() const {
  if (ino_ == 0) return absl::OkStatus();
  struct stat st;
  if (stat(options_.path.c_str(), &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) {
    return absl::UnavailableError(
        absl::StrCat("job store ", options_.path,
                     " was removed or replaced while ithacad was running (its state directory "
                     "deleted?); this ithacad accepts no more jobs: restart it"));
  }
  return absl::OkStatus();
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::InWriteTransaction(const std::function<absl::Status()>& body) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));  // waits (busy timeout) for the write lock here
  absl::Status st = body();
  if (!st.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return st;
  }
  return Exec("COMMIT");
}

absl::Status JobStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err); rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    absl::Status st = SqliteError(db_, rc);
    return absl::Status(st.code(), absl::StrCat(st.message(), " in: ", sql.substr(0, 80)));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Migrate() {
  Stmt v(db_, "PRAGMA user_version");
  ASSIGN_OR_RETURN(bool row, v.Step());
  const int64_t version = row ? v.Int(0) : 0;
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("job store schema version ", version, " is newer than this ithacad's (",
                     kSchemaVersion, "); use a newer ithacad or another --state-dir"));
  }
  if (version == kSchemaVersion) return absl::OkStatus();
  if (version < 1) RETURN_IF_ERROR(CreateInitialSchema());
  // Version 1 → 2: the step and eval history.
  if (version < 2) {
    RETURN_IF_ERROR(
        Exec("BEGIN;"
             "CREATE TABLE IF NOT EXISTS history(job_id TEXT NOT NULL, kind INTEGER NOT NULL,"
             " rank INTEGER NOT NULL, step INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
             " report BLOB NOT NULL);"
             "CREATE INDEX IF NOT EXISTS history_job ON history(job_id);"
             "PRAGMA user_version = 2;"
             "COMMIT;"));
  }
  // Version 2 → 3: the cluster's id of a job (ithacad --cluster slurm).
  if (version < 3) {
    Stmt has(db_, "SELECT COUNT(*) FROM pragma_table_info('jobs') WHERE name = 'cluster_job'");
    ASSIGN_OR_RETURN(bool has_row, has.Step());
    const bool has_column = has_row && has.Int(0) > 0;
    has.Reset();
    RETURN_IF_ERROR(Exec(absl::StrCat(
        "BEGIN;",
        has_column ? "" : "ALTER TABLE jobs ADD COLUMN cluster_job TEXT NOT NULL DEFAULT '';",
        "PRAGMA user_version = 3;"
        "COMMIT;")));
  }
  // Version 3 → 4: the next job number, kept apart from the jobs table so a deleted job's id is
  // never handed out again.
  if (version < 4) {
    RETURN_IF_ERROR(
        Exec("BEGIN;"
             "CREATE TABLE IF NOT EXISTS next_job(seq INTEGER NOT NULL);"
             "INSERT INTO next_job(seq) SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs"
             " WHERE NOT EXISTS (SELECT 1 FROM next_job);"
             "PRAGMA user_version = 4;"
             "COMMIT;"));
  }
  auto has_column = [&](const char* name) -> absl::StatusOr<bool> {
    Stmt has(db_, "SELECT COUNT(*) FROM pragma_table_info('jobs') WHERE name = ?");
    has.Bind(1, std::string(name));
    ASSIGN_OR_RETURN(bool has_row, has.Step());
    return has_row && has.Int(0) > 0;
  };
  // Version 4 → 5: the job a job waits for (submit --after).
  if (version < 5) {
    ASSIGN_OR_RETURN(bool after, has_column("after_job"));
    RETURN_IF_ERROR(Exec(absl::StrCat(
        "BEGIN;", after ? "" : "ALTER TABLE jobs ADD COLUMN after_job TEXT NOT NULL DEFAULT '';",
        "PRAGMA user_version = 5;"
        "COMMIT;")));
  }
  // Version 5 → 6: the restart count, kept apart from the transitions (which are bounded now:
  // the oldest past kKeptFirstTransitions go), and how many transitions were dropped.
  ASSIGN_OR_RETURN(bool restarts, has_column("restarts"));
  ASSIGN_OR_RETURN(bool dropped, has_column("transitions_dropped"));
  return Exec(absl::StrCat(
      "BEGIN;", restarts ? "" : "ALTER TABLE jobs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0;",
      dropped ? "" : "ALTER TABLE jobs ADD COLUMN transitions_dropped INTEGER NOT NULL DEFAULT 0;",
      // Restarts so far: the transitions to QUEUED whose reason starts "restart ".
      "UPDATE jobs SET restarts = (SELECT COUNT(*) FROM transitions t WHERE t.job_id = jobs.id"
      " AND t.to_state = ",
      int64_t{v1::JOB_STATE_QUEUED}, " AND t.reason LIKE 'restart %');",
      "PRAGMA user_version = 6;"
      "COMMIT;"));
}

absl::Status JobStore::CreateInitialSchema() {
  return Exec(absl::StrCat(
      "BEGIN;"
      "CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, seq INTEGER UNIQUE NOT NULL,"
      " name TEXT NOT NULL, state INTEGER NOT NULL, reason TEXT NOT NULL DEFAULT '',"
      " failed_rank INTEGER, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,"
      " slots TEXT NOT NULL DEFAULT '', pgid INTEGER NOT NULL DEFAULT 0, record BLOB NOT NULL);"
      "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);"
      "CREATE TABLE IF NOT EXISTS transitions(job_id TEXT NOT NULL, seq INTEGER NOT NULL,"
      " from_state INTEGER NOT NULL, to_state INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
      " reason TEXT NOT NULL, PRIMARY KEY(job_id, seq));"
      "CREATE TABLE IF NOT EXISTS last_steps(job_id TEXT NOT NULL, rank INTEGER NOT NULL,"
      " report BLOB NOT NULL, PRIMARY KEY(job_id, rank));"
      "PRAGMA user_version = 1;"
      "COMMIT;"));
}

absl::StatusOr<v1::Job> JobStore::Create(const v1::Job& job, const std::string& reason_in) {
  const std::string reason = BoundedUtf8(reason_in, kMaxReasonBytes);
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckIntact());
  Stmt next(db_,
            "SELECT MAX((SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs),"
            " (SELECT COALESCE(MAX(seq), 1) FROM next_job))");
  ASSIGN_OR_RETURN(bool row, next.Step());
  // Never an id used before: not one in the database, nor a deleted one (next_job only grows),
  // nor one whose directory exists.
  const int64_t seq = std::max(row ? next.Int(0) : 1, first_free_dir_seq_);
  next.Reset();
  v1::Job record = job;
  record.set_id(JobIdForSeq(seq));
  record.set_log_dir(absl::StrReplaceAll(job.log_dir(), {{"{id}", record.id()}}));
  record.clear_state();
  record.clear_reason();
  record.clear_failed_rank();
  record.clear_transitions();
  record.clear_last_steps();
  record.clear_last_eval();
  record.clear_slots();
  const int64_t now = NowMs();
  *record.mutable_created_at() = TimeUtil::MillisecondsToTimestamp(now);
  RETURN_IF_ERROR(InWriteTransaction([&]() -> absl::Status {
    Stmt ins(db_,
             "INSERT INTO jobs(id, seq, name, state, reason, created_ms, updated_ms, record,"
             " after_job) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)");
    ins.Bind(1, record.id()).Bind(2, seq).Bind(3, record.name());
    ins.Bind(4, int64_t{v1::JOB_STATE_QUEUED}).Bind(5, reason).Bind(6, now).Bind(7, now);
    ins.BindBlob(8, record.SerializeAsString());
    ins.Bind(9, record.after());
    RETURN_IF_ERROR(ins.Run());
    Stmt tr(db_, "INSERT INTO transitions VALUES(?, 1, ?, ?, ?, ?)");
    tr.Bind(1, record.id()).Bind(2, int64_t{v1::JOB_STATE_UNSPECIFIED});
    tr.Bind(3, int64_t{v1::JOB_STATE_QUEUED}).Bind(4, now).Bind(5, reason);
    RETURN_IF_ERROR(tr.Run());
    Stmt bump(db_, "UPDATE next_job SET seq = ?");
    bump.Bind(1, seq + 1);
    return bump.Run();
  }));
  return GetLocked(record.id());
}

absl::Status JobStore::Delete(const std::string& id) {
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckIntact());
  Stmt q(db_, "SELECT state FROM jobs WHERE id = ?");
  q.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("job \"", BoundedId(id), "\" not found"));
  const JobState state = static_cast<JobState>(q.Int(0));
  q.Reset();
  if (!IsTerminal(state)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", JobStateName(state),
                                                      "; only an ended job can be deleted"));
  }
  return InWriteTransaction([&]() -> absl::Status {
    for (const char* sql :
         {"DELETE FROM history WHERE job_id = ?", "DELETE FROM last_steps WHERE job_id = ?",
          "DELETE FROM transitions WHERE job_id = ?", "DELETE FROM jobs WHERE id = ?"}) {
      Stmt d(db_, sql);
      d.Bind(1, id);
      RETURN_IF_ERROR(d.Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::Job> JobStore::Get(const std::string& id) {
  MutexLock lock(&mu_);
  return GetLocked(id);
}

absl::StatusOr<v1::Job> JobStore::GetLocked(const std::string& id) {
  Stmt q(db_,
         "SELECT record, state, reason, failed_rank IS NOT NULL, failed_rank, updated_ms, slots,"
         " cluster_job, after_job, restarts, transitions_dropped FROM jobs WHERE id = ?");
  q.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("job \"", BoundedId(id), "\" not found"));
  v1::Job job;
  if (!job.ParseFromString(q.Text(0))) {
    return absl::DataLossError(absl::StrCat("job store: record of ", id, " is corrupt"));
  }
  // A spec stored by an older ithacad is served with today's key names, so every reader (the
  // supervisor launching it, a restart, `status`) reads a job queued or running across an upgrade.
  job.set_spec_toml(UpgradeStoredSpec(job.spec_toml()));
  job.set_state(static_cast<JobState>(q.Int(1)));
  job.set_reason(BoundedUtf8(q.Text(2), kMaxReasonBytes));
  if (q.Int(3)) job.set_failed_rank(static_cast<int32_t>(q.Int(4)));
  *job.mutable_updated_at() = TimeUtil::MillisecondsToTimestamp(q.Int(5));
  for (absl::string_view s : absl::StrSplit(q.Text(6), ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(s, &v)) job.add_slots(v);
  }
  job.set_cluster_job(q.Text(7));
  job.set_after(q.Text(8));
  job.set_restarts(static_cast<int32_t>(q.Int(9)));
  job.set_transitions_omitted(q.Int(10));
  Stmt t(db_,
         "SELECT from_state, to_state, time_ms, reason FROM transitions WHERE job_id = ?"
         " ORDER BY seq");
  t.Bind(1, id);
  while (true) {
    ASSIGN_OR_RETURN(bool more, t.Step());
    if (!more) break;
    v1::StateTransition* tr = job.add_transitions();
    tr->set_from(static_cast<JobState>(t.Int(0)));
    tr->set_to(static_cast<JobState>(t.Int(1)));
    *tr->mutable_time() = TimeUtil::MillisecondsToTimestamp(t.Int(2));
    tr->set_reason(BoundedUtf8(t.Text(3), kMaxReasonBytes));
  }
  Stmt s(db_, "SELECT report FROM last_steps WHERE job_id = ? ORDER BY rank");
  s.Bind(1, id);
  while (true) {
    ASSIGN_OR_RETURN(bool more, s.Step());
    if (!more) break;
    job.add_last_steps()->ParseFromString(s.Text(0));
  }
  // The newest evaluation is the history's newest eval row (one record of each evaluation).
  Stmt e(db_,
         "SELECT report FROM history WHERE job_id = ? AND kind = ? ORDER BY rowid DESC LIMIT 1");
  e.Bind(1, id).Bind(2, kHistoryEval);
  ASSIGN_OR_RETURN(bool has_eval, e.Step());
  if (has_eval) {
    job.mutable_last_eval()->ParseFromString(e.Text(0));
    BoundEval(job.mutable_last_eval());
  }
  if (job.ByteSizeLong() > kMaxJobRecordBytes) job.mutable_last_eval()->clear_passkey();
  if (job.ByteSizeLong() > kMaxJobRecordBytes && job.last_steps_size() > 1) {
    job.mutable_last_steps()->DeleteSubrange(1, job.last_steps_size() - 1);
  }
  return job;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::List(const std::vector<JobState>& states, int limit,
                                                    int64_t before_seq) {
  MutexLock lock(&mu_);
  std::string sql = "SELECT id FROM jobs WHERE 1";
  if (!states.empty()) {
    std::vector<int> v(states.begin(), states.end());
    absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(v, ","), ")");
  }
  if (before_seq > 0) absl::StrAppend(&sql, " AND seq < ", before_seq);
  absl::StrAppend(&sql, " ORDER BY seq DESC");
  if (limit > 0) absl::StrAppend(&sql, " LIMIT ", limit);
  Stmt q(db_, sql.c_str());
  std::vector<std::string> ids;
  while (true) {
    ASSIGN_OR_RETURN(bool more, q.Step());
    if (!more) break;
    ids.push_back(q.Text(0));
  }
  std::vector<v1::Job> jobs;
  for (const std::string& id : ids) {
    ASSIGN_OR_RETURN(v1::Job j, GetLocked(id));
    jobs.push_back(std::move(j));
  }
  return jobs;
}

absl::StatusOr<v1::Job> JobStore::Transition(const std::string& id, JobState to,
                                             const std::string& reason_in,
                                             std::optional<int> failed_rank, bool restart) {
  const std::string reason = BoundedUtf8(reason_in, kMaxReasonBytes);
  MutexLock lock(&mu_);
  Stmt q(db_,
         "SELECT state, (SELECT COALESCE(MAX(seq), 0) FROM transitions WHERE job_id = ?1)"
         " FROM jobs WHERE id = ?1");
  q.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("job \"", BoundedId(id), "\" not found"));
  const JobState from = static_cast<JobState>(q.Int(0));
  const int64_t last_seq = q.Int(1);
  q.Reset();
  if (!IsAllowedTransition(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", JobStateName(from),
                                                      "; it cannot become ", JobStateName(to)));
  }
  const int64_t now = NowMs();
  RETURN_IF_ERROR(InWriteTransaction([&]() -> absl::Status {
    Stmt up(db_, failed_rank
                     ? "UPDATE jobs SET state = ?, reason = ?, updated_ms = ?, failed_rank = ?"
                       " WHERE id = ?"
                     : "UPDATE jobs SET state = ?, reason = ?, updated_ms = ? WHERE id = ?");
    up.Bind(1, int64_t{to}).Bind(2, reason).Bind(3, now);
    if (failed_rank) {
      up.Bind(4, int64_t{*failed_rank}).Bind(5, id);
    } else {
      up.Bind(4, id);
    }
    RETURN_IF_ERROR(up.Run());
    if (restart) {
      Stmt count(db_, "UPDATE jobs SET restarts = restarts + 1 WHERE id = ?");
      count.Bind(1, id);
      RETURN_IF_ERROR(count.Run());
    }
    Stmt tr(db_, "INSERT INTO transitions VALUES(?, ?, ?, ?, ?, ?)");
    tr.Bind(1, id).Bind(2, last_seq + 1).Bind(3, int64_t{from}).Bind(4, int64_t{to});
    tr.Bind(5, now).Bind(6, reason);
    RETURN_IF_ERROR(tr.Run());
    // Bounded: the first kKeptFirstTransitions (how the job began) and the newest, up to
    // kMaxTransitions in all; the one in between that goes is counted.
    const int64_t drop =
        last_seq + 1 - kKeptFirstTransitions - (kMaxTransitions - kKeptFirstTransitions);
    if (drop <= 0) return absl::OkStatus();
    const int64_t victim = kKeptFirstTransitions + drop;  // seqs are 1-based and never reused
    Stmt del(db_, "DELETE FROM transitions WHERE job_id = ? AND seq = ?");
    del.Bind(1, id).Bind(2, victim);
    RETURN_IF_ERROR(del.Run());
    Stmt counted(
        db_, "UPDATE jobs SET transitions_dropped = transitions_dropped + changes() WHERE id = ?");
    counted.Bind(1, id);
    return counted.Run();
  }));
  return GetLocked(id);
}

absl::Status JobStore::SetLaunch(const std::string& id, const std::vector<int>& slots, int pgid) {
  MutexLock lock(&mu_);
  Stmt up(db_, "UPDATE jobs SET slots = ?, pgid = ?, updated_ms = ? WHERE id = ?");
  up.Bind(1, SlotsToText(slots)).Bind(2, int64_t{pgid}).Bind(3, NowMs()).Bind(4, id);
  return up.Run();
}

absl::Status JobStore::SetClusterJob(const std::string& id, const std::string& cluster_job) {
  MutexLock lock(&mu_);
  Stmt up(db_, "UPDATE jobs SET cluster_job = ?, updated_ms = ? WHERE id = ?");
  up.Bind(1, cluster_job).Bind(2, NowMs()).Bind(3, id);
  return up.Run();
}

absl::StatusOr<int> JobStore::ProcessGroup(const std::string& id) {
  MutexLock lock(&mu_);
  Stmt q(db_, "SELECT pgid FROM jobs WHERE id = ?");
  q.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("job \"", BoundedId(id), "\" not found"));
  return static_cast<int>(q.Int(0));
}

absl::Status JobStore::RecordStep(const std::string& id, const v1::StepReport& report) {
  MutexLock lock(&mu_);
  const std::string blob = report.SerializeAsString();
  const int64_t step = report.step();
  const bool keep = (report.rank() == 0 && step <= kHistoryDenseSteps) ||
                    step % kHistoryEvery == 0 || step == report.total_steps() ||
                    report.checkpoint_seconds() > 0;
  // The rank's last step and its history row together or not at all: a daemon killed between
  // the two would leave a step that the history lacks (or the other way round).
  return InWriteTransaction([&]() -> absl::Status {
    // A step at or before the rank's newest one is a step run again (a retry resumed from an
    // earlier checkpoint): the history keeps the last run of each step, so what the attempt
    // before wrote from this step on goes (issue 53: 781 records for 600 steps).
    Stmt last(db_, "SELECT report FROM last_steps WHERE job_id = ? AND rank = ?");
    last.Bind(1, id).Bind(2, int64_t{report.rank()});
    ASSIGN_OR_RETURN(bool had, last.Step());
    v1::StepReport newest;
    if (had && newest.ParseFromString(last.Text(0)) && step <= newest.step()) {
      Stmt drop(db_, "DELETE FROM history WHERE job_id = ? AND rank = ? AND step >= ?");
      drop.Bind(1, id).Bind(2, int64_t{report.rank()}).Bind(3, step);
      RETURN_IF_ERROR(drop.Run());
    }
    Stmt up(db_, "INSERT OR REPLACE INTO last_steps(job_id, rank, report) VALUES(?, ?, ?)");
    up.Bind(1, id).Bind(2, int64_t{report.rank()}).BindBlob(3, blob);
    RETURN_IF_ERROR(up.Run());
    if (!keep) return absl::OkStatus();
    Stmt h(db_, "INSERT INTO history VALUES(?, ?, ?, ?, ?, ?)");
    h.Bind(1, id).Bind(2, kHistoryStep).Bind(3, int64_t{report.rank()}).Bind(4, step);
    h.Bind(5, NowMs()).BindBlob(6, blob);
    return h.Run();
  });
}

absl::Status JobStore::RecordEval(const std::string& id, const v1::EvalReport& report) {
  MutexLock lock(&mu_);
  Stmt h(db_, "INSERT INTO history VALUES(?, ?, ?, ?, ?, ?)");
  h.Bind(1, id).Bind(2, kHistoryEval).Bind(3, int64_t{report.rank()}).Bind(4, report.step());
  h.Bind(5, NowMs()).BindBlob(6, report.SerializeAsString());
  return h.Run();
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::History(const std::string& id) {
  MutexLock lock(&mu_);
  Stmt exists(db_, "SELECT 1 FROM jobs WHERE id = ?");
  exists.Bind(1, id);
  ASSIGN_OR_RETURN(bool found, exists.Step());
  if (!found) return absl::NotFoundError(absl::StrCat("job \"", BoundedId(id), "\" not found"));
  Stmt q(db_, "SELECT kind, time_ms, report FROM history WHERE job_id = ? ORDER BY rowid");
  q.Bind(1, id);
  std::vector<v1::JobEvent> out;
  while (true) {
    ASSIGN_OR_RETURN(bool more, q.Step());
    if (!more) break;
    v1::JobEvent e;
    e.set_seq(static_cast<int64_t>(out.size()) + 1);
    *e.mutable_time() = TimeUtil::MillisecondsToTimestamp(q.Int(1));
    const bool parsed = q.Int(0) == kHistoryEval ? e.mutable_eval()->ParseFromString(q.Text(2))
                                                 : e.mutable_step()->ParseFromString(q.Text(2));
    if (e.has_eval()) BoundEval(e.mutable_eval());
    if (!parsed) {
      return absl::DataLossError(absl::StrCat("job store ", options_.path, ": job ", id,
                                              "'s history row ", out.size() + 1,
                                              " does not parse"));
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::map<JobState, int64_t>> JobStore::CountByState() {
  MutexLock lock(&mu_);
  Stmt q(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  std::map<JobState, int64_t> out;
  while (true) {
    ASSIGN_OR_RETURN(bool more, q.Step());
    if (!more) break;
    out[static_cast<JobState>(q.Int(0))] = q.Int(1);
  }
  return out;
}

}  // namespace ithaca
