// The gRPC service: each handler validates the message, calls the Engine and converts the
// status in one place (grpc_status.h). Synchronous API; the server's thread pool bounds the
// number of calls in flight.
#pragma once

#include <atomic>

#include "absl/time/time.h"
#include "qlinear/v1/qlinear.grpc.pb.h"
#include "server/core/engine.h"
#include "server/upload_watchdog.h"

namespace qlinear {

class QLinearService final : public v1::QLinear::Service {
 public:
  // `upload_idle_limit`: an upload that receives no message for this long is cancelled (zero or
  // less: never; see UploadWatchdog).
  QLinearService(Engine* engine, bool enable_echo,
                 absl::Duration upload_idle_limit = absl::ZeroDuration())
      : engine_(engine), enable_echo_(enable_echo), upload_watchdog_(upload_idle_limit) {}

  // After this, new calls are answered UNAVAILABLE; calls in flight complete.
  void start_draining() { draining_.store(true); }

  grpc::Status LoadLayer(grpc::ServerContext* ctx, grpc::ServerReader<v1::LoadLayerRequest>* reader,
                         v1::LoadLayerResponse* response) override;
  grpc::Status UnloadLayer(grpc::ServerContext* ctx, const v1::UnloadLayerRequest* request,
                           v1::UnloadLayerResponse* response) override;
  grpc::Status ListLayers(grpc::ServerContext* ctx, const v1::ListLayersRequest* request,
                          v1::ListLayersResponse* response) override;
  grpc::Status DescribeLayer(grpc::ServerContext* ctx, const v1::DescribeLayerRequest* request,
                             v1::LayerInfo* response) override;
  grpc::Status Infer(grpc::ServerContext* ctx, const v1::InferRequest* request,
                     v1::InferResponse* response) override;
  grpc::Status InferStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::InferResponse, v1::InferRequest>* stream) override;
  grpc::Status ListKernels(grpc::ServerContext* ctx, const v1::ListKernelsRequest* request,
                           v1::ListKernelsResponse* response) override;
  grpc::Status Echo(grpc::ServerContext* ctx, const v1::EchoRequest* request,
                    v1::EchoResponse* response) override;

 private:
  // Runs one inference message; the returned status is the message's.
  absl::Status infer_one(grpc::ServerContext* ctx, const v1::InferRequest& request,
                         v1::InferResponse* response);
  grpc::Status unavailable_if_draining() const;

  Engine* engine_;
  const bool enable_echo_;
  std::atomic<bool> draining_{false};
  UploadWatchdog upload_watchdog_;
};

// Proto <-> core conversions, shared with tests.
void fill_layer_info(const ServedLayer& served, v1::LayerInfo* info);
// The log line of a load: "loaded layer 'q' 4096x4096 dynamic_symmetric on cpu in 12 ms;
// kernels: M 1-16: a, M >=17: b" ("replaced" where it replaced a layer).
std::string load_summary(const LoadResult& result);
absl::StatusOr<LoadRequest> load_request_from_header(const v1::LayerHeader& header);

}  // namespace qlinear
