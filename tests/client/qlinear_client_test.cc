// The C++ client library's message-size checks: the bound every message is held to before it is
// sent (protobuf's serializer aborts on one over 2 GiB, which no test can afford to build), and
// the error a message over it gets. The CLI's end-to-end test trips the same checks with a small
// limit (client.cli_smoke).
#include "client/qlinear_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <climits>

namespace qlinear {
namespace {

using ::testing::HasSubstr;

TEST(MaxSendBytesTest, IsTheLimitInMiBAndNeverOverProtobufsBound) {
  EXPECT_EQ(max_send_bytes(1), 1 << 20);
  EXPECT_EQ(max_send_bytes(64), int64_t{64} << 20);
  EXPECT_EQ(max_send_bytes(2047), int64_t{2047} << 20);
  EXPECT_EQ(max_send_bytes(2048), INT_MAX);  // 2 GiB is one byte past protobuf's bound
  EXPECT_EQ(max_send_bytes(int64_t{1} << 50), INT_MAX);
  EXPECT_EQ(max_send_bytes(0), 0);
  EXPECT_EQ(max_send_bytes(-5), 0);
}

TEST(CheckMessageSizeTest, PassesUpToTheLimit) {
  EXPECT_TRUE(check_message_size("m", 0, 100, "r").ok());
  EXPECT_TRUE(check_message_size("m", 100, 100, "r").ok());
}

TEST(CheckMessageSizeTest, RefusesAMessageOverTheLimitSayingWhatToDo) {
  const absl::Status s =
      check_message_size("the request (M=8)", 101, 100, "send fewer rows per request");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the request (M=8) is 101 bytes, over the 100 bytes a message may have; send fewer "
            "rows per request");
}

TEST(CheckMessageSizeTest, RefusesAMessageOverTwoGiBWhateverTheOption) {
  // A client option of 4096 MiB still stops at protobuf's bound.
  const size_t bytes = size_t{2150400021};  // `infer --m 2100000` on K=512, bf16
  const absl::Status s =
      check_message_size("the request (M=2100000)", bytes, max_send_bytes(4096), "send fewer rows");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("is 2150400021 bytes, over the 2147483647 bytes a message "
                                     "may have (protobuf's bound); send fewer rows"));
}

TEST(ClientOptionsTest, TheDefaultChunkLeavesRoomForItsMessagesFraming) {
  // A server of --max-message-mb 1 takes the default chunk in one message.
  EXPECT_LE(ClientOptions().upload_chunk_bytes + kChunkFramingBytes, int64_t{1} << 20);
}

}  // namespace
}  // namespace qlinear
