// TuningCache: what one layer's load timed, found by the next layer of the same shape on the same
// device, and by no other.
#include "kernels/core/tuning_cache.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace qlinear {
namespace {

LayerConfig config(int64_t n, int64_t k, Scheme s = Scheme::kDynamicSymmetric, bool bias = true) {
  LayerConfig c;
  c.n = n;
  c.k = k;
  c.scheme = s;
  c.has_bias = bias;
  return c;
}

struct Tiles {
  std::array<int, 3> tile;
  std::string times;
};

TEST(TuningCacheTest, FindsWhatWasStoredUnderTheKeyAndType) {
  TuningCache cache;
  const std::string key = tuning_key("tiles", "cuda:0", config(4096, 4096));
  EXPECT_FALSE(cache.find<Tiles>(key).has_value());
  cache.insert(key, Tiles{{15, 8, -1}, "tile 15 10.8, tile 8 12.0"});
  const std::optional<Tiles> t = cache.find<Tiles>(key);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->tile, (std::array<int, 3>{15, 8, -1}));
  EXPECT_EQ(t->times, "tile 15 10.8, tile 8 12.0");
  // Another type under the same key is not found (never a reinterpretation).
  EXPECT_FALSE(cache.find<double>(key).has_value());
  EXPECT_EQ(cache.size(), 1u);
}

TEST(TuningCacheTest, TheFirstValueStoredStays) {
  TuningCache cache;
  const std::string key = tuning_key("autotune", "cuda:0", config(64, 128));
  cache.insert(key, 14.7);
  cache.insert(key, 9.0);
  ASSERT_TRUE(cache.find<double>(key).has_value());
  EXPECT_DOUBLE_EQ(*cache.find<double>(key), 14.7);
}

// Layers of ever new shapes keep the cache at kMaxEntries, the oldest values given up first; what
// was stored last is found, and a given-up key can be stored again.
TEST(TuningCacheTest, HoldsAtMostItsLimitGivingUpTheOldest) {
  TuningCache cache;
  const size_t n = TuningCache::kMaxEntries + 10;
  for (size_t i = 0; i < n; ++i) {
    cache.insert(tuning_key("autotune", "cpu", config(static_cast<int64_t>(i) + 1, 64)),
                 static_cast<double>(i));
  }
  EXPECT_EQ(cache.size(), TuningCache::kMaxEntries);
  const std::string oldest = tuning_key("autotune", "cpu", config(1, 64));
  EXPECT_FALSE(cache.find<double>(oldest).has_value());
  EXPECT_FALSE(cache.find<double>(tuning_key("autotune", "cpu", config(10, 64))).has_value());
  const std::optional<double> last =
      cache.find<double>(tuning_key("autotune", "cpu", config(static_cast<int64_t>(n), 64)));
  ASSERT_TRUE(last.has_value());
  EXPECT_DOUBLE_EQ(*last, static_cast<double>(n - 1));
  EXPECT_TRUE(cache.find<double>(tuning_key("autotune", "cpu", config(11, 64))).has_value());
  cache.insert(oldest, 1.5);
  ASSERT_TRUE(cache.find<double>(oldest).has_value());
  EXPECT_EQ(cache.size(), TuningCache::kMaxEntries);
  EXPECT_FALSE(cache.find<double>(tuning_key("autotune", "cpu", config(11, 64))).has_value());
}

TEST(TuningCacheTest, KeysTellApartWhatChoosesAKernelsCode) {
  const LayerConfig base = config(4096, 4096);
  const std::string key = tuning_key("tiles", "cuda:0", base);
  EXPECT_EQ(key, "tiles on cuda:0: N=4096 K=4096 dynamic_symmetric bias");
  std::vector<std::string> others = {
      tuning_key("ring", "cuda:0", base),
      tuning_key("tiles", "cuda:1", base),
      tuning_key("tiles", "cuda:0", config(4096, 4112)),
      tuning_key("tiles", "cuda:0", config(4112, 4096)),
      tuning_key("tiles", "cuda:0", config(4096, 4096, Scheme::kDynamicAsymmetric)),
      tuning_key("tiles", "cuda:0", config(4096, 4096, Scheme::kStaticSymmetric)),
      tuning_key("tiles", "cuda:0", config(4096, 4096, Scheme::kDynamicSymmetric, false)),
  };
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_NE(others[i], key) << i;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(others[i], others[j]) << i << " " << j;
  }
  // A static scheme's input scale and zero point are values, not code: one key.
  LayerConfig scaled = config(4096, 4096, Scheme::kStaticAsymmetric);
  scaled.input_scale = 0.5f;
  scaled.input_zero_point = 3;
  EXPECT_EQ(tuning_key("tiles", "cuda:0", scaled),
            tuning_key("tiles", "cuda:0", config(4096, 4096, Scheme::kStaticAsymmetric)));
}

// Threads storing different values under the same keys at once: every thread, after its own
// insert, finds the one value kept for the key, the same for all of them.
TEST(TuningCacheTest, ConcurrentInsertsKeepOneValuePerKey) {
  TuningCache cache;
  constexpr int kThreads = 8, kKeys = 20;
  std::vector<std::vector<double>> seen(kThreads, std::vector<double>(kKeys, -1));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&cache, &seen, t] {
      for (int i = 0; i < kKeys; ++i) {
        const std::string key = tuning_key("autotune", "cuda:0", config(16 * (i + 1), 64));
        cache.insert(key, double(t));
        seen[t][i] = cache.find<double>(key).value_or(-1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(cache.size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    const std::optional<double> kept =
        cache.find<double>(tuning_key("autotune", "cuda:0", config(16 * (i + 1), 64)));
    ASSERT_TRUE(kept.has_value()) << i;
    for (int t = 0; t < kThreads; ++t)
      EXPECT_EQ(seen[t][i], *kept) << "key " << i << " thread " << t;
  }
}

}  // namespace
}  // namespace qlinear
