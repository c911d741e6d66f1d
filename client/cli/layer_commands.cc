// load and unload.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "common/layer_manifest.h"
#include "common/npy.h"
#include "common/random.h"

namespace qlinear::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Weights from --weights: an int8 .npy [N, K], or raw int8 bytes whose shape --n/--k give. The
// file is read once and its data copied once, into `w` (a .npy file is viewed, not parsed into a
// copy of its own): weights of many GiB are held twice at most, while they are copied.
absl::Status read_weights(const std::string& path, int64_t* n, int64_t* k, std::vector<int8_t>* w) {
  auto bytes = read_file(path);
  if (!bytes.ok()) return bytes.status();
  if (is_npy(*bytes)) {
    auto a = view_npy(*bytes);
    if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", a.status().message()));
    if (a->dtype != NpyDType::kI1 || a->shape.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weights must be int8 (|i1) of shape [N, K], got ",
                       npy_descr(a->dtype), " ", shape_string(a->shape)));
    }
    if ((*n != 0 && *n != a->shape[0]) || (*k != 0 && *k != a->shape[1])) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has shape ", shape_string(a->shape),
                                                     " but --n/--k say [", *n, ", ", *k, "]"));
    }
    *n = a->shape[0];
    *k = a->shape[1];
    w->assign(a->data.begin(), a->data.end());
    return absl::OkStatus();
  }
  if (*n <= 0 || *k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a .npy file; raw int8 weights need --n and --k"));
  }
  int64_t need = 0;
  if (__builtin_mul_overflow(*n, *k, &need)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--n ", *n, " x --k ", *k, " is too large for raw int8 weights"));
  }
  if (static_cast<int64_t>(bytes->size()) != need) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " has ", bytes->size(), " bytes; raw int8 weights [", *n, ", ", *k, "] need ", need));
  }
  w->assign(bytes->begin(), bytes->end());
  return absl::OkStatus();
}

v1::Tensor f32_tensor(const std::vector<float>& v, std::vector<int64_t> shape) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FP32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return t;
}

// `--bias` is both a switch (random layers: --bias / --no-bias) and a file option
// (--bias FILE); rewrite the switch forms to --bias=on / --bias=off before parsing.
std::vector<std::string> rewrite_bias_switch(const CommandArgs& args) {
  std::vector<std::string> out;
  for (int i = 0; i < args.argc; ++i) {
    const std::string a = args.argv[i];
    if (i >= args.first && a == "--no-bias") {
      out.push_back("--bias=off");
    } else if (i >= args.first && a == "--bias" &&
               (i + 1 >= args.argc || args.argv[i + 1][0] == '-')) {
      out.push_back("--bias=on");
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// load --manifest: uploads every layer of the manifest in its order, a line each; the first that
// fails stops it, with how many were uploaded before it.
int load_manifest(const CommandArgs& args, const std::string& path, bool replace,
                  const ClientOptions& options) {
  absl::StatusOr<std::vector<ManifestLayer>> layers = read_layer_manifest(path);
  if (!layers.ok()) return fail(layers.status());
  auto client = make_client(args, options);
  const auto start = Clock::now();
  int64_t bytes = 0;
  SafetensorsHeaderCache headers;  // each file's header parsed once for all its layers
  // Ctrl-C stops the upload under way, then says what loaded; while the server builds a layer
  // it ends the CLI (that layer not loaded, the lines above say which were).
  const CatchSigint sigint;
  for (size_t i = 0; i < layers->size(); ++i) {
    const ManifestLayer& l = (*layers)[i];
    auto failed = [&](const absl::Status& s) {
      return fail(absl::Status(
          s.code(), absl::StrCat(path, ": ", l.describe(), ": ", s.message(), " (", i, " of ",
                                 layers->size(), " layers uploaded before it)")));
    };
    if (sigint_received()) {
      return failed(absl::CancelledError("interrupted (Ctrl-C) before its upload began"));
    }
    v1::LayerHeader h;
    std::vector<int8_t> weights;
    if (absl::Status s = read_manifest_layer(l, &h, &weights, &headers); !s.ok()) return failed(s);
    h.set_replace(replace);
    auto resp = upload_with_progress(*client, std::move(h), weights, /*end_while_built=*/true);
    if (!resp.ok()) {
      return failed(sigint_received() && resp.status().code() == absl::StatusCode::kCancelled
                        ? absl::CancelledError(absl::StrCat(
                              "interrupted (Ctrl-C) while uploading it; nothing of it was ",
                              replace ? "loaded or replaced" : "loaded"))
                        : resp.status());
    }
    bytes += static_cast<int64_t>(weights.size());
    const v1::LayerInfo& info = resp->layer();
    std::printf("[%zu/%zu] %s layer '%s' N=%lld K=%lld %s on %s in %.1f ms\n", i + 1,
                layers->size(), resp->replaced() ? "replaced" : "loaded", info.name().c_str(),
                static_cast<long long>(info.n()), static_cast<long long>(info.k()),
                scheme_cli_name(info.scheme()).c_str(), info.device().c_str(),
                resp->load_time_us() / 1000.0);
  }
  std::printf("uploaded %zu layer%s (%s of weights) from %s in %.1f s\n", layers->size(),
              layers->size() == 1 ? "" : "s", human_bytes(bytes).c_str(), path.c_str(),
              seconds_since(start));
  return kExitOk;
}

}  // namespace

int cmd_load(const CommandArgs& raw_args) {
  std::vector<std::string> storage = rewrite_bias_switch(raw_args);
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  CommandArgs args = raw_args;
  args.argv = argv.data();

  std::string name, scheme_arg = "dynamic_symmetric", bias_arg, input_scale_arg, zero_point_arg;
  std::string widths_arg, weights_path, scale_path, forced_kernel, manifest_path;
  int64_t n = 0, k = 0, seed = 1, max_batch_rows = -1, max_queue_delay_us = -1;
  bool per_tensor_scale = false, replace = false;
  double chunk_mb = 1;
  ArgParser p(
      "qlinear-cli load --name NAME [--n N --k K] [options]\n"
      "       qlinear-cli load --manifest FILE [--replace]",
      "Uploads a layer. Without --weights the layer is random: int8 weights, per-channel scales\n"
      "in [0.5e-3, 2e-3) and a bias in [-1, 1), all drawn from --seed. From a checkpoint:\n"
      "--weights (.npy int8 [N, K], or raw int8 bytes with --n and --k) with --weight-scale\n"
      "(.npy float32/float16 of shape [N], [N,1], [1,N], [1], [] or one value per logical\n"
      "width) and optionally --bias FILE (.npy float32/float16 [N]).\n"
      "Bare --bias / --no-bias turn the random bias on or off (on for random layers, off when\n"
      "--weights is given). Static schemes need --input-scale, static_asymmetric also\n"
      "--input-zero-point. Uploads over 4 MiB show a progress line on stderr (on a terminal);\n"
      "Ctrl-C stops an upload, or ends the CLI while the server builds the layer, and the\n"
      "server keeps nothing of it. Prints the\n"
      "layer's device, load time and kernel per M bucket.\n"
      "--manifest FILE uploads every layer of a layer manifest (the JSON file that\n"
      "qlinear-server --layer-manifest loads; see the README) in its order, a line each, and\n"
      "stops at the first that fails or at Ctrl-C, saying how many layers were uploaded.");
  p.add("name", &name, "Layer name ([A-Za-z0-9_.:/-], up to 128 characters)");
  p.add("n", &n, "Output features N (0: from --weights, else 1024)");
  p.add("k", &k, "Input features K (0: from --weights, else 1024)");
  p.add("scheme", &scheme_arg,
        "dynamic_symmetric, static_symmetric, dynamic_asymmetric or static_asymmetric");
  p.add("bias", &bias_arg, "Bias .npy file [N]; or bare --bias / --no-bias for the random bias");
  p.add("seed", &seed, "Seed of the random weights, scales and bias");
  p.add("input-scale", &input_scale_arg, "Static input scale (static schemes)");
  p.add("input-zero-point", &zero_point_arg, "Static input zero point (static_asymmetric)");
  p.add("logical-widths", &widths_arg,
        "Partition widths of a fused layer, e.g. 4096,1024,1024 (random scales: one per width)");
  p.add("per-tensor-scale", &per_tensor_scale, "Random layers: one weight scale [1]");
  p.add("weights", &weights_path, "Weights file: .npy int8 [N, K], or raw int8 bytes");
  p.add("weight-scale", &scale_path, "Weight scale .npy file (float32 or float16)");
  p.add("replace", &replace, "Replace a layer of the same name atomically");
  p.add("forced-kernel", &forced_kernel, "Run every request of this layer on this kernel");
  p.add("chunk-mb", &chunk_mb,
        "Upload chunk size in MiB, at most --max-message-mb; each chunk is sent 64 bytes short "
        "of it, for its message's framing (the default fits a server's --max-message-mb 1)");
  p.add("max-batch-rows", &max_batch_rows,
        "Dynamic batching: most rows per GEMM for this layer (1: off; -1: the server's default)");
  p.add("max-queue-delay-us", &max_queue_delay_us,
        "Dynamic batching: how long a request may wait for company (-1: the server's default)");
  p.add("manifest", &manifest_path,
        "Upload every layer of this layer manifest (with --replace and --chunk-mb only)");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;

  // A chunk travels in one message, which the client keeps under its --max-message-mb (and the
  // server under its own): a chunk is sent short of --chunk-mb by the message's framing.
  if (!(chunk_mb > 0 && chunk_mb <= args.max_message_mb)) {
    return usage_error(absl::StrCat("--chunk-mb must be in (0, ", args.max_message_mb,
                                    "]: a chunk is one message of at most --max-message-mb ",
                                    args.max_message_mb, " MiB"));
  }
  ClientOptions options;
  options.upload_chunk_bytes =
      std::max<int64_t>(1, static_cast<int64_t>(chunk_mb * (1 << 20)) - kChunkFramingBytes);
  if (!manifest_path.empty()) {
    if (!name.empty() || n != 0 || k != 0 || scheme_arg != "dynamic_symmetric" ||
        !bias_arg.empty() || seed != 1 || !input_scale_arg.empty() || !zero_point_arg.empty() ||
        !widths_arg.empty() || per_tensor_scale || !weights_path.empty() || !scale_path.empty() ||
        !forced_kernel.empty() || max_batch_rows != -1 || max_queue_delay_us != -1) {
      return usage_error(
          "--manifest takes every layer's settings from the file; it goes with --replace and "
          "--chunk-mb only");
    }
    return load_manifest(args, manifest_path, replace, options);
  }

  if (name.empty()) return usage_error("--name is required (or --manifest FILE)");
  auto scheme = parse_scheme(scheme_arg);
  if (!scheme.ok()) return usage_error(scheme.status().message());
  if (n < 0 || k < 0) return usage_error("--n and --k must be positive");
  if (max_batch_rows < -1 || max_queue_delay_us < -1) {
    return usage_error(
        "--max-batch-rows and --max-queue-delay-us must be >= -1 (-1: the server's default)");
  }
  std::vector<int64_t> widths;
  for (absl::string_view w : absl::StrSplit(widths_arg, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(w, &v) || v <= 0) {
      return usage_error(absl::StrCat("--logical-widths: '", w, "' is not a positive integer"));
    }
    widths.push_back(v);
  }
  if (per_tensor_scale && !widths.empty()) {
    return usage_error(
        "--per-tensor-scale and --logical-widths give different scale shapes; "
        "pick one");
  }

  v1::LayerHeader h;
  h.set_name(name);
  h.set_scheme(*scheme);
  h.set_forced_kernel(forced_kernel);
  h.set_replace(replace);
  if (max_batch_rows >= 0) h.set_max_batch_rows(max_batch_rows);
  if (max_queue_delay_us >= 0) h.set_max_queue_delay_us(max_queue_delay_us);
  for (int64_t w : widths) h.add_logical_widths(w);
  if (!input_scale_arg.empty()) {
    double v = 0;
    if (!absl::SimpleAtod(input_scale_arg, &v)) {
      return usage_error(absl::StrCat("--input-scale takes a number, got '", input_scale_arg, "'"));
    }
    if (!std::isfinite(v)) {
      return usage_error(
          absl::StrCat("--input-scale takes a finite number, got '", input_scale_arg, "'"));
    }
    const std::optional<float> f = exact_float32(v);
    if (!f.has_value()) {
      return usage_error(
          absl::StrCat("--input-scale ", input_scale_arg, " is out of the range of a float32"));
    }
    h.set_input_scale(*f);
  }
  if (!zero_point_arg.empty()) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(zero_point_arg, &v)) {
      return usage_error(
          absl::StrCat("--input-zero-point takes an integer, got '", zero_point_arg, "'"));
    }
    h.set_input_zero_point(v);
  }

  // Random pieces are drawn in a fixed order: weights (unless read from a file), scales, bias.
  SplitMix64 rng(static_cast<uint64_t>(seed));
  std::vector<int8_t> weights;
  if (!weights_path.empty()) {
    if (scale_path.empty()) {
      return usage_error("--weights needs --weight-scale (the checkpoint's weight scale)");
    }
    if (absl::Status s = read_weights(weights_path, &n, &k, &weights); !s.ok()) return fail(s);
  } else {
    if (n == 0) n = 1024;
    if (k == 0) k = 1024;
    // (By division: n * k itself may overflow.)
    if (n > (int64_t{1} << 34) / k) return usage_error("random layers are limited to 16 GiB");
  }
  if (weights_path.empty()) weights = random_int8(rng, static_cast<size_t>(n * k));
  h.set_n(n);
  h.set_k(k);

  const int64_t scale_count = per_tensor_scale ? 1
                              : widths.empty() ? n
                                               : static_cast<int64_t>(widths.size());
  std::vector<float> random_sb =
      random_floats(rng, static_cast<size_t>(scale_count), 0.5e-3f, 2e-3f);
  if (!scale_path.empty()) {
    auto t = read_float_tensor_npy(scale_path, "the weight scale");
    if (!t.ok()) return fail(t.status());
    *h.mutable_weight_scale() = *std::move(t);
  } else {
    *h.mutable_weight_scale() = f32_tensor(random_sb, {scale_count});
  }

  std::vector<float> random_bias = random_floats(rng, static_cast<size_t>(n), -1.f, 1.f);
  if (bias_arg.empty()) bias_arg = weights_path.empty() ? "on" : "off";
  if (bias_arg == "on" || bias_arg == "true") {
    *h.mutable_bias() = f32_tensor(random_bias, {n});
  } else if (bias_arg != "off" && bias_arg != "false") {
    auto t = read_float_tensor_npy(bias_arg, "the bias");
    if (!t.ok()) return fail(t.status());
    if (absl::Status s = check_bias_not_empty(*t, bias_arg, n); !s.ok()) return fail(s);
    *h.mutable_bias() = *std::move(t);
  }

  auto client = make_client(args, options);
  // Ctrl-C stops the upload (CANCELLED, nothing loaded), and ends the CLI while the server builds
  // the layer (its call cancelled, the server keeps nothing).
  const CatchSigint sigint;
  const auto start = Clock::now();
  auto resp = upload_with_progress(*client, std::move(h), weights, /*end_while_built=*/true);
  const double client_s = seconds_since(start);
  if (!resp.ok()) {
    if (sigint_received() && resp.status().code() == absl::StatusCode::kCancelled) {
      return fail(absl::CancelledError(absl::StrCat("interrupted (Ctrl-C) while uploading layer '",
                                                    name, "'; nothing was ",
                                                    replace ? "loaded or replaced" : "loaded")));
    }
    return fail(resp.status());
  }

  const v1::LayerInfo& l = resp->layer();
  std::printf("%s layer '%s'\n", resp->replaced() ? "replaced" : "loaded", l.name().c_str());
  auto row = [](const char* key, const std::string& value) {
    std::printf("  %-11s%s\n", key, value.c_str());
  };
  row("shape", absl::StrCat("N=", l.n(), " K=", l.k(),
                            l.logical_widths().empty()
                                ? ""
                                : absl::StrCat(" (logical widths ",
                                               absl::StrJoin(l.logical_widths(), ","), ")")));
  row("scheme",
      absl::StrCat(scheme_cli_name(l.scheme()), l.has_bias() ? ", with bias" : ", no bias"));
  row("device", l.device());
  row("bytes", absl::StrCat(human_bytes(l.weight_bytes()), " weights, ",
                            human_bytes(l.total_bytes()), " held"));
  row("load time", absl::StrFormat("%.1f ms on the server, %.1f ms upload and load",
                                   resp->load_time_us() / 1000.0, client_s * 1000.0));
  row("batching", absl::StrCat("up to ", l.max_batch_rows(), " rows per GEMM",
                               l.max_batch_rows() <= 1 ? " (off)" : "", ", up to ",
                               l.max_queue_delay_us(), " us waiting for company"));
  if (!l.forced_kernel().empty()) row("forced", l.forced_kernel());
  std::printf("  kernel per M bucket:\n");
  for (const v1::BucketChoice& b : l.buckets()) {
    std::printf("    M %-10s %s\n", m_range(b.m_min(), b.m_max()).c_str(),
                b.kernel().empty() ? "none" : b.kernel().c_str());
  }
  return kExitOk;
}

int cmd_unload(const CommandArgs& args) {
  ArgParser p("qlinear-cli unload NAME", "Removes a layer.");
  if (int rc = parse_command_line(p, args, {"NAME"}); rc >= 0) return rc;
  auto client = make_client(args);
  if (absl::Status s = client->unload_layer(p.positional()[0]); !s.ok()) return fail(s);
  std::printf("unloaded layer '%s'\n", p.positional()[0].c_str());
  return kExitOk;
}

}  // namespace qlinear::cli
