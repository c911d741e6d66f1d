// infer: one request, unary or on a stream, with a readable summary of the output and metadata.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "common/npy.h"
#include "kernels/core/status.h"

namespace qlinear::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Re-encodes `count` values from one dtype to another (exact widening, or one RNE rounding).
std::string convert(const std::string& bytes, DType from, DType to, int64_t count) {
  if (from == to) return bytes;
  std::string out(static_cast<size_t>(count) * dtype_size(to), '\0');
  for (int64_t i = 0; i < count; ++i) {
    store_from_f32(out.data(), to, static_cast<size_t>(i),
                   load_as_f32(bytes.data(), from, static_cast<size_t>(i)));
  }
  return out;
}

struct Input {
  std::string x;
  DType dtype = DType::kBF16;
  int64_t m = 0;
  std::string source;
};

// x from --input (.npy float32/float16 [M, K] or [K], or raw bytes in --dtype), or random.
absl::Status make_input(const std::string& path, const std::string& dtype_arg, int64_t m_arg,
                        int64_t k, uint64_t seed, Input* in) {
  if (!dtype_arg.empty()) {
    auto t = parse_dtype(dtype_arg);
    if (!t.ok()) return t.status();
    in->dtype = core_dtype(*t);
  }
  if (path.empty()) {
    in->m = m_arg > 0 ? m_arg : 1;
    int64_t count = 0, bytes = 0;
    if (__builtin_mul_overflow(in->m, k, &count) ||
        __builtin_mul_overflow(count, static_cast<int64_t>(dtype_size(in->dtype)), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--m ", in->m, " rows of K=", k, " values are too many for one request"));
    }
    SplitMix64 rng(seed);
    in->x = random_activations(rng, in->m * k, in->dtype);
    in->source = absl::StrCat("random uniform [-1, 1), seed ", seed);
    return absl::OkStatus();
  }
  auto bytes = read_file(path);
  if (!bytes.ok()) return bytes.status();
  if (is_npy(*bytes)) {
    auto a = parse_npy(*bytes);
    if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", a.status().message()));
    DType file_dtype;
    if (a->dtype == NpyDType::kF4) {
      file_dtype = DType::kF32;
    } else if (a->dtype == NpyDType::kF2) {
      file_dtype = DType::kF16;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": activations must be float32 (<f4) or float16 (<f2), got ", npy_descr(a->dtype)));
    }
    const bool one_row = a->shape.size() == 1;
    if ((a->shape.size() != 2 && !one_row) || a->shape.back() != k) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has shape ", shape_string(a->shape),
                                                     "; the layer needs [M, ", k, "] or [", k,
                                                     "]"));
    }
    in->m = one_row ? 1 : a->shape[0];
    if (m_arg > 0 && m_arg != in->m) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " holds M=", in->m, " rows but --m says ", m_arg));
    }
    if (dtype_arg.empty()) in->dtype = file_dtype;
    in->x = convert(a->data, file_dtype, in->dtype, in->m * k);
    in->source = absl::StrCat(path, " (", npy_descr(a->dtype), " ", shape_string(a->shape),
                              file_dtype == in->dtype ? ")" : ", converted)");
    return absl::OkStatus();
  }
  // (Raw input comes with --dtype: cmd_infer checks it before any request.)
  const int64_t row_bytes = k * static_cast<int64_t>(dtype_size(in->dtype));
  const int64_t size = static_cast<int64_t>(bytes->size());
  if (size == 0 || size % row_bytes != 0 || (m_arg > 0 && size != m_arg * row_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a .npy file and its ", size, " bytes are not ",
        m_arg > 0 ? absl::StrCat(m_arg, " rows") : "a whole number of rows", " of K=", k, " ",
        dtype_name(in->dtype), " values (", row_bytes, " bytes per row); set --dtype and --m"));
  }
  in->m = size / row_bytes;
  in->x = std::move(*bytes);
  in->source = absl::StrCat(path, " (raw ", dtype_name(in->dtype), ")");
  return absl::OkStatus();
}

// A raw --input (not .npy) holds bytes of no known dtype: --dtype must say which, since another
// dtype of the same size would be read as wrong values without an error. Checked before any
// request, from the file's first bytes; a file that cannot be read is left to make_input.
absl::Status check_raw_input_has_dtype(const std::string& path, const std::string& dtype_arg) {
  if (path.empty() || !dtype_arg.empty()) return absl::OkStatus();
  std::ifstream in;
  if (!open_regular_file(path, &in).ok()) return absl::OkStatus();
  char head[8] = {};
  in.read(head, sizeof(head));
  if (is_npy(absl::string_view(head, static_cast<size_t>(in.gcount())))) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--input ", path, " is not a .npy file: raw activations need --dtype (bf16, fp16 or fp32)"));
}

// Whether y could be written to `path`: not a folder, in a folder that exists and can be written.
// Checked before the request is sent, so that a bad path costs no request.
absl::Status check_output_path(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("--output ", path, " is a folder"));
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--output ", path, ": cannot write in ", dir,
                                                   " (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

std::string fmt(float v) { return absl::StrFormat("%.6g", v); }

void print_values(const v1::InferResponse& r) {
  const DType t = core_dtype(r.y_dtype());
  const int64_t count = r.m() * r.n();
  double sum = 0;
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  int64_t finite = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float v = load_as_f32(r.y().data(), t, static_cast<size_t>(i));
    if (!std::isfinite(v)) continue;
    ++finite;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  std::string stats = finite > 0 ? absl::StrCat("min ", fmt(lo), "  max ", fmt(hi), "  mean ",
                                                fmt(static_cast<float>(sum / finite)))
                                 : "no finite values";
  if (finite < count) absl::StrAppend(&stats, "  (", count - finite, " non-finite)");
  std::printf("%-12s%s\n", "values", stats.c_str());
  std::vector<std::string> first;
  const int64_t shown = std::min<int64_t>(8, r.n());
  for (int64_t i = 0; i < shown; ++i) {
    first.push_back(fmt(load_as_f32(r.y().data(), t, static_cast<size_t>(i))));
  }
  std::printf("%-12s%s%s\n", absl::StrCat("y[0, :", shown, "]").c_str(),
              absl::StrJoin(first, " ").c_str(), shown < r.n() ? " ..." : "");
}

// y as .npy: fp32 -> <f4, fp16 -> <f2; bf16 has no .npy dtype and is widened (exactly) to <f4.
absl::Status write_output(const std::string& path, const v1::InferResponse& r) {
  NpyArray a;
  a.shape = {r.m(), r.n()};
  const DType t = core_dtype(r.y_dtype());
  if (t == DType::kBF16) {
    a.dtype = NpyDType::kF4;
    a.data = convert(r.y(), DType::kBF16, DType::kF32, r.m() * r.n());
  } else {
    a.dtype = t == DType::kF32 ? NpyDType::kF4 : NpyDType::kF2;
    a.data = r.y();
  }
  RETURN_IF_ERROR(write_npy_file(path, a));
  std::printf("%-12s%s (%s %s%s)\n", "output", path.c_str(),
              std::string(npy_descr(a.dtype)).c_str(), shape_string(a.shape).c_str(),
              t == DType::kBF16 ? "; bf16 widened exactly" : "");
  return absl::OkStatus();
}

}  // namespace

int cmd_infer(const CommandArgs& args) {
  std::string layer, dtype_arg, output_dtype_arg, input_path, forced_kernel, output_path;
  int64_t m = 0, seed = 1;
  bool explain = false, scales = false, stream = false;
  ArgParser p(
      "qlinear-cli infer --layer NAME [--m M] [options]",
      "Sends one request and prints the output's shape, min/max/mean and first values, the\n"
      "kernel that ran, the device and the server's timings. Without --input, x is random,\n"
      "uniform in [-1, 1) from --seed, in --dtype. --input takes a .npy file of float32 or\n"
      "float16 [M, K] (or [K] for one row; converted to --dtype when that is given) or raw\n"
      "little-endian bytes in --dtype, which raw input needs. --output writes y as .npy (bf16\n"
      "is widened to float32).");
  p.add("layer", &layer, "Layer to run");
  p.add("m", &m, "Rows (tokens); 0: 1 for random input, else from the file");
  p.add("dtype", &dtype_arg,
        "Activation dtype: bf16, fp16 or fp32 (random input: bf16; .npy input: the file's; raw "
        "input: required)");
  p.add("output-dtype", &output_dtype_arg, "Output dtype: bf16, fp16 or fp32 (default: --dtype)");
  p.add("input", &input_path, "Activations file: .npy, or raw bytes");
  p.add("seed", &seed, "Seed of the random activations");
  p.add("explain", &explain, "Show the kernel selection with every candidate's reason");
  p.add("scales", &scales, "Show the activation scales sa (and zero points azp)");
  p.add("forced-kernel", &forced_kernel, "Run on this kernel (an error if it cannot)");
  p.add("output", &output_path, "Write y to this .npy file");
  p.add("stream", &stream, "Send the request on an InferStream instead of a unary call");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;
  if (layer.empty()) return usage_error("--layer is required");
  if (m < 0) return usage_error("--m must be >= 1 (or 0: from the input)");
  v1::DType output_dtype = v1::DTYPE_UNSPECIFIED;
  if (!output_dtype_arg.empty()) {
    auto t = parse_dtype(output_dtype_arg);
    if (!t.ok()) return usage_error(t.status().message());
    output_dtype = *t;
  }
  if (!dtype_arg.empty()) {
    if (auto t = parse_dtype(dtype_arg); !t.ok()) return usage_error(t.status().message());
  }
  if (absl::Status s = check_raw_input_has_dtype(input_path, dtype_arg); !s.ok()) {
    return usage_error(s.message());
  }
  if (!output_path.empty()) {
    if (absl::Status s = check_output_path(output_path); !s.ok()) return usage_error(s.message());
  }

  auto client = make_client(args);
  auto info = client->describe_layer(layer);
  if (!info.ok()) return fail(info.status());
  Input in;
  if (absl::Status s =
          make_input(input_path, dtype_arg, m, info->k(), static_cast<uint64_t>(seed), &in);
      !s.ok()) {
    return fail(s);
  }

  v1::InferRequest req;
  req.set_layer(layer);
  req.set_request_id(absl::StrCat("qlinear-cli-", getpid()));
  req.set_x_dtype(proto_dtype(in.dtype));
  req.set_m(in.m);
  req.set_x(std::move(in.x));
  req.set_output_dtype(output_dtype);
  req.set_forced_kernel(forced_kernel);
  req.set_explain(explain);
  req.set_return_scales(scales);

  v1::InferResponse resp;
  const auto start = Clock::now();
  if (stream) {
    auto s = client->open_stream(args.timeout);
    const bool sent = s->write(req);
    s->writes_done();
    const bool got = sent && s->read(&resp);
    v1::InferResponse extra;
    while (got && s->read(&extra)) {
    }
    absl::Status st = s->finish();
    if (!st.ok()) return fail(st);
    if (!got) return fail(absl::UnavailableError("the stream ended without a response"));
    if (resp.status_code() != 0) {
      return fail(
          absl::Status(static_cast<absl::StatusCode>(resp.status_code()), resp.status_message()));
    }
  } else {
    auto r = client->infer(req);
    if (!r.ok()) return fail(r.status());
    resp = *std::move(r);
  }
  const double client_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  // What is printed and saved is read from y by m x n: an answer that does not hold what it says
  // (or not what was asked of the layer described) is reported, never read past its end.
  const DType yt = core_dtype(resp.y_dtype());
  const bool y_type_known = resp.y_dtype() == v1::DTYPE_FP32 || resp.y_dtype() == v1::DTYPE_FP16 ||
                            resp.y_dtype() == v1::DTYPE_BF16;
  if (!y_type_known || resp.m() != in.m || resp.n() != info->n() ||
      resp.y().size() != static_cast<size_t>(in.m * info->n()) * dtype_size(yt)) {
    return fail(absl::InternalError(
        absl::StrCat("the server's answer does not fit the request: y of ", resp.y().size(),
                     " bytes for [", resp.m(), ", ", resp.n(), "] ", dtype_cli_name(resp.y_dtype()),
                     ", where [", in.m, ", ", info->n(), "] was asked of layer '", layer, "'")));
  }

  const v1::InferMetadata& md = resp.metadata();
  std::printf("%-12s[%lld, %lld] %s  from x [%lld, %lld] %s on layer '%s'\n", "y",
              static_cast<long long>(resp.m()), static_cast<long long>(resp.n()),
              dtype_cli_name(resp.y_dtype()).c_str(), static_cast<long long>(in.m),
              static_cast<long long>(info->k()), dtype_cli_name(req.x_dtype()).c_str(),
              layer.c_str());
  std::printf("%-12s%s\n", "input", in.source.c_str());
  print_values(resp);
  std::printf("%-12s%s on %s\n", "kernel", md.kernel().c_str(), md.device().c_str());
  const v1::Timings& t = md.timings();
  std::printf(
      "%-12squeue %lld us, quantize %lld us, gemm %lld us, host copies %lld us, server total "
      "%lld us; client round trip %.2f ms (%s)\n",
      "timings", static_cast<long long>(t.queue_us()), static_cast<long long>(t.quantize_us()),
      static_cast<long long>(t.gemm_us()), static_cast<long long>(t.copy_us()),
      static_cast<long long>(t.total_us()), client_ms, stream ? "stream" : "unary");
  std::printf("%-12s%d request(s), %lld rows\n", "batch", md.batch_requests(),
              static_cast<long long>(md.batch_rows()));
  if (md.selection_size() > 0) {
    std::printf("%-12s%s\n", "selection", selection_summary(md.selection()).c_str());
    if (explain) print_selection(md.selection(), "  ");
  }
  if (scales) {
    auto list = [](const auto& values) {
      std::vector<std::string> parts;
      for (int i = 0; i < values.size() && i < 16; ++i) parts.push_back(absl::StrCat(values[i]));
      return absl::StrCat("[", absl::StrJoin(parts, ", "), values.size() > 16 ? ", ..." : "", "] (",
                          values.size(), " values)");
    };
    std::printf("%-12s%s\n", "sa", list(md.sa()).c_str());
    if (md.azp_size() > 0) std::printf("%-12s%s\n", "azp", list(md.azp()).c_str());
  }
  if (!output_path.empty()) {
    if (absl::Status s = write_output(output_path, resp); !s.ok()) return fail(s);
  }
  return kExitOk;
}

}  // namespace qlinear::cli
