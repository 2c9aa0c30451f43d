#include "server/job_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/spec/job_spec.h"

namespace ithaca {
namespace {

std::unique_ptr<JobStore> OpenMemory() {
  auto s = JobStore::Open({":memory:"});
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

v1::Job Template(const std::string& name) {
  v1::Job j;
  j.set_name(name);
  j.set_spec_toml("name = \"" + name + "\"\n");
  j.mutable_spec()->set_world(2);
  j.set_log_dir("/state/jobs/{id}");
  return j;
}

TEST(JobStoreTest, CreateAssignsSequentialIdsAndRecordsTheFirstTransition) {
  auto store = OpenMemory();
  auto a = store->Create(Template("a"), "submitted");
  auto b = store->Create(Template("b"), "submitted");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->id(), "job-1");
  EXPECT_EQ(b->id(), "job-2");
  EXPECT_EQ(a->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(a->log_dir(), "/state/jobs/job-1");
  EXPECT_EQ(a->spec().world(), 2);
  ASSERT_EQ(a->transitions_size(), 1);
  EXPECT_EQ(a->transitions(0).from(), v1::JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(a->transitions(0).to(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(a->transitions(0).reason(), "submitted");
  EXPECT_GT(a->created_at().seconds(), 1600000000);
}

// A job stored by the previous ithacad, whose spec has the keys of then (memory.checkpoint, now
// memory.recompute: issue 30), reads with today's names after a restart, through Get and List.
TEST(JobStoreTest, ASpecStoredWithRenamedKeysIsServedUnderTheNewNames) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_keys.db";
  std::remove(path.c_str());
  v1::Job old = Template("old");
  old.set_spec_toml(
      "name = \"old\"\n[data]\npath = \"d.tok\"\n[memory]\ncheckpoint = \"attention-aware\"\n"
      "checkpoint_interval = 2\noffload = true\n[checkpoint]\ndir = \"ckpt\"\nresume = true\n");
  ASSERT_FALSE(ParseJobSpec(old.spec_toml()).ok());  // today's parser alone refuses it
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Create(old, "submitted").ok());
  }
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<v1::Job> got = (*store)->Get("job-1");
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<std::vector<v1::Job>> listed = (*store)->List({}, 0);
  ASSERT_TRUE(listed.ok() && listed->size() == 1);
  for (const v1::Job& job : {*got, listed->front()}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_toml(), "job-1");
    ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << job.spec_toml();
    EXPECT_EQ(spec->memory.recompute, RecomputePolicy::kAttentionAware);
    EXPECT_EQ(spec->memory.recompute_interval, 2);
    EXPECT_EQ(spec->memory.offload, OffloadChoice::kOn);
    EXPECT_EQ(spec->checkpoint.dir, "ckpt");  // [checkpoint] keeps its name
    EXPECT_TRUE(spec->checkpoint.resume);
  }
}

TEST(JobStoreTest, TransitionsFollowTheStateMachineAndKeepHistory) {
  auto store = OpenMemory();
  const std::string id = store->Create(Template("a"), "submitted")->id();
  ASSERT_TRUE(store->Transition(id, v1::JOB_STATE_STARTING, "launched").ok());
  ASSERT_TRUE(store->Transition(id, v1::JOB_STATE_RUNNING, "registered").ok());
  auto failed = store->Transition(id, v1::JOB_STATE_FAILED, "rank 1 exited with code 4", 1);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->reason(), "rank 1 exited with code 4");
  ASSERT_TRUE(failed->has_failed_rank());
  EXPECT_EQ(failed->failed_rank(), 1);
  ASSERT_EQ(failed->transitions_size(), 4);
  EXPECT_EQ(failed->transitions(3).from(), v1::JOB_STATE_RUNNING);
  // Terminal states stay.
  auto again = store->Transition(id, v1::JOB_STATE_RUNNING, "no");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("FAILED"), std::string::npos);
  // Skipping STARTING is not allowed either.
  const std::string id2 = store->Create(Template("b"), "submitted")->id();
  EXPECT_EQ(store->Transition(id2, v1::JOB_STATE_RUNNING, "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Transition("job-99", v1::JOB_STATE_RUNNING, "x").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, ListFiltersByStateNewestFirstAndCounts) {
  auto store = OpenMemory();
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(store->Create(Template(n), "s").ok());
  ASSERT_TRUE(store->Transition("job-2", v1::JOB_STATE_CANCELLED, "user").ok());
  auto all = store->List({}, 0);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id(), "job-3");
  auto queued = store->List({v1::JOB_STATE_QUEUED}, 0);
  ASSERT_EQ(queued->size(), 2u);
  EXPECT_EQ(store->List({}, 1)->size(), 1u);
  auto counts = store->CountByState();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ((*counts)[v1::JOB_STATE_QUEUED], 2);
  EXPECT_EQ((*counts)[v1::JOB_STATE_CANCELLED], 1);
}

TEST(JobStoreTest, KeepsTheNewestStepOfEachRankAndTheLaunch) {
  auto store = OpenMemory();
  const std::string id = store->Create(Template("a"), "s")->id();
  for (int step = 1; step <= 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::StepReport r;
      r.set_rank(rank);
      r.set_step(step);
      r.set_loss(5.0 - step);
      ASSERT_TRUE(store->RecordStep(id, r).ok());
    }
  }
  ASSERT_TRUE(store->SetLaunch(id, {2, 3}, 4242).ok());
  auto job = store->Get(id);
  ASSERT_EQ(job->last_steps_size(), 2);
  EXPECT_EQ(job->last_steps(1).rank(), 1);
  EXPECT_EQ(job->last_steps(1).step(), 3);
  EXPECT_DOUBLE_EQ(job->last_steps(0).loss(), 2.0);
  EXPECT_EQ(job->slots_size(), 2);
  EXPECT_EQ(job->slots(1), 3);
  EXPECT_EQ(*store->ProcessGroup(id), 4242);
  EXPECT_EQ(store->Get("job-7").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, KeepsTheNewestEvaluation) {
  auto store = OpenMemory();
  const std::string id = store->Create(Template("a"), "s")->id();
  EXPECT_FALSE(store->Get(id)->has_last_eval());
  for (int step = 10; step <= 20; step += 10) {
    v1::EvalReport e;
    e.set_step(step);
    e.set_loss(4.0 - step / 10.0);
    e.set_tokens(4096);
    ASSERT_TRUE(store->RecordEval(id, e).ok());
  }
  auto job = store->Get(id);
  ASSERT_TRUE(job->has_last_eval());
  EXPECT_EQ(job->last_eval().step(), 20);
  EXPECT_DOUBLE_EQ(job->last_eval().loss(), 2.0);
  EXPECT_EQ(job->last_eval().tokens(), 4096);
  // Another job's record has none.
  EXPECT_FALSE(store->Get(store->Create(Template("b"), "s")->id())->has_last_eval());
}

// One evaluation with 127,097 passkey points (stored by an ithacad that took any report) made its
// job larger than gRPC's 4 MiB, and list, status and watch failed for every client (issue 53 R3):
// a record is served within kMaxJobRecordBytes whatever was stored, its evaluation keeping its
// loss and the first points the spec could have asked for, and so are the history's rows.
TEST(JobStoreTest, ARecordIsBoundedWhateverEvaluationWasStored) {
  auto store = OpenMemory();
  const std::string id = store->Create(Template("a"), "s")->id();
  v1::EvalReport e;
  e.set_step(10);
  e.set_loss(2.5);
  for (int i = 0; i < 127097; ++i) {
    v1::PasskeyResult* p = e.add_passkey();
    p->set_length(1024 + i);
    p->set_depth(0.5);
    p->set_samples(4);
    p->set_accuracy(1);
    p->set_logprob(-0.25);
    p->set_seconds(1.5);
  }
  ASSERT_GT(e.ByteSizeLong(), size_t{4} << 20);
  ASSERT_TRUE(store->RecordEval(id, e).ok());
  absl::StatusOr<v1::Job> job = store->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_LE(job->ByteSizeLong(), JobStore::kMaxJobRecordBytes);
  EXPECT_DOUBLE_EQ(job->last_eval().loss(), 2.5);
  EXPECT_EQ(job->last_eval().passkey_size(), JobStore::kMaxEvalPasskeyResults);
  EXPECT_EQ(job->last_eval().passkey(0).length(), 1024);
  absl::StatusOr<std::vector<v1::Job>> listed = store->List({}, 10, 0);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_LE((*listed)[0].ByteSizeLong(), JobStore::kMaxJobRecordBytes);
  absl::StatusOr<std::vector<v1::JobEvent>> history = store->History(id);
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 1u);
  EXPECT_LE((*history)[0].ByteSizeLong(), JobStore::kMaxJobRecordBytes);
  EXPECT_EQ((*history)[0].eval().passkey_size(), JobStore::kMaxEvalPasskeyResults);
}

// A store written by the previous ithacad (schema version 1, no history table) is migrated at
// open, keeping its jobs, and then keeps evaluations.
TEST(JobStoreTest, MigratesAVersion1Store) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_v1.db";
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "DROP TABLE history; PRAGMA user_version = 1", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Get("job-1").ok());
  v1::EvalReport e;
  e.set_loss(1.5);
  ASSERT_TRUE((*store)->RecordEval("job-1", e).ok());
  store->reset();
  store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_DOUBLE_EQ((*store)->Get("job-1")->last_eval().loss(), 1.5) << "kept across a reopen";
}

// A deleted job's rows go, and its number is never handed out again, across a reopen too; a
// live job is not deleted.
TEST(JobStoreTest, DeleteRemovesAnEndedJobAndItsIdStaysUsed) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_del.db";
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_EQ((*store)->Create(Template("a"), "s")->id(), "job-1");
    ASSERT_EQ((*store)->Create(Template("b"), "s")->id(), "job-2");
    EXPECT_TRUE(absl::IsFailedPrecondition((*store)->Delete("job-2")));
    ASSERT_TRUE((*store)->Transition("job-2", v1::JOB_STATE_CANCELLED, "x").ok());
    v1::StepReport r;
    r.set_step(1);
    ASSERT_TRUE((*store)->RecordStep("job-2", r).ok());
    ASSERT_TRUE((*store)->Delete("job-2").ok());
    EXPECT_TRUE(absl::IsNotFound((*store)->Get("job-2").status()));
    EXPECT_TRUE(absl::IsNotFound((*store)->History("job-2").status()));
    EXPECT_TRUE(absl::IsNotFound((*store)->Delete("job-2")));
    EXPECT_EQ((*store)->List({}, 0)->size(), 1u);
    EXPECT_EQ((*store)->Create(Template("c"), "s")->id(), "job-3");
    ASSERT_TRUE((*store)->Transition("job-3", v1::JOB_STATE_CANCELLED, "x").ok());
    ASSERT_TRUE((*store)->Delete("job-3").ok());
  }
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Create(Template("d"), "s")->id(), "job-4");
}

// A store of schema version 2 (before jobs.cluster_job) gains the column at open, and a job's
// cluster id (ithacad --cluster slurm's Slurm job id) is kept across a reopen.
TEST(JobStoreTest, MigratesAVersion2StoreAndKeepsClusterJobs) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_v2.db";
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE jobs DROP COLUMN cluster_job; PRAGMA user_version = 2",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Get("job-1")->cluster_job(), "");
  ASSERT_TRUE((*store)->SetClusterJob("job-1", "slurm:42").ok());
  store->reset();
  store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Get("job-1")->cluster_job(), "slurm:42");
}

// A store of schema version 4 (before jobs.after_job) gains the column at open; the job a job
// waits for (submit --after) is kept across a reopen, so a dependency survives a restart.
TEST(JobStoreTest, MigratesAVersion4StoreAndKeepsTheJobAJobWaitsFor) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_v4.db";
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE jobs DROP COLUMN after_job; PRAGMA user_version = 4",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Get("job-1")->after(), "");
  v1::Job waits = Template("b");
  waits.set_after("job-1");
  ASSERT_EQ((*store)->Create(waits, "s")->after(), "job-1");
  store->reset();
  store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Get("job-2")->after(), "job-1");
  EXPECT_EQ((*store)->Get("job-1")->after(), "");
  sqlite3* check = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &check), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(
      sqlite3_prepare_v2(check, "SELECT after_job FROM jobs WHERE id = 'job-2'", -1, &q, nullptr),
      SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(q, 0))), "job-1");
  sqlite3_finalize(q);
  sqlite3_close(check);
}

// A job restarted, drained and requeued without end keeps a bounded history (issue 43 N7): its
// first transitions and its newest, the others counted, and its restarts counted exactly.
TEST(JobStoreTest, TransitionsAreBoundedAndRestartsCountedApart) {
  auto store = OpenMemory();
  ASSERT_TRUE(store->Create(Template("cycling"), "submitted").ok());
  const int kCycles = 400;  // each: STARTING, RUNNING, then QUEUED again (a restart or a drain)
  for (int i = 0; i < kCycles; ++i) {
    ASSERT_TRUE(store->Transition("job-1", v1::JOB_STATE_STARTING, "start").ok());
    ASSERT_TRUE(store->Transition("job-1", v1::JOB_STATE_RUNNING, "run").ok());
    const bool restart = i % 2 == 0;
    ASSERT_TRUE(store
                    ->Transition("job-1", v1::JOB_STATE_QUEUED,
                                 absl::StrCat(restart ? "restart " : "drained ", i), std::nullopt,
                                 restart)
                    .ok());
  }
  absl::StatusOr<v1::Job> job = store->Get("job-1");
  ASSERT_TRUE(job.ok());
  const int64_t total = 1 + 3 * kCycles;
  EXPECT_EQ(job->transitions_size(), JobStore::kMaxTransitions);
  EXPECT_EQ(job->transitions_omitted(), total - JobStore::kMaxTransitions);
  EXPECT_EQ(job->restarts(), kCycles / 2);
  EXPECT_EQ(job->transitions(0).reason(), "submitted");  // how it began
  EXPECT_EQ(job->transitions(JobStore::kKeptFirstTransitions - 1).to(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job->transitions(job->transitions_size() - 1).reason(),
            absl::StrCat("drained ", kCycles - 1));  // and where it is now
  EXPECT_LT(job->ByteSizeLong(), 64 << 10);
}

// A version 5 store's restarts are counted from its transitions when it is opened.
TEST(JobStoreTest, MigratesAVersion5StoreCountingItsRestarts) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_v5.db";
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
    for (const char* reason : {"restart 1 of 3 in 0 s", "drained by ithacad"}) {
      ASSERT_TRUE((*store)->Transition("job-1", v1::JOB_STATE_STARTING, "").ok());
      ASSERT_TRUE((*store)->Transition("job-1", v1::JOB_STATE_QUEUED, reason).ok());
    }
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "ALTER TABLE jobs DROP COLUMN restarts; ALTER TABLE jobs DROP COLUMN "
                         "transitions_dropped; PRAGMA user_version = 5",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Get("job-1")->restarts(), 1);
  EXPECT_EQ((*store)->Get("job-1")->transitions_omitted(), 0);
}

TEST(JobStoreTest, SurvivesReopenAndRefusesNewerSchemas) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_test.db";
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
    ASSERT_TRUE((*store)->Transition("job-1", v1::JOB_STATE_STARTING, "launched").ok());
  }
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    auto job = (*store)->Get("job-1");
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->state(), v1::JOB_STATE_STARTING);
    EXPECT_EQ(job->transitions_size(), 2);
    EXPECT_EQ((*store)->Create(Template("b"), "s")->id(), "job-2");
  }
  // A file from a newer ithacad is refused, not rewritten.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto newer = JobStore::Open({path});
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(JobStoreTest, HistoryKeepsRankZerosStepsSampledOthersAndEvals) {
  auto store = OpenMemory();
  auto job = store->Create(Template("h"), "submitted");
  ASSERT_TRUE(job.ok());
  for (int step = 1; step <= 25; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::StepReport r;
      r.set_rank(rank);
      r.set_step(step);
      r.set_total_steps(25);
      r.set_loss(10.0 / step);
      ASSERT_TRUE(store->RecordStep(job->id(), r).ok());
    }
    if (step == 12) {
      v1::EvalReport e;
      e.set_step(12);
      e.set_loss(0.5);
      ASSERT_TRUE(store->RecordEval(job->id(), e).ok());
    }
  }
  auto history = store->History(job->id());
  ASSERT_TRUE(history.ok()) << history.status();
  std::vector<int64_t> rank0, rank1, evals;
  for (const v1::JobEvent& e : *history) {
    EXPECT_GT(e.time().seconds(), 1700000000);
    if (e.has_eval()) {
      evals.push_back(e.eval().step());
      EXPECT_EQ(e.eval().loss(), 0.5);
    } else {
      ASSERT_TRUE(e.has_step());
      (e.step().rank() == 0 ? rank0 : rank1).push_back(e.step().step());
      EXPECT_DOUBLE_EQ(e.step().loss(), 10.0 / e.step().step());
    }
  }
  EXPECT_EQ(rank0.size(), 25u);
  EXPECT_EQ(rank1, (std::vector<int64_t>{10, 20, 25}));  // every 10th and the last
  EXPECT_EQ(evals, (std::vector<int64_t>{12}));
  // In order: the eval after step 12's reports.
  EXPECT_TRUE((*history)[13].has_eval()) << (*history)[13].DebugString();
  EXPECT_EQ(store->History("job-9").status().code(), absl::StatusCode::kNotFound);
}

// Steps run again after a retry (resumed from an earlier checkpoint) appeared twice in the
// history (issue 53: 781 records for 600 steps): it keeps the last run of each step, and an
// evaluation of the attempt before past the point it resumed from goes with its steps.
TEST(JobStoreTest, HistoryKeepsTheLastRunOfEachStep) {
  auto store = OpenMemory();
  auto job = store->Create(Template("r"), "submitted");
  ASSERT_TRUE(job.ok());
  auto run = [&](int from, int to, double loss) {
    for (int step = from; step <= to; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        v1::StepReport r;
        r.set_rank(rank);
        r.set_step(step);
        r.set_total_steps(30);
        r.set_loss(loss);
        ASSERT_TRUE(store->RecordStep(job->id(), r).ok());
      }
      if (step == 15) {
        v1::EvalReport e;
        e.set_step(15);
        e.set_loss(loss);
        ASSERT_TRUE(store->RecordEval(job->id(), e).ok());
      }
    }
  };
  run(1, 20, 1.0);   // the first attempt, killed after step 20
  run(11, 30, 2.0);  // the retry, resumed from step 10's checkpoint
  auto history = store->History(job->id());
  ASSERT_TRUE(history.ok()) << history.status();
  std::vector<int64_t> rank0, rank1;
  std::vector<double> evals;
  for (const v1::JobEvent& e : *history) {
    if (e.has_eval()) {
      evals.push_back(e.eval().loss());
      continue;
    }
    (e.step().rank() == 0 ? rank0 : rank1).push_back(e.step().step());
    EXPECT_DOUBLE_EQ(e.step().loss(), e.step().step() <= 10 ? 1.0 : 2.0) << e.step().step();
  }
  std::vector<int64_t> all(30);
  for (int i = 0; i < 30; ++i) all[i] = i + 1;
  EXPECT_EQ(rank0, all);
  EXPECT_EQ(rank1, (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ(evals, (std::vector<double>{2.0}));
}

TEST(JobStoreTest, AVersionOneDatabaseGainsTheHistoryTable) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/v1.db";
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "DROP TABLE history; PRAGMA user_version = 1", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  v1::StepReport r;
  r.set_step(1);
  ASSERT_TRUE((*store)->RecordStep("job-1", r).ok());
  auto history = (*store)->History("job-1");
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(history->size(), 1u);
  EXPECT_EQ((*store)->Get("job-1")->name(), "a");
}

std::string TestPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

// A step's two writes (the rank's last step, its history row) are one transaction: when the
// history insert fails (a trigger stands in for a crash between the two), the last step is not
// moved on either, so an adopting daemon never sees a step the history lacks.
TEST(JobStoreTest, AStepIsRecordedWholeOrNotAtAll) {
  const std::string path = TestPath("atomic-step.db");
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TRIGGER boom BEFORE INSERT ON history WHEN NEW.step = 7 "
                         "BEGIN SELECT RAISE(ABORT, 'disk gone'); END",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok()) << store.status();
  v1::StepReport r;
  r.set_total_steps(7);
  r.set_step(6);
  ASSERT_TRUE((*store)->RecordStep("job-1", r).ok());
  r.set_step(7);  // the last step: always kept in the history
  EXPECT_FALSE((*store)->RecordStep("job-1", r).ok());
  absl::StatusOr<v1::Job> job = (*store)->Get("job-1");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->last_steps_size(), 1);
  EXPECT_EQ(job->last_steps(0).step(), 6) << "the last step moved on without its history row";
  auto history = (*store)->History("job-1");
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 1u);
  EXPECT_EQ((*history)[0].step().step(), 6);
}

TEST(JobStoreTest, ADamagedDatabaseIsRefusedAtOpenNamingTheFile) {
  const std::string path = TestPath("damaged.db");
  unlink(path.c_str());
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    v1::Job big = Template("big");
    big.set_spec_toml(std::string(3000, 'x'));  // many pages
    for (int i = 0; i < 40; ++i) ASSERT_TRUE((*store)->Create(big, "s").ok());
  }
  {  // scribble over the second and third pages
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 4096 + 100, SEEK_SET);
    const std::string junk(6000, '\xA5');
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
  }
  auto damaged = JobStore::Open({path});
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(damaged.status().message().find(path + " is damaged"), std::string::npos)
      << damaged.status();
  // SQLite's verdict, cut at a word's end when long (it listed every damaged page).
  const std::string message(damaged.status().message());
  const size_t from = message.find("quick_check: ") + 13, to = message.find("); move it aside");
  ASSERT_NE(to, std::string::npos) << message;
  const std::string verdict = message.substr(from, to - from);
  EXPECT_LE(verdict.size(), 204u) << verdict;
  if (absl::EndsWith(verdict, " ...")) {
    EXPECT_NE(verdict[verdict.size() - 5], ' ') << verdict;
  }
}

// jobs.db that is a link (out of the state directory) is refused, and what it leads to is left
// alone (issue 43 cosmetics).
TEST(JobStoreTest, AStoreThatIsALinkIsRefused) {
  const std::string target = TestPath("elsewhere.db"), link = TestPath("linked-jobs.db");
  unlink(link.c_str());
  { std::ofstream(target) << ""; }
  chmod(target.c_str(), 0644);
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  auto store = JobStore::Open({link});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find(link + ": a symbolic link"), std::string::npos)
      << store.status();
  struct stat st;
  ASSERT_EQ(stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);  // not chmod-ed through the link
  EXPECT_EQ(st.st_size, 0);
}

TEST(JobStoreTest, IdsNeverGoBackWhenTheDatabaseIsEmptied) {
  const std::string path = TestPath("emptied.db");
  const std::string jobs = TestPath("emptied-jobs");
  unlink(path.c_str());
  mkdir(jobs.c_str(), 0755);
  for (const char* d : {"/job-1", "/job-7", "/job-notanumber"}) mkdir((jobs + d).c_str(), 0755);
  auto store = JobStore::Open({path, jobs});
  ASSERT_TRUE(store.ok());
  // job-7's directory (with its logs) exists: the next job is job-8, not job-1.
  EXPECT_EQ((*store)->Create(Template("a"), "s")->id(), "job-8");
  EXPECT_EQ((*store)->Create(Template("b"), "s")->id(), "job-9");
}

TEST(JobStoreTest, ADeletedDatabaseAcceptsNoMoreJobs) {
  const std::string path = TestPath("deleted.db");
  unlink(path.c_str());
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->CheckIntact().ok());
  ASSERT_TRUE((*store)->Create(Template("a"), "s").ok());
  ASSERT_EQ(unlink(path.c_str()), 0);
  EXPECT_EQ((*store)->CheckIntact().code(), absl::StatusCode::kUnavailable);
  auto refused = (*store)->Create(Template("b"), "s");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find(path + " was removed or replaced"), std::string::npos)
      << refused.status();
}

TEST(JobStoreTest, AnUnknownIdIsQuotedBounded) {
  auto store = OpenMemory();
  const std::string huge(100000, 'x');
  auto job = store->Get(huge + "\x1b[2J");
  ASSERT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(job.status().message().size(), 120u) << job.status().message().substr(0, 200);
  EXPECT_NE(job.status().message().find("(100004 bytes)"), std::string::npos);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// A reason is stored bounded and valid UTF-8, so one job's record always fits in a reply; a
// store an older ithacad filled with a 1.5 MB reason serves it bounded too.
TEST(JobStoreTest, ReasonsAreBoundedAndValidUtf8) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_reason.db";
  unlink(path.c_str());
  const std::string huge(1500000, 'r');
  {
    auto store = JobStore::Open({path});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Create(Template("a"), "submitted \xE9").ok());
    auto cancelled = (*store)->Transition("job-1", v1::JOB_STATE_CANCELLED, huge);
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    EXPECT_LE(cancelled->reason().size(), JobStore::kMaxReasonBytes + 32);
    EXPECT_NE(cancelled->reason().find("more bytes)"), std::string::npos);
    EXPECT_EQ(cancelled->transitions(0).reason(), "submitted \xEF\xBF\xBD");
    EXPECT_LT(cancelled->ByteSizeLong(), 3 * JobStore::kMaxReasonBytes + 1000);
    ASSERT_TRUE((*store)->Create(Template("b"), "submitted").ok());
  }
  // What an older ithacad wrote: the whole reason, in both tables.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string sql = "UPDATE jobs SET reason = '" + huge + "' WHERE id = 'job-2';" +
                          "UPDATE transitions SET reason = '" + huge + "' WHERE job_id = 'job-2';";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok());
  auto list = (*store)->List({}, 0);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  for (const v1::Job& j : *list) {
    EXPECT_LT(j.ByteSizeLong(), 3 * JobStore::kMaxReasonBytes + 1000) << j.id();
  }
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Another process holding the store's write lock: a transition waits for it (busy timeout),
// and a lock held past that is UNAVAILABLE naming the cause (callers retry), not INTERNAL.
TEST(JobStoreTest, ALockedStoreIsWaitedForThenUnavailable) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/job_store_busy.db";
  unlink(path.c_str());
  auto store = JobStore::Open({path});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Create(Template("a"), "submitted").ok());
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  std::thread release([other] {
    usleep(300 * 1000);
    sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr);
  });
  auto moved = (*store)->Transition("job-1", v1::JOB_STATE_CANCELLED, "while locked");
  release.join();
  EXPECT_TRUE(moved.ok()) << moved.status();

  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto created = (*store)->Create(Template("b"), "submitted");  // waits the 5 s busy timeout
  EXPECT_TRUE(absl::IsUnavailable(created.status())) << created.status();
  EXPECT_NE(created.status().message().find("locked by another process"), std::string::npos)
      << created.status();
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(other);
  EXPECT_TRUE((*store)->Create(Template("b"), "submitted").ok());
}

}  // namespace
}  // namespace ithaca
