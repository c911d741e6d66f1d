// A client that does half of something and then waits to be killed, for process_test:
//   killable_client TARGET upload   header + 4 MiB of a 16 MiB layer, then waits
//   killable_client TARGET stream   50 requests on a stream, reads nothing, then waits
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "client/qlinear_client.h"
#include "tests/server/test_util.h"

int main(int argc, char** argv) {
  using namespace qlinear;
  if (argc != 3) return 2;
  Client c(argv[1]);
  if (std::strcmp(argv[2], "upload") == 0) {
    testing::TestLayer big =
        testing::make_test_layer("killed", 4096, 4096, Scheme::kDynamicSymmetric, false, 1);
    grpc::ClientContext ctx;
    v1::LoadLayerResponse resp;
    auto w = c.stub().LoadLayer(&ctx, &resp);
    v1::LoadLayerRequest msg;
    *msg.mutable_header() = big.header;
    w->Write(msg);
    msg.set_weight_chunk(std::string(1 << 20, '\1'));
    for (int i = 0; i < 4; ++i) w->Write(msg);
    std::puts("ready");
    std::fflush(stdout);
    pause();
  } else if (std::strcmp(argv[2], "stream") == 0) {
    auto s = c.open_stream();
    SplitMix64 rng(2);
    const std::string x = testing::random_x(rng, 8, 512, DType::kF32);
    for (int i = 0; i < 50; ++i) {
      s->write(testing::make_request("demo", x, DType::kF32, 8, DType::kF32));
    }
    std::puts("ready");
    std::fflush(stdout);
    pause();
  }
  return 2;
}
