// The .npy reader/writer of qlinear-cli: round trips for every dtype and rank, the exact bytes
// numpy writes, and rejection (with a message that says why) of everything it does not read.
#include "common/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace qlinear {
namespace {

using ::testing::HasSubstr;

// A .npy file with a hand-written header, padded the way numpy pads it.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.resize(total - prefix - 1, ' ');
  header += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i)
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

NpyArray array(NpyDType t, std::vector<int64_t> shape) {
  NpyArray a;
  a.dtype = t;
  a.shape = std::move(shape);
  a.data.resize(static_cast<size_t>(a.elements()) * npy_dtype_size(t));
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<char>(i * 37 + 11);
  return a;
}

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  for (NpyDType t : {NpyDType::kI1, NpyDType::kF2, NpyDType::kF4, NpyDType::kI4}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {0}, {7}, {3, 5}, {1, 1}, {2, 3, 4}}) {
      const NpyArray a = array(t, shape);
      auto bytes = serialize_npy(a);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_EQ(bytes->size() % 64, a.data.size() % 64) << "header not padded to 64";
      EXPECT_TRUE(is_npy(*bytes));
      auto b = parse_npy(*bytes);
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->dtype, a.dtype);
      EXPECT_EQ(b->shape, a.shape);
      EXPECT_EQ(b->data, a.data);
    }
  }
}

TEST(Npy, WritesWhatNumpyWrites) {
  // np.save of np.arange(3, dtype=np.float32).
  NpyArray a;
  a.dtype = NpyDType::kF4;
  a.shape = {3};
  const float v[3] = {0.f, 1.f, 2.f};
  a.data.assign(reinterpret_cast<const char*>(v), sizeof(v));
  auto bytes = serialize_npy(a);
  ASSERT_TRUE(bytes.ok());
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  EXPECT_EQ(*bytes, make_npy(header, a.data));
  EXPECT_EQ(bytes->substr(0, 10), std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  // Two dimensions: no trailing comma in the tuple.
  a.shape = {1, 3};
  EXPECT_THAT(*serialize_npy(a), HasSubstr("'shape': (1, 3), }"));
}

TEST(Npy, ReadsVersion2AndHeaderVariations) {
  const std::string data(6 * 4, '\x01');
  auto a =
      parse_npy(make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", data, 2));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, NpyDType::kI4);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  // Key order, double quotes, no trailing comma, Python 2 longs.
  a = parse_npy(
      make_npy("{\"shape\": (2L, 3L), \"fortran_order\": False, \"descr\": \"<i4\"}", data));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  // A scalar, and a 1-D array saved in Fortran order (the same bytes as C order).
  a = parse_npy(make_npy("{'descr': '|i1', 'fortran_order': False, 'shape': (), }", "x"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->shape.empty());
  EXPECT_EQ(a->elements(), 1);
  a = parse_npy(make_npy("{'descr': '<f2', 'fortran_order': True, 'shape': (2,), }", "abcd"));
  ASSERT_TRUE(a.ok()) << a.status();
}

TEST(Npy, LargeHeaderUsesVersion2) {
  NpyArray a;
  a.dtype = NpyDType::kI1;
  a.shape.assign(30000, 1);  // a header longer than 65535 bytes
  a.data = "z";
  auto bytes = serialize_npy(a);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)[6], 2);
  auto b = parse_npy(*bytes);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->shape.size(), 30000u);
}

struct BadCase {
  const char* name;
  std::string bytes;
  const char* message;
};

TEST(Npy, RejectsWithReasons) {
  const std::string f4x2(8, '\0');
  const std::vector<BadCase> cases = {
      {"empty", "", "magic string"},
      {"not npy", "PK\x03\x04 a zip file", "magic string"},
      {"short preamble", std::string("\x93NUMPY\x01", 7), "preamble"},
      {"version 3",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4x2, 1)
           .replace(6, 1, "\x03"),
       "format version 3.0"},
      {"header past the end",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "").substr(0, 40),
       "the header says"},
      {"fortran order",
       make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2), }", f4x2),
       "Fortran order"},
      {"big endian", make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f4x2),
       "big-endian dtype '>f4'"},
      {"float64", make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", f4x2),
       "dtype '<f8' is not one of"},
      {"object", make_npy("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", f4x2),
       "dtype '|O'"},
      {"structured",
       make_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", f4x2),
       "expected a quoted string"},
      {"truncated", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4x2),
       "truncated: shape [3] of <f4 needs 12 bytes of data, the file has 8"},
      {"trailing", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f4x2),
       "trailing bytes"},
      {"no shape", make_npy("{'descr': '<f4', 'fortran_order': False, }", f4x2), "has no 'shape'"},
      {"no descr", make_npy("{'fortran_order': False, 'shape': (2,), }", f4x2), "has no 'descr'"},
      {"extra key",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4x2),
       "unexpected key 'x'"},
      {"negative dim", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", f4x2),
       "non-negative integer"},
      {"not a dict", make_npy("['descr', '<f4']", f4x2), "not a dict"},
      {"bad bool", make_npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", f4x2),
       "expected True or False"},
      {"unterminated", make_npy("{'descr': '<f4", f4x2), "unterminated string"},
      {"huge shape",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 1000000000), }",
                f4x2),
       "too large"},
  };
  for (const BadCase& c : cases) {
    auto a = parse_npy(c.bytes);
    ASSERT_FALSE(a.ok()) << c.name;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(c.message)) << c.name;
  }
}

TEST(Npy, SerializeChecksDataSize) {
  NpyArray a = array(NpyDType::kF4, {2, 2});
  a.data.pop_back();
  auto bytes = serialize_npy(a);
  ASSERT_FALSE(bytes.ok());
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("needs 16 bytes, got 15"));
}

TEST(Npy, FilesRoundTripAndNameThePath) {
  const std::string path = ::testing::TempDir() + "/npy_test_roundtrip.npy";
  const NpyArray a = array(NpyDType::kF2, {4, 3});
  ASSERT_TRUE(write_npy_file(path, a).ok());
  auto b = read_npy_file(path);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data, a.data);
  ASSERT_TRUE(write_file(path, "not numpy").ok());
  b = read_npy_file(path);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()), HasSubstr(path));
  std::remove(path.c_str());
  b = read_npy_file(path);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr(path));
}

}  // namespace
}  // namespace qlinear
