// The kernel registry (SPEC section 6): the pinned priority order, idempotent registration,
// disabling, selection with an explanation for every candidate, M buckets and forcing. Fake
// kernels named like the real ones stand in for them, so these tests run on any host.
#include "kernels/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/kernel.h"
#include "kernels/core/layer.h"

namespace qlinear {
namespace {

using CanImplement = std::function<absl::Status(const LayerConfig&, const ProblemShape&)>;

class FakePrepared final : public PreparedKernel {
 public:
  absl::Status run(const RunArgs&, RunTimings*) const override { return absl::OkStatus(); }
};

class FakeKernel final : public Kernel {
 public:
  FakeKernel(std::string name, absl::Status supported, CanImplement can, MRange m, int tag)
      : name_(std::move(name)),
        supported_(std::move(supported)),
        can_(std::move(can)),
        m_(m),
        tag_(tag) {}
  absl::string_view name() const override { return name_; }
  absl::Status is_supported(const HostInfo&) const override { return supported_; }
  absl::Status can_implement(const LayerConfig& c, const ProblemShape& s) const override {
    return can_ ? can_(c, s) : absl::OkStatus();
  }
  MRange preferred_m() const override { return m_; }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(const LayerWeights&) const override {
    return std::unique_ptr<PreparedKernel>(new FakePrepared);
  }
  int tag() const { return tag_; }

 private:
  std::string name_;
  absl::Status supported_;
  CanImplement can_;
  MRange m_;
  int tag_;
};

struct Fake {
  std::string name;
  absl::Status supported = absl::OkStatus();
  CanImplement can = nullptr;
  MRange m = MRange{};
  int tag = 0;
};

std::unique_ptr<Kernel> make(Fake f) {
  return std::make_unique<FakeKernel>(std::move(f.name), std::move(f.supported), std::move(f.can),
                                      f.m, f.tag);
}

int tag_of(const Kernel* k) { return static_cast<const FakeKernel*>(k)->tag(); }

std::vector<std::string> names(const Registry& r) {
  std::vector<std::string> out;
  for (const Kernel* k : r.kernels()) out.emplace_back(k->name());
  return out;
}

CanImplement k_multiple_of(int64_t q) {
  return [q](const LayerConfig& c, const ProblemShape&) {
    return c.k % q == 0 ? absl::OkStatus()
                        : absl::FailedPreconditionError(
                              absl::StrCat("K=", c.k, " is not a multiple of ", q));
  };
}

const std::vector<std::string> kPinnedOrder = {
    "cuda.gemv_s8",    "cuda.stream_s8", "cuda.cutlass_sm90", "cuda.cublaslt", "cpu.amx",
    "cpu.avx512_vnni", "cpu.onednn",     "cpu.avx2",          "cpu.reference"};

LayerConfig layer(int64_t k) {
  LayerConfig c;
  c.n = 64;
  c.k = k;
  return c;
}
ProblemShape shape(int64_t m, int64_t k) { return ProblemShape{m, 64, k}; }

// The usual cast: three GPU kernels that cannot run here, one that needs K % 16, three CPU kernels
// that fit, and the reference.
Registry typical_registry() {
  Registry r;
  EXPECT_TRUE(r.add(make({"cpu.reference", absl::OkStatus(), nullptr, {}, 6})).ok());
  EXPECT_TRUE(r.add(make({"cpu.onednn", absl::OkStatus(), nullptr, {}, 5})).ok());
  EXPECT_TRUE(r.add(make({"cuda.cublaslt", absl::OkStatus(), k_multiple_of(16), {}, 3})).ok());
  const absl::Status no_device = absl::UnavailableError("no CUDA device: driver not found");
  EXPECT_TRUE(r.add(make({"cuda.gemv_s8", no_device, nullptr, {}, 1})).ok());
  EXPECT_TRUE(r.add(make({"cpu.avx512_vnni", absl::OkStatus(), nullptr, {}, 4})).ok());
  const absl::Status old_gpu = absl::FailedPreconditionError("compute capability 8.0, needs 9.0");
  EXPECT_TRUE(r.add(make({"cuda.cutlass_sm90", old_gpu, nullptr, {}, 2})).ok());
  EXPECT_TRUE(r.add(make({"cuda.stream_s8", old_gpu, nullptr, {}, 7})).ok());
  EXPECT_TRUE(r.add(make({"cpu.avx2", absl::OkStatus(), nullptr, {}, 8})).ok());
  const absl::Status no_amx = absl::FailedPreconditionError("needs AMX-INT8");
  EXPECT_TRUE(r.add(make({"cpu.amx", no_amx, nullptr, {}, 9})).ok());
  return r;
}

// ---------------------------------------------------------------------------------------------
// The priority order and registration.

TEST(PriorityOrder, IsPinned) {
  // The whole list, best first, the reference last. A change here is a product decision: update
  // this list together with kernel_priority_order().
  EXPECT_EQ(kernel_priority_order(), kPinnedOrder);
}

TEST(Registration, OrderOfAddCallsDoesNotMatter) {
  // Every permutation of the nine names, each registered twice (the second copy after all
  // first copies, in reverse). The result is always the pinned order, holding the first copies.
  std::vector<int> perm = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  int permutations = 0;
  do {
    Registry r;
    for (int i : perm) {
      ASSERT_TRUE(r.add(make({kPinnedOrder[i], absl::OkStatus(), nullptr, {}, 1})).ok());
    }
    for (auto it = perm.rbegin(); it != perm.rend(); ++it) {
      ASSERT_TRUE(r.add(make({kPinnedOrder[*it], absl::OkStatus(), nullptr, {}, 2})).ok());
    }
    ASSERT_EQ(names(r), kPinnedOrder) << "permutation " << permutations;
    for (const Kernel* k : r.kernels()) ASSERT_EQ(tag_of(k), 1) << k->name();
    ++permutations;
  } while (std::next_permutation(perm.begin(), perm.end()));
  EXPECT_EQ(permutations, 362880);
}

TEST(Registration, DuplicateRegistrationKeepsTheFirst) {
  Registry r;
  ASSERT_TRUE(r.add(make({"cpu.onednn", absl::OkStatus(), nullptr, {}, 1})).ok());
  const Kernel* first = r.find("cpu.onednn");
  ASSERT_TRUE(r.add(make({"cpu.onednn", absl::UnavailableError("shadow"), nullptr, {}, 2})).ok());
  ASSERT_TRUE(r.add(make({"cpu.reference", absl::OkStatus(), nullptr, {}, 3})).ok());
  ASSERT_TRUE(r.add(make({"cpu.onednn", absl::OkStatus(), nullptr, {}, 4})).ok());
  EXPECT_EQ(names(r), (std::vector<std::string>{"cpu.onednn", "cpu.reference"}));
  EXPECT_EQ(r.find("cpu.onednn"), first);
  EXPECT_EQ(tag_of(r.find("cpu.onednn")), 1);
  EXPECT_TRUE(r.usable(*r.find("cpu.onednn"), HostInfo{}).ok());
}

TEST(Registration, SubsetKeepsRelativeOrder) {
  Registry r;
  for (const char* n : {"cpu.reference", "cuda.cublaslt", "cpu.onednn", "cuda.gemv_s8"}) {
    ASSERT_TRUE(r.add(make({n})).ok());
  }
  EXPECT_EQ(names(r), (std::vector<std::string>{"cuda.gemv_s8", "cuda.cublaslt", "cpu.onednn",
                                                "cpu.reference"}));
  EXPECT_EQ(r.find("cpu.avx512_vnni"), nullptr);
  EXPECT_EQ(r.find("cpu.onednn")->name(), "cpu.onednn");
}

TEST(Registration, NameOutsideThePriorityOrderIsRejected) {
  Registry r;
  ASSERT_TRUE(r.add(make({"cpu.reference"})).ok());
  for (const char* bad : {"cpu.fast", "", "CPU.reference", "cpu.reference ", "cuda.cutlass"}) {
    const absl::Status s = r.add(make({bad}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "': " << s;
    EXPECT_NE(s.message().find(absl::StrCat("'", bad, "'")), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("priority order"), absl::string_view::npos) << s;
  }
  EXPECT_EQ(names(r), (std::vector<std::string>{"cpu.reference"}));
}

// Exactly the kernels this build registers, in the priority order, the reference last: every CPU
// kernel, compiled in or not (the listing gives each one's reason), and in a CUDA build the CUDA
// kernels ahead of them, cuda.gemv_s8 left out (kernels/cuda/cuda_kernels.cc says why).
TEST(Registration, BuiltinsAreExactlyThisBuildsKernelsInTheOrder) {
  std::vector<std::string> want;
#if QLINEAR_HAVE_CUDA
  want = {"cuda.stream_s8", "cuda.cutlass_sm90", "cuda.cublaslt"};
#endif
  for (const char* n : {"cpu.amx", "cpu.avx512_vnni", "cpu.onednn", "cpu.avx2", "cpu.reference"}) {
    want.emplace_back(n);
  }
  Registry r;
  ASSERT_EQ(register_builtin_kernels(&r), absl::OkStatus());
  EXPECT_EQ(names(r), want);
  // Registering the builtins again changes nothing.
  ASSERT_EQ(register_builtin_kernels(&r), absl::OkStatus());
  EXPECT_EQ(names(r), want);
}

TEST(Registration, BuiltinReferenceAlwaysFits) {
  Registry r;
  ASSERT_EQ(register_builtin_kernels(&r), absl::OkStatus());
  std::vector<std::string> others;
  for (const Kernel* k : r.kernels()) {
    if (k->name() != "cpu.reference") others.emplace_back(k->name());
  }
  ASSERT_TRUE(r.set_disabled(others).ok());
  auto sel = r.select(HostInfo{}, layer(17), shape(3, 17), "", 2, 16);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->kernel->name(), "cpu.reference");
}

// ---------------------------------------------------------------------------------------------
// Disabling.

TEST(Disable, UnknownNameIsRejectedAndKeepsThePreviousSet) {
  Registry r = typical_registry();
  ASSERT_TRUE(r.set_disabled({"cpu.onednn"}).ok());
  const absl::Status s = r.set_disabled({"cpu.reference", "cpu.avx512"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'cpu.avx512'"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("cpu.avx512_vnni"), absl::string_view::npos)
      << "lists the registered names: " << s;
  EXPECT_TRUE(r.is_disabled("cpu.onednn"));
  EXPECT_FALSE(r.is_disabled("cpu.reference"));
}

TEST(Disable, KnownNamesThatAreNotCompiledInAreAccepted) {
  // One QLINEAR_DISABLED_KERNELS for every host: a CPU-only build accepts GPU kernel names.
  Registry r;
  ASSERT_EQ(register_builtin_kernels(&r), absl::OkStatus());
  EXPECT_TRUE(r.set_disabled({"cuda.cublaslt", "cuda.cutlass_sm90"}).ok());
  EXPECT_TRUE(r.is_disabled("cuda.cublaslt"));
}

TEST(Disable, ReplacesTheSetAndShowsInUsable) {
  Registry r = typical_registry();
  ASSERT_TRUE(r.set_disabled({"cpu.avx512_vnni", "cpu.onednn"}).ok());
  EXPECT_TRUE(r.is_disabled("cpu.avx512_vnni"));
  EXPECT_TRUE(r.is_disabled("cpu.onednn"));
  const absl::Status u = r.usable(*r.find("cpu.onednn"), HostInfo{});
  EXPECT_EQ(u.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(u.message().find("disabled"), absl::string_view::npos) << u;
  // Unsupported kernels report their own reason.
  const absl::Status g = r.usable(*r.find("cuda.gemv_s8"), HostInfo{});
  EXPECT_EQ(g.message(), "no CUDA device: driver not found");

  ASSERT_TRUE(r.set_disabled({"cpu.reference"}).ok());
  EXPECT_FALSE(r.is_disabled("cpu.onednn"));
  EXPECT_TRUE(r.is_disabled("cpu.reference"));
  ASSERT_TRUE(r.set_disabled({}).ok());
  EXPECT_FALSE(r.is_disabled("cpu.reference"));
}

TEST(Disable, ParseKernelList) {
  EXPECT_EQ(parse_kernel_list(" cpu.onednn, cuda.cublaslt ,,cpu.reference, "),
            (std::vector<std::string>{"cpu.onednn", "cuda.cublaslt", "cpu.reference"}));
  EXPECT_TRUE(parse_kernel_list("").empty());
  EXPECT_TRUE(parse_kernel_list(" , ,").empty());
}

// ---------------------------------------------------------------------------------------------
// Selection.

void expect_explanation(const Selection& sel, const std::vector<std::string>& kernels,
                        const std::vector<std::string>& reasons, int selected) {
  ASSERT_EQ(sel.explanation.size(), kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    const CandidateVerdict& v = sel.explanation[i];
    EXPECT_EQ(v.kernel, kernels[i]) << i;
    EXPECT_EQ(v.selected, static_cast<int>(i) == selected) << v.kernel;
    if (static_cast<int>(i) == selected) {
      EXPECT_EQ(v.reason, "") << v.kernel;
    } else {
      EXPECT_NE(v.reason.find(reasons[i]), std::string::npos)
          << v.kernel << ": '" << v.reason << "' lacks '" << reasons[i] << "'";
    }
  }
}

TEST(Select, FirstFitWithAReasonForEveryCandidate) {
  const Registry r = typical_registry();
  // K = 17: the GPU kernels are unsupported or cannot implement; the first CPU kernel wins.
  auto sel = r.select(HostInfo{}, layer(17), shape(5, 17), "", 2, 16);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->kernel->name(), "cpu.avx512_vnni");
  expect_explanation(
      *sel, kPinnedOrder,
      {"no CUDA device: driver not found", "compute capability 8.0, needs 9.0",
       "compute capability 8.0, needs 9.0", "K=17 is not a multiple of 16", "needs AMX-INT8", "",
       "a higher-priority kernel was selected", "a higher-priority kernel was selected",
       "a higher-priority kernel was selected"},
      5);
  // K = 32: cuBLASLt can implement it and comes first.
  sel = r.select(HostInfo{}, layer(32), shape(5, 32), "", 2, 16);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->kernel->name(), "cuda.cublaslt");
  EXPECT_EQ(tag_of(sel->kernel), 3);
  expect_explanation(
      *sel, kPinnedOrder,
      {"no CUDA device", "needs 9.0", "needs 9.0", "", "a higher-priority kernel was selected",
       "a higher-priority kernel was selected", "a higher-priority kernel was selected",
       "a higher-priority kernel was selected", "a higher-priority kernel was selected"},
      3);
}

TEST(Select, DisabledKernelsAreSkippedWithTheReason) {
  Registry r = typical_registry();
  ASSERT_TRUE(r.set_disabled({"cpu.avx512_vnni"}).ok());
  auto sel = r.select(HostInfo{}, layer(17), shape(5, 17), "", 2, 16);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->kernel->name(), "cpu.onednn");
  expect_explanation(
      *sel, kPinnedOrder,
      {"no CUDA device", "needs 9.0", "needs 9.0", "not a multiple of 16", "needs AMX-INT8",
       "disabled by the operator", "", "a higher-priority kernel was selected",
       "a higher-priority kernel was selected"},
      6);
}

TEST(Select, PreferredMBuckets) {
  Registry r;
  ASSERT_TRUE(r.add(make({"cuda.gemv_s8", absl::OkStatus(), nullptr, MRange{1, 16}, 1})).ok());
  ASSERT_TRUE(r.add(make({"cuda.cutlass_sm90", absl::OkStatus(), nullptr, MRange{17}, 2})).ok());
  ASSERT_TRUE(r.add(make({"cpu.reference"})).ok());
  const std::vector<std::string> order = {"cuda.gemv_s8", "cuda.cutlass_sm90", "cpu.reference"};
  for (const MBucket& b : m_buckets()) {
    SCOPED_TRACE(absl::StrCat("bucket ", b.lo, "..", b.hi));
    auto sel = r.select(HostInfo{}, layer(64), shape(b.lo, 64), "", b.lo, b.hi);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_EQ(sel->kernel->name(), b.hi <= 16 ? "cuda.gemv_s8" : "cuda.cutlass_sm90");
  }
  auto sel = r.select(HostInfo{}, layer(64), shape(20, 64), "", 17, 64);
  ASSERT_TRUE(sel.ok()) << sel.status();
  expect_explanation(*sel, order, {"prefers M 1..16, bucket is M 17..64", "", "higher-priority"},
                     1);
  sel = r.select(HostInfo{}, layer(64), shape(1, 64), "", 1, 1);
  ASSERT_TRUE(sel.ok()) << sel.status();
  expect_explanation(*sel, order, {"", "higher-priority", "higher-priority"}, 0);
  // An open-ended range prints as ">= lo".
  Registry only_large;
  ASSERT_TRUE(
      only_large.add(make({"cuda.cutlass_sm90", absl::OkStatus(), nullptr, MRange{17}, 2})).ok());
  ASSERT_TRUE(only_large.add(make({"cpu.reference"})).ok());
  sel = only_large.select(HostInfo{}, layer(64), shape(1, 64), "", 1, 1);
  ASSERT_TRUE(sel.ok()) << sel.status();
  expect_explanation(*sel, {"cuda.cutlass_sm90", "cpu.reference"},
                     {"prefers M >= 17, bucket is M 1..1", ""}, 1);
  // A range that covers only part of a bucket does not claim it.
  Registry partial;
  ASSERT_TRUE(partial.add(make({"cuda.gemv_s8", absl::OkStatus(), nullptr, MRange{1, 8}, 1})).ok());
  ASSERT_TRUE(partial.add(make({"cpu.reference"})).ok());
  sel = partial.select(HostInfo{}, layer(64), shape(4, 64), "", 2, 16);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->kernel->name(), "cpu.reference");
  expect_explanation(*sel, {"cuda.gemv_s8", "cpu.reference"},
                     {"prefers M 1..8, bucket is M 2..16", ""}, 1);
  sel = partial.select(HostInfo{}, layer(64), shape(2000, 64), "", 1025, INT64_MAX);
  ASSERT_TRUE(sel.ok()) << sel.status();
  expect_explanation(*sel, {"cuda.gemv_s8", "cpu.reference"}, {"bucket is M >= 1025", ""}, 1);
}

TEST(Select, NothingFitsListsEveryReason) {
  Registry r;
  ASSERT_TRUE(r.add(make({"cuda.cublaslt", absl::OkStatus(), k_multiple_of(16)})).ok());
  ASSERT_TRUE(
      r.add(make({"cpu.avx512_vnni", absl::FailedPreconditionError("no avx512_vnni")})).ok());
  ASSERT_TRUE(r.add(make({"cpu.onednn", absl::OkStatus(), k_multiple_of(4)})).ok());
  ASSERT_TRUE(r.add(make({"cuda.gemv_s8", absl::OkStatus(), nullptr, MRange{1, 1}})).ok());
  ASSERT_TRUE(r.set_disabled({"cpu.onednn"}).ok());
  auto sel = r.select(HostInfo{}, layer(17), shape(3, 17), "", 2, 16);
  ASSERT_FALSE(sel.ok());
  const absl::Status& s = sel.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (const char* part :
       {"cuda.gemv_s8: prefers M 1..1, bucket is M 2..16",
        "cuda.cublaslt: K=17 is not a multiple of 16", "cpu.avx512_vnni: no avx512_vnni",
        "cpu.onednn: disabled by the operator"}) {
    EXPECT_NE(s.message().find(part), absl::string_view::npos)
        << "missing '" << part << "' in " << s;
  }
  // In priority order.
  EXPECT_LT(s.message().find("cuda.gemv_s8"), s.message().find("cuda.cublaslt"));
  EXPECT_LT(s.message().find("cuda.cublaslt"), s.message().find("cpu.avx512_vnni"));
  EXPECT_LT(s.message().find("cpu.avx512_vnni"), s.message().find("cpu.onednn"));

  const Registry empty;
  auto none = empty.select(HostInfo{}, layer(17), shape(3, 17), "", 2, 16);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------------
// Forcing.

TEST(Force, ForcedKernelIsUsedEvenIfAnotherComesFirst) {
  const Registry r = typical_registry();
  auto sel = r.select(HostInfo{}, layer(17), shape(5, 17), "cpu.onednn", 2, 16);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->kernel->name(), "cpu.onednn");
  EXPECT_EQ(tag_of(sel->kernel), 5);
  expect_explanation(*sel, kPinnedOrder,
                     {"not forced", "not forced", "not forced", "not forced", "not forced",
                      "not forced", "", "not forced", "not forced"},
                     6);
}

TEST(Force, ForcingOverridesTheMPreference) {
  Registry r;
  ASSERT_TRUE(r.add(make({"cuda.gemv_s8", absl::OkStatus(), nullptr, MRange{1, 1}})).ok());
  ASSERT_TRUE(r.add(make({"cpu.reference"})).ok());
  auto sel = r.select(HostInfo{}, layer(64), shape(100, 64), "cuda.gemv_s8", 65, 256);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->kernel->name(), "cuda.gemv_s8");
}

TEST(Force, CannotImplementIsFailedPreconditionWithTheReason) {
  const Registry r = typical_registry();
  auto sel = r.select(HostInfo{}, layer(17), shape(5, 17), "cuda.cublaslt", 2, 16);
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kFailedPrecondition) << sel.status();
  EXPECT_NE(sel.status().message().find("cuda.cublaslt"), absl::string_view::npos) << sel.status();
  EXPECT_NE(sel.status().message().find("K=17 is not a multiple of 16"), absl::string_view::npos)
      << sel.status();
}

TEST(Force, UnsupportedIsFailedPreconditionWithTheReason) {
  const Registry r = typical_registry();
  auto sel = r.select(HostInfo{}, layer(32), shape(5, 32), "cuda.cutlass_sm90", 2, 16);
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kFailedPrecondition) << sel.status();
  EXPECT_NE(sel.status().message().find("compute capability 8.0, needs 9.0"),
            absl::string_view::npos)
      << sel.status();
}

TEST(Force, UnknownKernelIsInvalidArgument) {
  const Registry r = typical_registry();
  for (const char* name : {"cpu.nope", "cpu.avx512"}) {
    auto sel = r.select(HostInfo{}, layer(32), shape(5, 32), name, 2, 16);
    ASSERT_FALSE(sel.ok());
    EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument) << sel.status();
    EXPECT_NE(sel.status().message().find(absl::StrCat("'", name, "'")), absl::string_view::npos)
        << sel.status();
  }
  // A name from the priority order that is not registered here is unknown too.
  Registry small;
  ASSERT_TRUE(small.add(make({"cpu.reference"})).ok());
  auto sel = small.select(HostInfo{}, layer(32), shape(5, 32), "cuda.cublaslt", 2, 16);
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument) << sel.status();
}

TEST(Force, DisabledKernelIsFailedPrecondition) {
  Registry r = typical_registry();
  ASSERT_TRUE(r.set_disabled({"cpu.onednn"}).ok());
  auto sel = r.select(HostInfo{}, layer(17), shape(5, 17), "cpu.onednn", 2, 16);
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kFailedPrecondition) << sel.status();
  EXPECT_NE(sel.status().message().find("disabled"), absl::string_view::npos) << sel.status();
}

// ---------------------------------------------------------------------------------------------
// M buckets.

TEST(MBuckets, CoverEveryMContiguously) {
  const auto& b = m_buckets();
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.front().lo, 1);
  EXPECT_EQ(b.back().hi, INT64_MAX);
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_LE(b[i].lo, b[i].hi);
    if (i > 0) {
      EXPECT_EQ(b[i].lo, b[i - 1].hi + 1) << i;
    }
    EXPECT_EQ(m_bucket_index(b[i].lo), i);
    EXPECT_EQ(m_bucket_index(b[i].hi), i);
  }
}

TEST(MBuckets, Boundaries) {
  // Decode (1), small batches, then powers of four.
  struct Case {
    int64_t m;
    size_t bucket;
  };
  for (const Case& c : std::vector<Case>{{1, 0},
                                         {2, 1},
                                         {16, 1},
                                         {17, 2},
                                         {64, 2},
                                         {65, 3},
                                         {256, 3},
                                         {257, 4},
                                         {1024, 4},
                                         {1025, 5},
                                         {1 << 20, 5},
                                         {INT64_MAX, 5}}) {
    EXPECT_EQ(m_bucket_index(c.m), c.bucket) << "m=" << c.m;
  }
}

TEST(CpuKernelThreads, StartUpLineSaysHowManyAndWarnsWhenNarrowed) {
  EXPECT_EQ(describe_cpu_kernel_threads(8, 8), "CPU kernels on 8 threads");
  EXPECT_EQ(describe_cpu_kernel_threads(1, 1), "CPU kernels on 1 thread");
  const std::string narrowed = describe_cpu_kernel_threads(3, 16);
  EXPECT_EQ(narrowed.rfind("CPU kernels on 3 threads (warning: only 3 of the 16 ", 0), 0u)
      << narrowed;
  EXPECT_NE(narrowed.find("limit of threads"), std::string::npos) << narrowed;
  EXPECT_NE(narrowed.find("until a restart"), std::string::npos) << narrowed;
  // The process's own pool, started by the call: as wide as it was asked to be here.
  const std::string own = start_cpu_kernel_threads();
  EXPECT_EQ(own.find("warning"), std::string::npos) << own;
  EXPECT_EQ(own.rfind("CPU kernels on ", 0), 0u) << own;
}

}  // namespace
}  // namespace qlinear
