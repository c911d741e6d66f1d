// The gRPC service: each handler validates the message, calls the Engine and converts the
// status in one place (grpc_status.h). Synchronous API, but for InferStream: a stream is a
// callback-API reactor, which holds no thread while it waits for its client's next message, and
// runs each message on the service's WorkerPool.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "qlinear/v1/qlinear.grpc.pb.h"
#include "server/core/engine.h"
#include "server/upload_watchdog.h"
#include "server/worker_pool.h"

namespace qlinear {

// The work that may hold a thread for long: an Infer call (while it waits in its layer's queue),
// an InferStream message (while it runs, on the service's WorkerPool; a stream between messages
// holds nothing) and a LoadLayer call (while the client uploads). Together they take at most
// `max_calls` slots, fewer than the server's `threads`, so that the rest stay free for health
// checks, listings and layer management: were every gRPC thread held, gRPC would answer those,
// and every other client, with its own RESOURCE_EXHAUSTED. A call or stream message beyond them is
// RESOURCE_EXHAUSTED at once, saying so. A unary call (Infer, Echo, LoadLayer) gives its slot
// back as its handler returns, but its thread stays held until its answer has been sent, which a
// client that reads a large y slowly can draw out: an answer still being sent kSlowSend after its
// handler returned counts against the slots too, so that such clients cannot take every thread. (A
// send that has just begun does not: its client may already hold the answer and call again.) An
// InferStream message's answer is written on the callback API, which holds no thread.
//
// One layer's inference calls and stream messages hold at most `max_per_layer` of the slots, all
// but an eighth (at least one kept): a layer runs one batch at a time, so the calls that one
// layer's clients pile up beyond that would only wait in its queue, while the slots kept serve the
// other layers and uploads. One beyond is RESOURCE_EXHAUSTED, naming the layer.
struct CallSlots {
  int max_calls = 0;      // 0: no limit
  int threads = 0;        // what the server has, for the message
  int max_per_layer = 0;  // 0: no limit but max_calls
};

// How long an answer is sent before its call counts against the slots again (see CallSlots).
inline constexpr absl::Duration kSlowSend = absl::Milliseconds(10);

// The threads kept back at least: gRPC's synchronous server keeps up to two polling for new calls
// (a poller that would leave none answers the call it took with its own RESOURCE_EXHAUSTED, and a
// thread back from a call polls until it finds two others polling), and the rest run health
// checks and listings.
inline constexpr int kMinThreadsKept = 4;
// The fewest threads a server may have: one call slot, beside the threads kept back.
inline constexpr int kMinServerThreads = kMinThreadsKept + 1;

// The call slots a server of `threads` (>= kMinServerThreads) gRPC threads gives: all but an
// eighth of them, at least kMinThreadsKept and at most 16 kept back; of those, one layer may hold
// all but an eighth, at least one kept (all where there is only one).
CallSlots call_slots_for(int threads);

class QLinearService final
    : public v1::QLinear::WithCallbackMethod_InferStream<v1::QLinear::Service> {
 public:
  // `upload_idle_limit`: an upload that receives no message for this long is cancelled (zero or
  // less: never; see UploadWatchdog).
  QLinearService(Engine* engine, bool enable_echo,
                 absl::Duration upload_idle_limit = absl::ZeroDuration(), CallSlots slots = {})
      : engine_(engine),
        enable_echo_(enable_echo),
        upload_watchdog_(upload_idle_limit),
        slots_(slots),
        stream_workers_(slots.max_calls > 0 ? slots.max_calls : kStreamWorkersWithoutSlots) {}

  // After this, new calls are answered UNAVAILABLE; calls in flight complete.
  void start_draining() { draining_.store(true); }
  // The service's calls in flight, for a drain to wait for: every call from its start until its
  // answer has left (counted by the interceptor that in_flight_counter makes, which the server
  // must install), but an InferStream while it waits for its client's next message (a stream left
  // open between requests holds no work; once the server drains, that next message is refused
  // unrun anyway).
  int calls_in_flight() const { return in_flight_.load(); }
  // The interceptor factory that counts this service's calls in calls_in_flight: a handler
  // returns before a unary call's answer is sent (a large y can take a while), so the count
  // follows the call itself, from its start to its end. Its interceptors also time the unary
  // calls' sends for the slots (see CallSlots); without them, no send counts.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> in_flight_counter();
  // Of the calls open, the InferStreams waiting for their client's next message.
  int idle_streams() const { return idle_streams_.load(); }

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
  grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse>* InferStream(
      grpc::CallbackServerContext* ctx) override;
  grpc::Status ListKernels(grpc::ServerContext* ctx, const v1::ListKernelsRequest* request,
                           v1::ListKernelsResponse* response) override;
  grpc::Status Echo(grpc::ServerContext* ctx, const v1::EchoRequest* request,
                    v1::EchoResponse* response) override;

 private:
  class StreamReactor;
  class CallInterceptor;
  class InFlightCounter;
  // The stream messages' threads where the slots set no limit.
  static constexpr int kStreamWorkersWithoutSlots = 64;

  // Runs one inference message; the returned status is the message's.
  absl::Status infer_one(grpc::ServerContextBase* ctx, const v1::InferRequest& request,
                         v1::InferResponse* response);
  grpc::Status unavailable_if_draining() const;
  // Takes one of the call slots, which release_slot() gives back; RESOURCE_EXHAUSTED (nothing
  // taken) when all are taken, or, for an inference request (`layer`: the layer it names), when
  // that layer's requests hold max_per_layer. A name that is not a layer's is not counted by layer
  // (the request fails once it reaches the engine).
  grpc::Status take_slot(absl::string_view layer = {});
  void release_slot(absl::string_view layer = {});
  // The unary calls whose answers have been sent for kSlowSend or longer.
  int slow_sends();
  // `s`, an inference call refused before it reached the engine (draining, no slot), counted
  // among the failed requests first, as the engine counts those it refuses.
  grpc::Status refused(grpc::Status s) const;

  Engine* engine_;
  const bool enable_echo_;
  // draining_ and in_flight_ are sequentially consistent: a call is counted in flight before its
  // handler reads draining_, a drain sets draining_ and then reads in_flight_, so either the
  // handler sees the drain (and refuses its work) or the drain sees the call (and waits for it).
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int> idle_streams_{0};
  UploadWatchdog upload_watchdog_;
  const CallSlots slots_;
  std::atomic<int> slots_used_{0};
  // The slots each layer's requests hold (layers holding none are not listed).
  absl::Mutex layers_mu_;
  absl::flat_hash_map<std::string, int> layer_slots_ ABSL_GUARDED_BY(layers_mu_);
  // The unary calls whose handlers have returned and whose answers are being sent.
  std::atomic<int> sending_{0};
  // The interceptors of those calls.
  absl::Mutex calls_mu_;
  absl::flat_hash_set<const CallInterceptor*> sending_calls_ ABSL_GUARDED_BY(calls_mu_);
  // Runs InferStream's messages (one thread per slot at most); last, so that its threads, which
  // use the members above, are joined first.
  WorkerPool stream_workers_;
};

// Proto <-> core conversions, shared with tests.
void fill_layer_info(const ServedLayer& served, v1::LayerInfo* info);
// The log line of a load: "loaded layer 'q' 4096x4096 dynamic_symmetric on cpu in 12 ms;
// kernels: M 1-16: a, M >=17: b" ("replaced" where it replaced a layer).
std::string load_summary(const LoadResult& result);
absl::StatusOr<LoadRequest> load_request_from_header(const v1::LayerHeader& header);

}  // namespace qlinear
