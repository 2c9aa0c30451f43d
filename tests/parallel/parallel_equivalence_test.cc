// Every distributed layout computes what one rank computes: real processes over Gloo on loopback
// run parallel_rank with world sizes 1–8, Ulysses groups 1–8, FSDP on/off, every recompute
// policy, UPipe head chunks (all heads, one GQA group, one head per rank), offload and tiling,
// and GQA with K/V heads fewer than, equal to and more than sp. Loss, every gathered gradient,
// the losses of three optimizer steps (with clipping) and the final weights must equal the
// single-rank reference to fp32 tolerance. With packed documents the reference runs each
// document of the first sample alone, so a packed layout must equal that exactly. The other
// families run the same way: Qwen2 (q/k/v biases, and use_sliding_window's window of 5 keys on its
// last two layers), Qwen3 (q/k norms, head_dim 12, yarn RoPE) and Mistral (a sliding window of 7
// keys, which crosses the ranks' sequence shards).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

struct Case {
  std::string name;
  int hkv;  // the model: 8 query heads of size 8, `hkv` K/V heads
  int world, sp;
  bool fsdp;
  std::string recompute;  // memory.recompute: none | full | attention-aware
  int head_chunk;         // 0: all heads
  bool offload = false;
  int tile = 0;
  int recompute_interval = 1;
  bool prefetch = true;
  bool packed = false;  // packed documents under a document mask (parallel_rank --packed)
  bool sft = false;     // train on SFT data with data.loss_mask (parallel_rank --loss-mask)
  bool overlap = true;  // collectives under compute (memory.overlap)
  // > 0: each issued Gloo collective starts this late (ITHACA_GLOO_ISSUE_DELAY_MS), so that a
  // buffer read before its collective was waited for, or overwritten while one may still read
  // it, gives wrong numbers every time.
  int issue_delay_ms = 0;
  std::string family = "llama";  // or qwen2, qwen3, mistral (SetUpTestSuite's configs)
  int saved_block_inputs = 0;    // memory.saved_block_inputs
  bool lora = false;             // [lora] on all seven linears (parallel_rank --lora)
  int ring = 0;                  // parallel.ring (0: auto)
  int hq = 8;                    // query heads: 8, or 28 (with hkv 4: Qwen2.5-7B's 7:1)
  int seq = 0;                   // data.seq_len (0: parallel_rank's 64)
};

class ParallelEquivalenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/parallel_equivalence");
    ASSERT_TRUE(MakeDirs(*dir_).ok());
    auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
    ASSERT_TRUE(text.ok()) << text.status();
    const std::vector<uint32_t> tokens = ByteTokenize(*text);
    ASSERT_TRUE(WriteTokenFile(*dir_ + "/corpus.tok", tokens, kByteVocab).ok());
    // The same tokens as SFT data: a loss mask with runs of trained and untrained tokens (every
    // 3rd run of 11 trained), so steps and replicas train different numbers of labels.
    TokenFileMeta meta = ByteTokenMeta(tokens);
    meta.loss_mask.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) meta.loss_mask[i] = (i / 11) % 3 == 0;
    ASSERT_TRUE(WriteTokenFileV2(*dir_ + "/sft.tok", tokens, meta).ok());
    for (int hkv : {2, 4}) {
      for (const char* family : {"llama", "qwen2", "qwen3", "mistral", "llama28"}) {
        if (std::string(family) == "llama28" && hkv != 4) continue;
        LlamaConfig cfg = *PresetConfig("tiny");
        cfg.num_attention_heads = std::string(family) == "llama28" ? 28 : 8;
        cfg.num_key_value_heads = hkv;
        cfg.num_hidden_layers = 3;
        cfg.head_dim = 8;
        const std::string f = family;
        if (f == "qwen2") {
          cfg.family = ModelFamily::kQwen2;
          cfg.qkv_bias = true;
          cfg.sliding_window = 5;  // use_sliding_window: layers 1 and 2 windowed, layer 0 full
          cfg.window_first_layer = 1;
        } else if (f == "qwen3") {
          cfg.family = ModelFamily::kQwen3;
          cfg.qk_norm = true;
          cfg.head_dim = 12;
          cfg.rope.type = RopeType::kYarn;
          cfg.rope.factor = 4;
          cfg.rope.attention_factor = 1.2;
        } else if (f == "mistral") {
          cfg.family = ModelFamily::kMistral;
          cfg.sliding_window = 7;
        }
        cfg.rope.head_dim = static_cast<int>(cfg.head_dim);
        ASSERT_TRUE(WriteFileAtomic(ConfigPath(hkv, f), ConfigToJson(cfg)).ok());
      }
    }
  }
  static std::string ConfigPath(int hkv, const std::string& family = "llama") {
    return absl::StrCat(*dir_, "/config_kv", hkv, family == "llama" ? "" : "_" + family, ".json");
  }

  // Runs parallel_rank as `world` processes (one process and no rendezvous for world 0).
  static std::string RunRanks(const std::string& name, int world, std::vector<std::string> args,
                              std::vector<testing::RankOutcome>* outcomes_out = nullptr,
                              int issue_delay_ms = 0) {
    const std::string out = absl::StrCat(*dir_, "/", name, ".safetensors");
    args.insert(args.begin(), {"tests/parallel/parallel_rank", "--out", out});
    testing::TempDir rendezvous;
    const int procs = std::max(world, 1);
    auto outcomes = testing::RunRanks(
        procs,
        [&](int rank) -> absl::Status {
          if (world > 0) {
            setenv("ITHACA_RANK", std::to_string(rank).c_str(), 1);
            setenv("ITHACA_WORLD_SIZE", std::to_string(world).c_str(), 1);
            setenv("ITHACA_RENDEZVOUS", rendezvous.rendezvous().c_str(), 1);
          }
          if (issue_delay_ms > 0) {
            setenv("ITHACA_GLOO_ISSUE_DELAY_MS", std::to_string(issue_delay_ms).c_str(), 1);
          }
          std::vector<char*> argv;
          for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
          argv.push_back(nullptr);
          execv(argv[0], argv.data());
          return absl::InternalError(absl::StrCat("exec ", argv[0], " failed"));
        },
        {/*wall_limit_s=*/120, {}});
    if (outcomes_out) {
      *outcomes_out = outcomes;
      return out;
    }
    const std::string failures = testing::Failures(outcomes);
    EXPECT_EQ(failures, "") << name;
    return out;
  }

  static std::string Data(bool sft) { return *dir_ + (sft ? "/sft.tok" : "/corpus.tok"); }

  // The single-rank reference; `packed`: its first sample's documents each run alone.
  static std::string Reference(int hkv, int grad_accum, bool packed, bool sft,
                               const std::string& family, bool lora = false, int seq = 0) {
    const std::string key = absl::StrCat(
        "reference_kv", hkv, "_", family, "_accum", grad_accum, packed ? "_separate" : "",
        sft ? "_sft" : "", lora ? "_lora" : "", seq > 0 ? absl::StrCat("_seq", seq) : "");
    if (!references_.count(key)) {
      std::vector<std::string> args = {"--config",     ConfigPath(hkv, family),
                                       "--data",       Data(sft),
                                       "--grad-accum", std::to_string(grad_accum)};
      if (packed) args.insert(args.end(), {"--packed", "--separate"});
      if (sft) args.push_back("--loss-mask");
      if (lora) args.push_back("--lora");
      if (seq > 0) args.insert(args.end(), {"--seq", std::to_string(seq)});
      references_[key] = RunRanks(key, 0, args);
    }
    return references_[key];
  }

  // Reads every tensor of `want_path` and the same-named one of `got_path` as f32 and hands both
  // to `check`; returns how many were compared (a failure to read fails the test, named `what`).
  static int CompareTensors(const std::string& want_path, const std::string& got_path,
                            const std::string& what,
                            const std::function<void(const std::string&, const std::vector<float>&,
                                                     const std::vector<float>&)>& check) {
    auto a = SafetensorsReader::Open(want_path);
    auto b = SafetensorsReader::Open(got_path);
    if (!a.ok() || !b.ok()) {
      ADD_FAILURE() << what << ": " << (a.ok() ? b.status() : a.status());
      return 0;
    }
    int checked = 0;
    for (const std::string& name : (*a)->Names()) {
      auto info = (*a)->Info(name);
      const int64_t n = info.ok() ? NumElements(info->shape) : 0;
      std::vector<float> x(n), y(n);
      if (!info.ok() || !(*a)->Read(name, info->shape, DType::kF32, x.data()).ok()) {
        ADD_FAILURE() << what << ": cannot read " << name << " from " << want_path;
        return checked;
      }
      absl::Status st = (*b)->Read(name, info->shape, DType::kF32, y.data());
      if (!st.ok()) {
        ADD_FAILURE() << what << ": " << st;
        return checked;
      }
      check(name, x, y);
      ++checked;
    }
    return checked;
  }

  static void Check(const Case& c) {
    const int dp = c.world / c.sp;
    const std::string family = c.hq == 28 ? "llama28" : c.family;
    const std::string ref = Reference(c.hkv, dp, c.packed, c.sft, family, c.lora, c.seq);
    std::vector<std::string> args = {
        "--config",     ConfigPath(c.hkv, family),   "--data",      Data(c.sft),
        "--world",      std::to_string(c.world),     "--sp",        std::to_string(c.sp),
        "--fsdp",       c.fsdp ? "1" : "0",          "--recompute", c.recompute,
        "--head-chunk", std::to_string(c.head_chunk)};
    if (c.offload) args.push_back("--offload");
    if (c.tile) args.insert(args.end(), {"--tile", std::to_string(c.tile)});
    if (!c.prefetch) args.push_back("--no-prefetch");
    if (!c.overlap) args.push_back("--no-overlap");
    if (c.packed) args.push_back("--packed");
    if (c.sft) args.push_back("--loss-mask");
    if (c.lora) args.push_back("--lora");
    if (c.ring > 0) args.insert(args.end(), {"--ring", std::to_string(c.ring)});
    if (c.seq > 0) args.insert(args.end(), {"--seq", std::to_string(c.seq)});
    args.insert(args.end(), {"--recompute-interval", std::to_string(c.recompute_interval)});
    if (c.saved_block_inputs > 0) {
      args.insert(args.end(), {"--saved-block-inputs", std::to_string(c.saved_block_inputs)});
    }
    const std::string got = RunRanks(c.name, c.world, args, nullptr, c.issue_delay_ms);
    const int checked = CompareTensors(
        ref, got, c.name,
        [&](const std::string& name, const std::vector<float>& x, const std::vector<float>& y) {
          double scale = 0, err = 0;
          for (size_t i = 0; i < x.size(); ++i) {
            scale = std::max(scale, std::abs(double(x[i])));
            err = std::max(err, std::abs(double(x[i]) - y[i]));
          }
          // Gradients and losses to fp32 rounding; weights after three Adam steps a little looser.
          const double tol =
              name.rfind("param.", 0) == 0 ? 1e-4 + 1e-4 * scale : 1e-7 + 2e-4 * scale;
          EXPECT_LE(err, tol) << c.name << ": " << name << " max|ref| " << scale;
        });
    EXPECT_GT(checked, 40) << c.name;
  }

  static std::string* dir_;
  static std::map<std::string, std::string> references_;
};

std::string* ParallelEquivalenceTest::dir_ = nullptr;
std::map<std::string, std::string> ParallelEquivalenceTest::references_;

TEST_F(ParallelEquivalenceTest, SingleRankTechniques) {
  Check({"w1_chunk1_aware_offload", 2, 1, 1, false, "attention-aware", 1, true, 16});
}

TEST_F(ParallelEquivalenceTest, CheckpointEveryOtherBlockWithoutPrefetch) {
  Check({"w2_sp2_full_interval2", 2, 2, 2, true, "full", 2, true, 8, 2, false});
  Check({"w1_aware_interval3", 4, 1, 1, false, "attention-aware", 0, false, 0, 3, true});
}

// At most two of the three blocks' inputs held: the forward saves blocks 0 and 2, the backward
// regrows block 1's from block 0's (recompute_schedule.h), with late collectives, and
// attention-aware with the saved inputs offloaded.
TEST_F(ParallelEquivalenceTest, AtMostTwoBlockInputs) {
  Case late{"w2_sp2_full_saved2_late", 2, 2, 2, true, "full", 2};
  late.saved_block_inputs = 2;
  late.issue_delay_ms = 2;
  Check(late);
  Case aware{"w2_sp1_aware_saved2_offload", 2, 2, 1, true, "attention-aware", 0, true};
  aware.saved_block_inputs = 2;
  Check(aware);
}

// A per-block mix (attention-aware on the last block of three, full on the others) against no
// recompute, both at world 2 with sp 2: the same gradients, losses and weights, bit for bit (the
// recompute re-runs the same forward).
TEST_F(ParallelEquivalenceTest, MixedPolicyEqualsNoRecomputeBitForBit) {
  auto run = [&](const std::string& name, std::vector<std::string> policy) {
    std::vector<std::string> args = {"--config", ConfigPath(2), "--data",       Data(false),
                                     "--world",  "2",           "--sp",         "2",
                                     "--fsdp",   "1",           "--head-chunk", "2"};
    args.insert(args.end(), policy.begin(), policy.end());
    return RunRanks(name, 2, args);
  };
  const std::string none = run("w2_sp2_none", {"--recompute", "none"});
  for (const char* blocks : {"1", "2"}) {
    const std::string mixed =
        run(absl::StrCat("w2_sp2_mix", blocks),
            {"--recompute", "attention-aware", "--attention-aware-blocks", blocks});
    const int checked = CompareTensors(
        none, mixed, absl::StrCat("mix of ", blocks),
        [&](const std::string& name, const std::vector<float>& x, const std::vector<float>& y) {
          EXPECT_EQ(x, y) << "mix of " << blocks << ": " << name;
        });
    EXPECT_GT(checked, 40);
  }
}

// [lora]: the adapters' gradients, each step's loss and gradient norm, and every weight after
// training (the base unchanged) equal one rank's under FSDP (the adapters' units sharded,
// gathered with their blocks and reduce-scattered), Ulysses / UPipe stages (each stage's rows of
// B), recompute, offload and tiles, and the family's extras (Qwen3's frozen q/k norms, Qwen2's
// frozen biases), packed documents under an SFT loss mask, a ring. The planner's replay must match
// each rank's measured peaks (parallel_rank).
TEST_F(ParallelEquivalenceTest, LoraAdaptersUnderEachLayout) {
  Case a{"w4_sp2_lora_fsdp_full_chunk", 2, 4, 2, true, "full", 2};
  a.lora = true;
  Check(a);
  Case b{
      "w2_sp2_lora_qwen3_fsdp_aware_offload_tiled", 2, 2, 2, true, "attention-aware", 2, true, 8};
  b.family = "qwen3";
  b.lora = true;
  Check(b);
  Case c{"w2_sp1_lora_qwen2_noshard_none", 4, 2, 1, false, "none", 0};
  c.family = "qwen2";
  c.lora = true;
  Check(c);
  // Packed documents and an SFT loss mask (Mistral's window too), Ulysses over both ranks.
  Case d{"w2_sp2_lora_mistral_packed_sft_fsdp_full", 2, 2, 2, true, "full", 2, false, 8};
  d.family = "mistral";
  d.packed = true;
  d.sft = true;
  d.lora = true;
  Check(d);
  // Ring attention across two Ulysses groups of two: the adapters' gradients pass through the
  // ring's backward (dK/dV sent back around) like the base's.
  Case e{"w4_sp4_lora_ring2_fsdp_full", 2, 4, 4, true, "full", 0};
  e.ring = 2;
  e.lora = true;
  Check(e);
}

// Ring attention (parallel.sp = u x r): Qwen2.5-7B's heads (28 query, 4 K/V) at sp 8, which
// Ulysses alone cannot split (8 does not divide 28): auto takes u 4 x r 2, and 8 ranks equal one
// rank, causal and with packed documents (documents crossing the two groups' chunks); an 8-head
// model as u 2 x r 2 with late collectives and as u 1 x r 2 (the ring alone, UPipe stages of
// one head) equals one rank too, as u 8 x r 1 does.
TEST_F(ParallelEquivalenceTest, RingAcrossUlyssesGroups) {
  Case heads28{"w8_sp8_ring_auto_heads28_fsdp_full", 4, 8, 8, true, "full", 0};
  heads28.hq = 28;
  Check(heads28);
  Case packed{"w8_sp8_ring_auto_heads28_packed_aware", 4, 8, 8, true, "attention-aware", 0};
  packed.hq = 28;
  packed.packed = true;
  Check(packed);
  Case late{"w4_sp4_ring2_fsdp_full_late", 2, 4, 4, true, "full", 0};
  late.ring = 2;
  late.issue_delay_ms = 2;
  Check(late);
  Case alone{"w2_sp2_ring2_chunk1_none", 2, 2, 2, false, "none", 1};
  alone.ring = 2;
  Check(alone);
}

// data.seq_len that sp does not divide: 61 tokens at sp 8 (as u 4 x r 2: the pad sits in the
// last group's chunk) and at sp 4 (Ulysses alone) train as one rank trains them unpadded.
TEST_F(ParallelEquivalenceTest, SeqLenThatSpDoesNotDivideIsPadded) {
  Case ring{"w8_sp8_seq61_ring_heads28_fsdp_full", 4, 8, 8, true, "full", 0};
  ring.hq = 28;
  ring.seq = 61;
  Check(ring);
  Case ulysses{"w4_sp4_seq61_fsdp_aware", 4, 4, 4, true, "attention-aware", 0};
  ulysses.seq = 61;
  Check(ulysses);
}

TEST_F(ParallelEquivalenceTest, FsdpDataParallelTwoRanks) {
  Check({"w2_sp1_fsdp_full", 2, 2, 1, true, "full", 0});
}

// The overlapped schedule (every other case) against the blocking one: both equal one rank.
// Four stages in one K/V round, then two rounds of one stage, pipelined or not.
TEST_F(ParallelEquivalenceTest, WithoutOverlap) {
  Case within{"w2_sp2_fsdp_full_nooverlap", 2, 2, 2, true, "full", 2};
  within.overlap = false;
  Check(within);
  Case rounds{"w2_sp2_fsdp_aware_rounds_nooverlap", 4, 2, 2, true, "attention-aware", 4};
  rounds.overlap = false;
  Check(rounds);
  Check({"w2_sp2_fsdp_aware_rounds", 4, 2, 2, true, "attention-aware", 4});
}

// The overlapped schedule with every issued collective starting late: no buffer is read before
// its collective was waited for, nor overwritten while one may still use it (what a GPU's comm
// stream would expose only sometimes). FSDP gathers and reductions in flight, UPipe stages
// pipelined within a K/V round and across rounds, a regrown group, data parallel beside Ulysses.
TEST_F(ParallelEquivalenceTest, LateCollectivesChangeNothing) {
  Case stages{"w2_sp2_full_interval2_late", 2, 2, 2, true, "full", 2, false, 8, 2};
  stages.issue_delay_ms = 2;
  Check(stages);
  Case rounds{"w2_sp2_fsdp_aware_rounds_late", 4, 2, 2, true, "attention-aware", 4};
  rounds.issue_delay_ms = 2;
  Check(rounds);
  Case dp{"w4_sp2_fsdp_full_group_late", 4, 4, 2, true, "full", 4, false, 16};
  dp.issue_delay_ms = 2;
  Check(dp);
}

TEST_F(ParallelEquivalenceTest, UlyssesKvHeadsEqualSp) {
  Check({"w2_sp2_noshard_none_allheads", 2, 2, 2, false, "none", 0});
}

TEST_F(ParallelEquivalenceTest, UlyssesKvHeadsMoreThanSpOneGqaGroupPerStage) {
  // 4 K/V heads over sp 2; 2 query heads (one GQA group) per rank per stage; dp 2.
  Check({"w4_sp2_fsdp_full_group", 4, 4, 2, true, "full", 4, false, 16});
}

TEST_F(ParallelEquivalenceTest, UlyssesKvHeadsFewerThanSpReplicated) {
  Check({"w4_sp4_fsdp_aware_onehead_offload", 2, 4, 4, true, "attention-aware", 4, true});
}

TEST_F(ParallelEquivalenceTest, EightRanksUlyssesEightOneHeadPerRank) {
  Check({"w8_sp8_fsdp_aware_onehead_offload_tiled", 2, 8, 8, true, "attention-aware", 8, true, 4});
}

// Packed documents: each layout's packed sample equals its documents run one by one on one
// rank (loss and every gradient), and document-masked training steps agree across layouts.
TEST_F(ParallelEquivalenceTest, PackedDocumentsOneRank) {
  Case c{"w1_packed_chunk1_aware_offload_tiled", 2, 1, 1, false, "attention-aware", 1, true, 8};
  c.packed = true;
  Check(c);
}

TEST_F(ParallelEquivalenceTest, PackedDocumentsUlyssesTwoFsdp) {
  Case c{"w2_sp2_packed_fsdp_full_chunk", 2, 2, 2, true, "full", 2, false, 0, 2};
  c.packed = true;
  Check(c);
}

TEST_F(ParallelEquivalenceTest, PackedDocumentsUlyssesFourDataParallel) {
  Case a{"w4_sp4_packed_fsdp_aware_onehead_offload", 2, 4, 4, true, "attention-aware", 4, true};
  a.packed = true;
  Check(a);
  // With a loss mask too: the step's mean over trained labels (a different count per replica
  // and micro-step) is the same whatever the layout.
  Case b{"w4_sp2_packed_sft_noshard_none_tiled", 4, 4, 2, false, "none", 0, false, 16};
  b.packed = true;
  b.sft = true;
  Check(b);
}

// Each family at world 4 (Ulysses 2, FSDP over all four) equals one rank: the biases and q/k
// norms are sharded, gathered and reduced as every other parameter, yarn's attention factor and
// the window hold across the sequence shards, and a window meets packed documents.
TEST_F(ParallelEquivalenceTest, Qwen3UlyssesTwoFsdpFour) {
  Case c{"w4_sp2_qwen3_fsdp_full_chunk", 2, 4, 2, true, "full", 2};
  c.family = "qwen3";
  Check(c);
}

TEST_F(ParallelEquivalenceTest, MistralWindowUlyssesTwoFsdpFour) {
  Case a{"w4_sp2_mistral_fsdp_aware", 4, 4, 2, true, "attention-aware", 0};
  a.family = "mistral";
  Check(a);
  Case b{"w4_sp2_mistral_packed_fsdp_full_tiled", 2, 4, 2, true, "full", 2, false, 8};
  b.family = "mistral";
  b.packed = true;
  Check(b);
}

TEST_F(ParallelEquivalenceTest, Qwen2UlyssesTwoFsdpFourOffload) {
  Case c{"w4_sp2_qwen2_fsdp_aware_offload", 4, 4, 2, true, "attention-aware", 2, true};
  c.family = "qwen2";
  Check(c);
}

TEST_F(ParallelEquivalenceTest, ARankThatDiesMidStepFailsEveryRankWithoutAHang) {
  std::vector<testing::RankOutcome> outcomes;
  const auto start = std::chrono::steady_clock::now();
  RunRanks("w4_rank2_dies", 4,
           {"--config", ConfigPath(2), "--data", *dir_ + "/corpus.tok", "--world", "4", "--sp", "2",
            "--fsdp", "1", "--die-rank", "2"},
           &outcomes);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(outcomes.size(), 4u);
  for (const auto& o : outcomes) {
    EXPECT_FALSE(o.killed_by_harness) << o.ToString();  // ended by itself: no hang
    EXPECT_NE(o.exit_code, 0) << o.ToString();          // every rank reports the failure
  }
  EXPECT_EQ(outcomes[2].exit_code, 9);
  EXPECT_LT(seconds, 60);
}

TEST_F(ParallelEquivalenceTest, EightRanksTwoUlyssesGroupsOfFour) {
  Check({"w8_sp4_fsdp_none_twoheads", 4, 8, 4, true, "none", 8});
}

// Optimizer state on the host (memory.optimizer_offload) against the same layout with the state
// on the device: every loss and every weight identical, bit for bit, over 5 steps with clipping
// that engages, weight decay and gradient accumulation 2, at world 1, 2 (FSDP) and 4 (FSDP,
// Ulysses 2); and so with the working copy on the host as well (memory.param_offload). Each rank
// moves only its own shards; the plan of the host tiers must also match what the ranks allocate
// (parallel_rank checks every tier).
// [lora] with the adapters' state on the host (the CPU AdamW over them alone), and the working
// copy there too (the frozen base streamed to the device unit by unit): the same bits as on the
// device, one rank and four (Ulysses 2, FSDP).
TEST_F(ParallelEquivalenceTest, LoraOptimizerAndParamOffloadChangeNoBit) {
  for (int world : {0, 4}) {
    const std::string name = absl::StrCat("lora_offload_w", world);
    std::vector<std::string> args = {"--config",     ConfigPath(2),
                                     "--data",       *dir_ + "/corpus.tok",
                                     "--world",      std::to_string(std::max(world, 1)),
                                     "--sp",         world == 4 ? "2" : "1",
                                     "--fsdp",       "1",
                                     "--recompute",  "full",
                                     "--grad-accum", "2",
                                     "--steps",      "4",
                                     "--lora"};
    const std::string off = RunRanks(name + "_off", world, args);
    args.push_back("--optimizer-offload");
    const std::string on = RunRanks(name + "_on", world, args);
    args.push_back("--param-offload");
    const std::string params_on = RunRanks(name + "_params_on", world, args);
    for (const std::string& other : {on, params_on}) {
      int params = 0;
      const int checked = CompareTensors(
          off, other, other,
          [&](const std::string& t, const std::vector<float>& x, const std::vector<float>& y) {
            EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)))
                << other << ": " << t;
            if (t.rfind("param.", 0) == 0) ++params;
          });
      EXPECT_GT(checked, 40) << other;
      EXPECT_GT(params, 20) << other;
    }
  }
}

TEST_F(ParallelEquivalenceTest, OptimizerOffloadChangesNoBit) {
  struct Layout {
    int world, sp;
  };
  for (Layout l : {Layout{0, 1}, Layout{2, 1}, Layout{4, 2}}) {
    const std::string name = absl::StrCat("optimizer_offload_w", l.world, "_sp", l.sp);
    std::vector<std::string> args = {"--config",       ConfigPath(2),
                                     "--data",         *dir_ + "/corpus.tok",
                                     "--world",        std::to_string(std::max(l.world, 1)),
                                     "--sp",           std::to_string(l.sp),
                                     "--fsdp",         "1",
                                     "--recompute",    "full",
                                     "--grad-accum",   "2",
                                     "--steps",        "5",
                                     "--weight-decay", "0.1"};
    const std::string off = RunRanks(name + "_off", l.world, args);
    args.push_back("--optimizer-offload");
    const std::string on = RunRanks(name + "_on", l.world, args);
    // And the working copy on the host too (memory.param_offload): streamed to the device unit
    // by unit (uploaded, then all-gathered under FSDP), written in place by the CPU AdamW.
    args.push_back("--param-offload");
    const std::string params_on = RunRanks(name + "_params_on", l.world, args);
    auto a = SafetensorsReader::Open(off);
    ASSERT_TRUE(a.ok()) << a.status();
    for (const std::string& other : {on, params_on}) {
      auto b = SafetensorsReader::Open(other);
      ASSERT_TRUE(b.ok()) << b.status();
      int params = 0;
      for (const std::string& t : (*a)->Names()) {
        auto info = (*a)->Info(t);
        ASSERT_TRUE(info.ok());
        const int64_t n = NumElements(info->shape);
        std::vector<float> x(n), y(n);
        ASSERT_TRUE((*a)->Read(t, info->shape, DType::kF32, x.data()).ok());
        ASSERT_TRUE((*b)->Read(t, info->shape, DType::kF32, y.data()).ok()) << other << " " << t;
        EXPECT_EQ(0, std::memcmp(x.data(), y.data(), n * sizeof(float))) << other << ": " << t;
        if (t == "grad_norm_steps") {
          ASSERT_EQ(n, 5);
          for (float g : x) EXPECT_GT(g, 0.5f) << name << ": clipping (0.5) engages every step";
        }
        if (t.rfind("param.", 0) == 0) ++params;
      }
      EXPECT_GT(params, 20) << other;
    }
  }
}

}  // namespace
}  // namespace ithaca
