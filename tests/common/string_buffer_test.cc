#include "common/string_buffer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace qlinear {
namespace {

TEST(StringBuffer, ResizeForOverwriteKeepsThePrefixAndTheLength) {
  std::string s = "abcdef";
  resize_for_overwrite(&s, 3);
  EXPECT_EQ(s, "abc");
  resize_for_overwrite(&s, 1 << 20);
  ASSERT_EQ(s.size(), size_t{1} << 20);
  EXPECT_EQ(s.compare(0, 3, "abc"), 0);
  EXPECT_EQ(s.c_str()[s.size()], '\0');
  std::memset(s.data() + 3, 'x', s.size() - 3);
  resize_for_overwrite(&s, 0);
  EXPECT_TRUE(s.empty());
}

// Growing past the capacity by less than the capacity itself: the string reallocates (libstdc++
// doubles), and the size must still be the one asked for, with the old bytes kept.
TEST(StringBuffer, ResizeForOverwriteGrowsToTheSizeAskedWhenItReallocates) {
  for (size_t start : {size_t{1}, size_t{100}, size_t{1000}, size_t{4096}}) {
    SCOPED_TRACE(start);
    std::string s(start, 'a');
    s.shrink_to_fit();
    const size_t want = s.capacity() + 1 + s.capacity() / 3;
    resize_for_overwrite(&s, want);
    ASSERT_EQ(s.size(), want);
    EXPECT_EQ(s.c_str()[want], '\0');
    EXPECT_EQ(s.compare(0, start, std::string(start, 'a')), 0);
  }
}

// In a build whose standard library has resize_and_overwrite (the supported toolchains), the
// bytes a string grows by within its capacity are not written: a y buffer kept between responses
// is not zero-filled before the kernel overwrites it.
TEST(StringBuffer, ResizeForOverwriteDoesNotFillWhereTheLibraryAllows) {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  ASSERT_TRUE(resize_for_overwrite_skips_fill())
      << "GCC 12's libstdc++ has std::string::resize_and_overwrite in C++23: "
         "common/CMakeLists.txt should build string_buffer.cc with -std=gnu++23";
#endif
  if (!resize_for_overwrite_skips_fill()) GTEST_SKIP() << "this standard library fills";
  const size_t n = 64 * 1024;
  std::string s(n, '\xab');
  resize_for_overwrite(&s, 16);
  resize_for_overwrite(&s, n);  // within the capacity: no reallocation, no fill
  // The shrink wrote a terminator at 16; every byte after it is as it was.
  size_t kept = 0;
  for (size_t i = 17; i < n; ++i) kept += s[i] == '\xab';
  EXPECT_EQ(kept, n - 17);
}

}  // namespace
}  // namespace qlinear
