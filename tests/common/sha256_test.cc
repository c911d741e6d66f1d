// The weight checksum's SHA-256 against the known answers of FIPS 180-2 (appendix B), in one
// update and fed in pieces split around the 55/56-byte padding boundary and the 64-byte block.
#include "common/sha256.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace qlinear {
namespace {

std::string digest_of(const std::string& s) { return sha256_hex(s.data(), s.size()); }

// The message of FIPS 180-2 B.2 (56 bytes, two blocks once padded), and the 112-byte message of its
// SHA-384/512 examples.
const std::string k56 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
const std::string k112 =
    "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopq"
    "rsmnopqrstnopqrstu";
constexpr char kDigest56[] = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr char kDigest112[] = "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1";

TEST(Sha256, KnownAnswers) {
  EXPECT_EQ(digest_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(digest_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  ASSERT_EQ(k56.size(), 56u);
  EXPECT_EQ(digest_of(k56), kDigest56);
  ASSERT_EQ(k112.size(), 112u);
  EXPECT_EQ(digest_of(k112), kDigest112);
  // FIPS 180-2 B.3: a million 'a', fed 1000 bytes at a time (not a multiple of the block).
  const std::string thousand(1000, 'a');
  Sha256 h;
  for (int i = 0; i < 1000; ++i) h.update(thousand.data(), thousand.size());
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Pieces give the one-shot digest wherever the message is split: after 55 or 56 bytes (where the
// padding of a final block stops fitting in it), after 63, 64 or 65 (around the end of the first
// block), at either end (an empty update), and byte by byte.
TEST(Sha256, IncrementalUpdatesMatchTheOneShotDigest) {
  for (const auto& [message, want] :
       {std::pair<std::string, std::string>{k56, kDigest56}, {k112, kDigest112}}) {
    for (size_t split : {0, 1, 55, 56, 63, 64, 65, 111, 112}) {
      if (split > message.size()) continue;
      SCOPED_TRACE(testing::Message() << message.size() << " bytes split at " << split);
      Sha256 h;
      h.update(message.data(), split);
      h.update(message.data() + split, message.size() - split);
      EXPECT_EQ(h.hex_digest(), want);
    }
    // Byte by byte.
    Sha256 h;
    for (char c : message) h.update(&c, 1);
    EXPECT_EQ(h.hex_digest(), want) << message.size() << " bytes, one at a time";
  }
}

}  // namespace
}  // namespace qlinear
