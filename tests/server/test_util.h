// Helpers for the server tests: random layers as both a proto header and the LayerSpec the
// reference uses, random activations, and the reference answer.
#pragma once

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/random.h"
#include "common/sha256.h"
#include "kernels/core/weights.h"
#include "kernels/reference/reference_w8a8.h"
#include "qlinear/v1/qlinear.pb.h"

namespace qlinear::testing {

struct TestLayer {
  v1::LayerHeader header;
  LayerSpec spec;
  std::vector<int8_t> weights;
};

inline TestLayer make_test_layer(const std::string& name, int64_t n, int64_t k, Scheme scheme,
                                 bool bias, uint64_t seed) {
  SplitMix64 rng(seed);
  TestLayer t;
  t.weights = random_int8(rng, static_cast<size_t>(n * k));
  t.spec.n = n;
  t.spec.k = k;
  t.spec.scheme = scheme;
  t.spec.weight_scale = random_floats(rng, static_cast<size_t>(n), 1e-3f, 3e-3f);
  t.spec.weight_scale_shape = {n};
  if (bias) t.spec.bias = random_floats(rng, static_cast<size_t>(n), -2.f, 2.f);
  if (is_static(scheme)) {
    t.spec.has_input_scale = true;
    t.spec.input_scale = 0.015f;
  }
  if (scheme == Scheme::kStaticAsymmetric) {
    t.spec.has_input_zero_point = true;
    t.spec.input_zero_point = 5;
  }
  v1::LayerHeader& h = t.header;
  h.set_name(name);
  h.set_n(n);
  h.set_k(k);
  h.set_scheme(static_cast<v1::Scheme>(static_cast<int>(scheme)));
  h.mutable_weight_scale()->set_dtype(v1::DTYPE_FP32);
  h.mutable_weight_scale()->add_shape(n);
  h.mutable_weight_scale()->set_data(t.spec.weight_scale.data(), 4 * t.spec.weight_scale.size());
  if (bias) {
    h.mutable_bias()->set_dtype(v1::DTYPE_FP32);
    h.mutable_bias()->add_shape(n);
    h.mutable_bias()->set_data(t.spec.bias.data(), 4 * t.spec.bias.size());
  }
  if (t.spec.has_input_scale) h.set_input_scale(t.spec.input_scale);
  if (t.spec.has_input_zero_point) h.set_input_zero_point(t.spec.input_zero_point);
  h.set_weight_sha256(sha256_hex(t.weights.data(), t.weights.size()));
  return t;
}

// Random activations in [-2, 2) as raw bytes of `dtype`.
inline std::string random_x(SplitMix64& rng, int64_t m, int64_t k, DType dtype) {
  std::string bytes(static_cast<size_t>(m * k) * dtype_size(dtype), '\0');
  for (int64_t i = 0; i < m * k; ++i)
    store_from_f32(bytes.data(), dtype, i, rng.uniform(-2.f, 2.f));
  return bytes;
}

// y computed by the reference kernel for the layer `t`.
inline std::string reference_y(const TestLayer& t, const std::string& x, DType x_dtype, int64_t m,
                               DType y_dtype) {
  auto lw = build_layer_weights(t.spec, t.weights);
  if (!lw.ok()) return "reference failed: " + lw.status().ToString();
  std::string y(static_cast<size_t>(m * t.spec.n) * dtype_size(y_dtype), '\0');
  RunArgs a;
  a.x = x.data();
  a.x_dtype = x_dtype;
  a.m = m;
  a.y = y.data();
  a.y_dtype = y_dtype;
  absl::Status s = reference::w8a8_linear(**lw, a);
  if (!s.ok()) return "reference failed: " + s.ToString();
  return y;
}

inline v1::InferRequest make_request(const std::string& layer, const std::string& x, DType x_dtype,
                                     int64_t m, DType y_dtype, const std::string& id = "") {
  v1::InferRequest r;
  r.set_layer(layer);
  r.set_request_id(id);
  r.set_x_dtype(static_cast<v1::DType>(static_cast<int>(x_dtype)));
  r.set_output_dtype(static_cast<v1::DType>(static_cast<int>(y_dtype)));
  r.set_m(m);
  r.set_x(x);
  return r;
}

// A loopback port that was free a moment ago.
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One request on grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo, encoded by hand
// (the reflection protos are not installed): returns the raw response bytes, or "" on failure.
inline std::string reflection_call(const std::shared_ptr<grpc::Channel>& channel,
                                   const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok = false;
  std::string bytes;
  call->StartCall(reinterpret_cast<void*>(1));
  if (cq.Next(&tag, &ok) && ok) {
    grpc::Slice slice(request);
    grpc::ByteBuffer buf(&slice, 1);
    call->Write(buf, reinterpret_cast<void*>(2));
    if (cq.Next(&tag, &ok) && ok) {
      grpc::ByteBuffer reply;
      call->Read(&reply, reinterpret_cast<void*>(3));
      std::vector<grpc::Slice> slices;
      if (cq.Next(&tag, &ok) && ok && reply.Dump(&slices).ok()) {
        for (const auto& s : slices)
          bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
  }
  call->WritesDone(reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return bytes;
}

// ServerReflectionRequest{list_services: "*"} (field 7).
inline std::string reflection_list_services(const std::shared_ptr<grpc::Channel>& channel) {
  return reflection_call(channel, std::string("\x3a\x01*", 3));
}

// ServerReflectionRequest{file_containing_symbol: symbol} (field 4).
inline std::string reflection_file_containing(const std::shared_ptr<grpc::Channel>& channel,
                                              const std::string& symbol) {
  return reflection_call(channel, std::string("\x22") + static_cast<char>(symbol.size()) + symbol);
}

}  // namespace qlinear::testing
