// smoke: an end-to-end check of a server. For each scheme it uploads a random layer, streams
// requests of random M with a mix of dtypes on one InferStream, and compares every output element
// (and every sa / azp) bit for bit with the reference kernel run here on the same LayerSpec and
// the same x bytes. One deliberately bad message checks that a per-message error leaves the
// stream open. Exit 1 on any mismatch or error.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "kernels/core/weights.h"
#include "kernels/reference/reference_w8a8.h"

namespace qlinear::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Per-tensor input scale and zero point of the static schemes: x in [-1, 1) / 0.02 stays well
// inside int8 after the zero point is added.
constexpr float kStaticInputScale = 0.02f;
constexpr int32_t kStaticZeroPoint = 3;
// Element mismatches reported in detail per scheme; the rest are only counted.
constexpr size_t kMaxReportedMismatches = 5;

Scheme core_scheme(v1::Scheme s) { return static_cast<Scheme>(static_cast<int>(s)); }

// Distance in units in the last place between two values of the same 16- or 32-bit float type,
// on the sign-magnitude ordering (adjacent representable values differ by 1).
int64_t ulp_distance(uint32_t a, uint32_t b, int bits) {
  if (a == b) return 0;
  const uint32_t sign = 1u << (bits - 1);
  auto ordered = [&](uint32_t v) -> int64_t {
    const int64_t mag = static_cast<int64_t>(v & (sign - 1));
    return (v & sign) ? -mag : mag;
  };
  return std::llabs(ordered(a) - ordered(b));
}

uint32_t element_bits(const std::string& buf, DType t, int64_t i) {
  if (t == DType::kF32) {
    uint32_t u;
    std::memcpy(&u, buf.data() + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return h;
}

struct Message {
  v1::InferRequest request;
  bool bad = false;
};

struct SchemeResult {
  std::string scheme;
  std::string layer;
  int64_t n = 0, k = 0;
  bool loaded = false;
  std::string device;
  std::string selection;          // from the first response
  std::set<std::string> kernels;  // every kernel that served a request
  int64_t requests = 0, rows = 0, elements = 0, mismatches = 0, scale_mismatches = 0;
  double max_abs = 0;
  int64_t max_ulp = 0;
  std::vector<double> latency_ms;
  std::vector<int64_t> gemm_us;
  std::string bad_message = "-";
  absl::Status rpc_error;                    // the first failed call, if any
  std::vector<std::string> problems;         // errors: anything but a differing element
  std::vector<std::string> mismatch_detail;  // the first few differing elements, sa or azp
};

template <typename T>
T percentile(std::vector<T> v, double q) {
  if (v.empty()) return T{};
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string describe_request(const v1::InferRequest& r) {
  return absl::StrCat(
      r.request_id(), " (M=", r.m(), ", ", dtype_cli_name(r.x_dtype()), " -> ",
      dtype_cli_name(r.output_dtype() == v1::DTYPE_UNSPECIFIED ? r.x_dtype() : r.output_dtype()),
      ")");
}

// Checks one good response against the reference run on the same request.
void check_response(const LayerWeights& weights, const v1::InferRequest& req,
                    const v1::InferResponse& resp, SchemeResult* res) {
  const std::string what = describe_request(req);
  if (resp.status_code() != 0) {
    res->problems.push_back(absl::StrCat(
        what, ": ", absl::StatusCodeToString(static_cast<absl::StatusCode>(resp.status_code())),
        ": ", resp.status_message()));
    return;
  }
  const v1::DType want_y =
      req.output_dtype() == v1::DTYPE_UNSPECIFIED ? req.x_dtype() : req.output_dtype();
  const DType yt = core_dtype(want_y);
  const int64_t m = req.m(), n = weights.config.n;
  const size_t y_bytes = static_cast<size_t>(m * n) * dtype_size(yt);
  if (resp.y_dtype() != want_y || resp.m() != m || resp.n() != n || resp.y().size() != y_bytes) {
    res->problems.push_back(absl::StrCat(what, ": response is y [", resp.m(), ", ", resp.n(), "] ",
                                         dtype_cli_name(resp.y_dtype()), " with ", resp.y().size(),
                                         " bytes; expected [", m, ", ", n, "] ",
                                         dtype_cli_name(want_y), " with ", y_bytes));
    return;
  }

  std::string y_ref(y_bytes, '\0');
  std::vector<float> sa_ref(static_cast<size_t>(m));
  std::vector<int32_t> azp_ref(static_cast<size_t>(m));
  RunArgs ra;
  ra.x = req.x().data();
  ra.x_dtype = core_dtype(req.x_dtype());
  ra.m = m;
  ra.y = y_ref.data();
  ra.y_dtype = yt;
  ra.sa = sa_ref.data();
  ra.azp = azp_ref.data();
  if (absl::Status s = reference::w8a8_linear(weights, ra); !s.ok()) {
    res->problems.push_back(absl::StrCat(what, ": the local reference failed: ", s.ToString()));
    return;
  }

  ++res->requests;
  res->rows += m;
  res->elements += m * n;
  res->kernels.insert(resp.metadata().kernel());
  res->gemm_us.push_back(resp.metadata().timings().gemm_us());
  const int bits = yt == DType::kF32 ? 32 : 16;
  for (int64_t i = 0; i < m * n; ++i) {
    const uint32_t a = element_bits(resp.y(), yt, i);
    const uint32_t b = element_bits(y_ref, yt, i);
    if (a == b) continue;
    ++res->mismatches;
    const float fa = load_as_f32(resp.y().data(), yt, static_cast<size_t>(i));
    const float fb = load_as_f32(y_ref.data(), yt, static_cast<size_t>(i));
    const bool finite = std::isfinite(fa) && std::isfinite(fb);
    const int64_t ulp = finite ? ulp_distance(a, b, bits) : std::numeric_limits<int32_t>::max();
    const double abs_err =
        finite ? std::fabs(static_cast<double>(fa) - fb) : std::numeric_limits<double>::infinity();
    res->max_ulp = std::max(res->max_ulp, ulp);
    res->max_abs = std::max(res->max_abs, abs_err);
    if (res->mismatch_detail.size() < kMaxReportedMismatches) {
      res->mismatch_detail.push_back(absl::StrFormat(
          "%s: y[%d, %d] = %.9g (0x%x), reference %.9g (0x%x)", what, i / n, i % n, fa, a, fb, b));
    }
  }

  // sa and azp must be bit-exact for every kernel (SPEC section 5).
  const auto& sa = resp.metadata().sa();
  const auto& azp = resp.metadata().azp();
  const bool asym = is_asymmetric(weights.config.scheme);
  if (sa.size() != m || azp.size() != (asym ? m : 0)) {
    res->problems.push_back(absl::StrCat(what, ": metadata has ", sa.size(), " sa and ", azp.size(),
                                         " azp values; expected ", m, " and ", asym ? m : 0));
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    const int j = static_cast<int>(i);
    const bool sa_differs = f32_bits(sa[j]) != f32_bits(sa_ref[i]);
    const bool azp_differs = asym && azp[j] != azp_ref[i];
    if (!sa_differs && !azp_differs) continue;
    ++res->scale_mismatches;
    if (res->mismatch_detail.size() < kMaxReportedMismatches) {
      res->mismatch_detail.push_back(
          sa_differs
              ? absl::StrFormat("%s: sa[%d] = %.9g, reference %.9g", what, i, sa[j], sa_ref[i])
              : absl::StrFormat("%s: azp[%d] = %d, reference %d", what, i, azp[j], azp_ref[i]));
    }
  }
}

void check_bad_response(const v1::InferRequest& req, const v1::InferResponse& resp,
                        SchemeResult* res) {
  if (resp.status_code() == static_cast<int>(absl::StatusCode::kInvalidArgument) &&
      resp.y().empty()) {
    res->bad_message = "INVALID_ARGUMENT";
    return;
  }
  res->bad_message = "wrong";
  res->problems.push_back(absl::StrCat(
      req.request_id(), " (x one value short): expected INVALID_ARGUMENT and no y, got ",
      absl::StatusCodeToString(static_cast<absl::StatusCode>(resp.status_code())), " with ",
      resp.y().size(), " bytes of y", resp.status_message().empty() ? "" : ": ",
      resp.status_message()));
}

struct SmokeOptions {
  int64_t n, k, batches, max_m;
  uint64_t seed;
  std::string name_suffix;  // of every layer: layer_name_suffix(), one for the run
  // The whole stream of a scheme's requests (0: none); the checks against the reference run
  // after it.
  std::chrono::milliseconds stream_timeout;
};

void run_scheme(Client& client, const SmokeOptions& o, v1::Scheme scheme, size_t index,
                SchemeResult* res) {
  res->scheme = scheme_cli_name(scheme);
  res->layer = absl::StrCat("smoke-", res->scheme, "-", o.name_suffix);
  res->n = o.n;
  res->k = o.k;
  SplitMix64 rng(o.seed + 0x1000 * index);

  // The layer, as both sides see it.
  LayerSpec spec;
  spec.n = o.n;
  spec.k = o.k;
  spec.scheme = core_scheme(scheme);
  spec.weight_scale = random_floats(rng, static_cast<size_t>(o.n), 0.5e-3f, 2e-3f);
  spec.weight_scale_shape = {o.n};
  spec.bias = random_floats(rng, static_cast<size_t>(o.n), -1.f, 1.f);
  if (is_static(spec.scheme)) {
    spec.has_input_scale = true;
    spec.input_scale = kStaticInputScale;
  }
  if (spec.scheme == Scheme::kStaticAsymmetric) {
    spec.has_input_zero_point = true;
    spec.input_zero_point = kStaticZeroPoint;
  }
  std::vector<int8_t> w = random_int8(rng, static_cast<size_t>(o.n * o.k));

  v1::LayerHeader h;
  h.set_name(res->layer);
  h.set_n(spec.n);
  h.set_k(spec.k);
  h.set_scheme(scheme);
  h.mutable_weight_scale()->set_dtype(v1::DTYPE_FP32);
  h.mutable_weight_scale()->add_shape(o.n);
  h.mutable_weight_scale()->set_data(reinterpret_cast<const char*>(spec.weight_scale.data()),
                                     spec.weight_scale.size() * sizeof(float));
  h.mutable_bias()->set_dtype(v1::DTYPE_FP32);
  h.mutable_bias()->add_shape(o.n);
  h.mutable_bias()->set_data(reinterpret_cast<const char*>(spec.bias.data()),
                             spec.bias.size() * sizeof(float));
  if (spec.has_input_scale) h.set_input_scale(spec.input_scale);
  if (spec.has_input_zero_point) h.set_input_zero_point(spec.input_zero_point);

  // The requests: random M, x dtypes in turn, output dtypes at random; one bad message (x one
  // value short) in the middle.
  const v1::DType x_dtypes[] = {v1::DTYPE_FP32, v1::DTYPE_FP16, v1::DTYPE_BF16};
  const v1::DType y_dtypes[] = {v1::DTYPE_UNSPECIFIED, v1::DTYPE_FP32, v1::DTYPE_FP16,
                                v1::DTYPE_BF16};
  std::vector<Message> msgs;
  for (int64_t i = 0; i < o.batches; ++i) {
    Message msg;
    v1::InferRequest& r = msg.request;
    r.set_layer(res->layer);
    r.set_request_id(absl::StrCat(res->layer, "#", i));
    r.set_x_dtype(x_dtypes[i % 3]);
    r.set_output_dtype(y_dtypes[rng.range(0, 3)]);
    r.set_m(rng.range(1, o.max_m));
    r.set_x(random_activations(rng, r.m() * o.k, core_dtype(r.x_dtype())));
    r.set_return_scales(true);
    r.set_explain(i == 0);
    msgs.push_back(std::move(msg));
  }
  Message bad;
  bad.bad = true;
  bad.request.set_layer(res->layer);
  bad.request.set_request_id(absl::StrCat(res->layer, "#bad"));
  bad.request.set_x_dtype(v1::DTYPE_FP32);
  bad.request.set_m(1);
  bad.request.set_x(std::string(static_cast<size_t>(o.k - 1) * 4, '\0'));
  msgs.insert(msgs.begin() + static_cast<int64_t>(msgs.size() / 2), std::move(bad));

  // The upload comes once the inputs are made (a failure making them leaves nothing on the
  // server); cmd_smoke unloads every layer that loaded, whatever happens next.
  // Ctrl-C stops the upload too (CANCELLED, nothing loaded): a large layer takes a while.
  auto loaded = upload_with_progress(client, h, w);
  if (!loaded.ok()) {
    res->rpc_error = loaded.status();
    res->problems.push_back(
        sigint_received() ? absl::StrCat("interrupted (Ctrl-C) while uploading ", res->layer,
                                         "; nothing was loaded")
                          : absl::StrCat("load ", res->layer, ": ", loaded.status().ToString()));
    return;
  }
  res->loaded = true;
  res->device = loaded->layer().device();
  auto weights = build_layer_weights(spec, std::move(w));
  if (!weights.ok()) {
    res->problems.push_back(
        absl::StrCat("the local reference rejects the layer: ", weights.status().ToString()));
    return;
  }

  // One request at a time, so that each latency is that request's alone; the bad message and the
  // request after it are written back to back, so that order and recovery are tested with two
  // messages in flight. The answers are checked against the reference once the stream is done,
  // so that the stream's deadline covers the server's time only.
  auto stream = client.open_stream(o.stream_timeout);
  bool broken = false;
  v1::InferResponse resp;
  std::vector<v1::InferResponse> answers(msgs.size());
  size_t answered = 0;
  auto check_answers = [&] {
    for (size_t j = 0; j < answered; ++j) {
      if (msgs[j].bad) {
        check_bad_response(msgs[j].request, answers[j], res);
      } else {
        check_response(**weights, msgs[j].request, answers[j], res);
      }
    }
  };
  for (size_t i = 0; i < msgs.size() && !broken;) {
    if (sigint_received()) {
      res->problems.push_back("interrupted (Ctrl-C)");
      broken = true;
      break;
    }
    const size_t end = std::min(msgs.size(), i + (msgs[i].bad ? 2 : 1));
    std::vector<Clock::time_point> sent;
    for (size_t j = i; j < end; ++j) {
      sent.push_back(Clock::now());
      if (!stream->write(msgs[j].request)) {
        broken = true;
        break;
      }
    }
    for (size_t j = i; j < end && !broken; ++j) {
      if (!stream->read(&resp)) {
        broken = true;
        break;
      }
      const double ms =
          std::chrono::duration<double, std::milli>(Clock::now() - sent[j - i]).count();
      const v1::InferRequest& req = msgs[j].request;
      if (resp.request_id() != req.request_id()) {
        res->problems.push_back(absl::StrCat("response ", j, " has request id '", resp.request_id(),
                                             "', expected '", req.request_id(),
                                             "' (out of order)"));
        broken = true;
        break;
      }
      if (res->selection.empty() && resp.metadata().selection_size() > 0) {
        res->selection = selection_summary(resp.metadata().selection());
      }
      if (!msgs[j].bad) res->latency_ms.push_back(ms);
      answers[answered++] = std::move(resp);
    }
    i = end;
  }
  if (broken) {
    stream->cancel();
    absl::Status s = stream->finish();
    if (!s.ok()) res->rpc_error = s;
    res->problems.push_back(absl::StrCat("the stream ended early: ", s.ToString()));
    check_answers();
    return;
  }
  stream->writes_done();
  if (stream->read(&resp)) {
    res->problems.push_back(
        absl::StrCat("an extra response arrived (id '", resp.request_id(), "')"));
  }
  if (absl::Status s = stream->finish(); !s.ok()) {
    res->rpc_error = s;
    res->problems.push_back(absl::StrCat("the stream finished with ", s.ToString()));
  }
  check_answers();
}

std::string kernel_column(const SchemeResult& r) {
  std::string out = r.selection.empty() ? "-" : r.selection;
  std::vector<std::string> others;
  for (const std::string& k : r.kernels) {
    if (r.selection.compare(0, k.size() + 1, k + " ") != 0) others.push_back(k);
  }
  if (!others.empty()) absl::StrAppend(&out, " [also ran: ", absl::StrJoin(others, ", "), "]");
  return out;
}

}  // namespace

int cmd_smoke(const CommandArgs& args) {
  int64_t n = 1024, k = 1024, batches = 8, max_m = 64, seed = 0;
  std::string schemes_arg = "all";
  bool keep = false;
  ArgParser p(
      "qlinear-cli smoke [--n N --k K] [--schemes all|LIST] [--batches B] [--max-m M]",
      "End-to-end check of a server. For each scheme: uploads a random layer with a bias\n"
      "(static schemes: input scale 0.02, zero point 3) named smoke-<scheme>-<pid>-<random>,\n"
      "streams --batches requests with random M in 1..--max-m and a mix of x and output dtypes\n"
      "on one InferStream, and compares every output element, sa and azp bit for bit with the\n"
      "reference kernel run locally on the same layer and input. One bad message (x one value\n"
      "short) must get its own INVALID_ARGUMENT while the stream goes on. Prints a table per\n"
      "scheme and `smoke: PASS` or `smoke: FAIL`; exits 1 on any mismatch or error. The\n"
      "reference is scalar: large layers take a while on both sides (the checks run after each\n"
      "scheme's stream). --timeout-s bounds each call and each scheme's whole stream (default\n"
      "60 s); an upload only where given. Ctrl-C stops after the request in flight (or stops\n"
      "the upload in progress), unloads the layers and reports (a second Ctrl-C ends it at\n"
      "once). An upload over 4 MiB shows a progress line on a terminal.");
  p.add("n", &n, "Output features of each layer");
  p.add("k", &k, "Input features of each layer");
  p.add("schemes", &schemes_arg, "all, or a comma list of schemes");
  p.add("batches", &batches, "Requests per scheme");
  p.add("max-m", &max_m, "Largest M of a request");
  p.add("seed", &seed, "Seed of layers and inputs (0: a fresh one, printed)");
  p.add("keep", &keep, "Leave the layers loaded");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;
  if (n < 1 || k < 2 || k > kMaxK)
    return usage_error(absl::StrCat("need n >= 1, 2 <= k <= ", kMaxK));
  if (batches < 1 || max_m < 1) return usage_error("--batches and --max-m must be >= 1");
  std::vector<v1::Scheme> schemes;
  if (schemes_arg == "all") {
    schemes = {v1::SCHEME_DYNAMIC_SYMMETRIC, v1::SCHEME_STATIC_SYMMETRIC,
               v1::SCHEME_DYNAMIC_ASYMMETRIC, v1::SCHEME_STATIC_ASYMMETRIC};
  } else {
    for (absl::string_view s : absl::StrSplit(schemes_arg, ',', absl::SkipWhitespace())) {
      auto sc = parse_scheme(s);
      if (!sc.ok()) return usage_error(sc.status().message());
      // (Each scheme's layer is named after it: a second would collide with the first.)
      if (std::find(schemes.begin(), schemes.end(), *sc) != schemes.end()) {
        return usage_error(absl::StrCat("--schemes lists ", scheme_cli_name(*sc), " twice"));
      }
      schemes.push_back(*sc);
    }
    if (schemes.empty()) return usage_error("--schemes lists no scheme");
  }
  if (seed == 0) {
    seed = static_cast<int64_t>(
        SplitMix64(static_cast<uint64_t>(Clock::now().time_since_epoch().count())).next() >> 33);
  }

  std::printf(
      "smoke: server %s, layers %lldx%lld, %lld requests per scheme (M 1..%lld), seed %lld\n",
      args.server->c_str(), static_cast<long long>(n), static_cast<long long>(k),
      static_cast<long long>(batches), static_cast<long long>(max_m), static_cast<long long>(seed));
  std::fflush(stdout);
  const auto start = Clock::now();
  auto client = make_client(args);
  // A scheme's stream holds its requests only (the reference checks come after it): the call
  // deadline, --timeout-s or its default, bounds it.
  const std::string suffix = layer_name_suffix();
  SmokeOptions o{n, k, batches, max_m, static_cast<uint64_t>(seed), suffix, args.timeout};
  std::vector<SchemeResult> results(schemes.size());
  // Every layer that loaded is unloaded however the command ends: here before the report (which
  // tells a failed unload), or on the way out of an exception (out of memory).
  absl::Cleanup unload = [&] {
    if (keep) return;
    for (SchemeResult& r : results) {
      if (!r.loaded) continue;
      if (absl::Status s = client->unload_layer(r.layer); !s.ok()) {
        if (r.rpc_error.ok()) r.rpc_error = s;
        r.problems.push_back(absl::StrCat("unload ", r.layer, ": ", s.ToString()));
      }
    }
  };
  {
    const CatchSigint sigint;
    for (size_t i = 0; i < schemes.size() && !sigint_received(); ++i) {
      run_scheme(*client, o, schemes[i], i, &results[i]);
    }
    for (size_t i = 0; i < schemes.size(); ++i) {
      SchemeResult& r = results[i];
      if (!r.scheme.empty()) continue;
      r.scheme = scheme_cli_name(schemes[i]);
      r.n = n;
      r.k = k;
      r.problems.push_back("not run: interrupted (Ctrl-C)");
    }
  }
  std::move(unload).Invoke();

  Table t({"SCHEME", "SHAPE", "DEVICE", "REQS", "ROWS", "MISMATCH", "MAX ABS", "MAX ULP",
           "LATENCY P50/MAX", "GEMM P50", "BAD MSG", "KERNEL (SELECTION, FIRST REQUEST)"});
  int64_t requests = 0, rows = 0, elements = 0, mismatches = 0, scale_mismatches = 0;
  int64_t problems = 0;
  for (const SchemeResult& r : results) {
    const bool ran = r.requests > 0;
    t.add({r.scheme, absl::StrCat(r.n, "x", r.k), r.device.empty() ? "-" : r.device,
           absl::StrCat(r.requests), absl::StrCat(r.rows), ran ? absl::StrCat(r.mismatches) : "-",
           ran ? absl::StrFormat("%.3g", r.max_abs) : "-", ran ? absl::StrCat(r.max_ulp) : "-",
           r.latency_ms.empty() ? "-"
                                : absl::StrFormat("%.1f/%.1f ms", percentile(r.latency_ms, 0.5),
                                                  percentile(r.latency_ms, 1.0)),
           r.gemm_us.empty() ? "-" : absl::StrCat(percentile(r.gemm_us, 0.5), " us"), r.bad_message,
           kernel_column(r)});
    requests += r.requests;
    rows += r.rows;
    elements += r.elements;
    mismatches += r.mismatches;
    scale_mismatches += r.scale_mismatches;
    problems += static_cast<int64_t>(r.problems.size());
  }
  t.print(stdout);
  for (const SchemeResult& r : results) {
    for (const std::string& pr : r.problems)
      std::printf("  %s: %s\n", r.scheme.c_str(), pr.c_str());
    for (const std::string& d : r.mismatch_detail) {
      std::printf("  %s: %s\n", r.scheme.c_str(), d.c_str());
    }
    if (r.mismatches + r.scale_mismatches > static_cast<int64_t>(r.mismatch_detail.size())) {
      std::printf(
          "  %s: ... %lld mismatching y elements and %lld rows with a mismatching sa/azp "
          "in all\n",
          r.scheme.c_str(), static_cast<long long>(r.mismatches),
          static_cast<long long>(r.scale_mismatches));
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (problems == 0 && mismatches == 0 && scale_mismatches == 0) {
    std::printf(
        "smoke: PASS (%zu schemes, %lld requests, %lld rows, %lld output elements bit-exact with "
        "the local reference; bad messages answered INVALID_ARGUMENT; %.1f s)\n",
        schemes.size(), static_cast<long long>(requests), static_cast<long long>(rows),
        static_cast<long long>(elements), seconds);
    return kExitOk;
  }
  std::printf(
      "smoke: FAIL (%lld of %lld output elements differ, %lld rows with a different "
      "sa/azp, %lld other problems; seed %lld)\n",
      static_cast<long long>(mismatches), static_cast<long long>(elements),
      static_cast<long long>(scale_mismatches), static_cast<long long>(problems),
      static_cast<long long>(seed));
  std::fflush(stdout);
  for (const SchemeResult& r : results) {
    if (!r.rpc_error.ok()) return fail(r.rpc_error);
  }
  return kExitFailure;
}

}  // namespace qlinear::cli
