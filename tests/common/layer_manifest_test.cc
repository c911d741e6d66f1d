// The layer manifest: parsing (every key, defaults, paths, and each error by code and message)
// and reading an entry's .npy files.
#include "common/layer_manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/npy.h"
#include "common/safetensors.h"

namespace qlinear {
namespace {

using ::testing::HasSubstr;

absl::Status parse_error(const std::string& json) {
  return parse_layer_manifest(json, "/m").status();
}

TEST(LayerManifestTest, ReadsEveryKeyAndResolvesPaths) {
  auto layers = parse_layer_manifest(R"({"layers": [
    {"name": "model.layers.0/qkv", "weights": "w.npy", "weight_scale": "sub/s.npy",
     "bias": "/abs/b.npy", "scheme": "static_asymmetric", "input_scale": 0.25,
     "input_zero_point": -3, "logical_widths": [64, 16, 16], "forced_kernel": "cpu.reference",
     "weight_sha256": "AB12", "max_batch_rows": 8, "max_queue_delay_us": 250},
    {"name": "o", "weights": "o.npy", "weight_scale": "o_s.npy"}
  ]})",
                                     "/models/llama/");
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 2u);
  const ManifestLayer& a = (*layers)[0];
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(a.describe(), "layer 'model.layers.0/qkv' (layers[0])");
  EXPECT_EQ(a.weights.path, "/models/llama/w.npy");
  EXPECT_EQ(a.weight_scale.path, "/models/llama/sub/s.npy");
  EXPECT_EQ(a.bias.path, "/abs/b.npy");
  const v1::LayerHeader& h = a.header;
  EXPECT_EQ(h.name(), "model.layers.0/qkv");
  EXPECT_EQ(h.scheme(), v1::SCHEME_STATIC_ASYMMETRIC);
  ASSERT_TRUE(h.has_input_scale());
  EXPECT_EQ(h.input_scale(), 0.25f);
  ASSERT_TRUE(h.has_input_zero_point());
  EXPECT_EQ(h.input_zero_point(), -3);
  EXPECT_THAT(std::vector<int64_t>(h.logical_widths().begin(), h.logical_widths().end()),
              ::testing::ElementsAre(64, 16, 16));
  EXPECT_EQ(h.forced_kernel(), "cpu.reference");
  EXPECT_EQ(h.weight_sha256(), "AB12");
  ASSERT_TRUE(h.has_max_batch_rows());
  EXPECT_EQ(h.max_batch_rows(), 8);
  ASSERT_TRUE(h.has_max_queue_delay_us());
  EXPECT_EQ(h.max_queue_delay_us(), 250);
  EXPECT_FALSE(h.replace());

  // The defaults: dynamic symmetric, no bias, nothing static, the server's batching.
  const ManifestLayer& b = (*layers)[1];
  EXPECT_EQ(b.index, 1);
  EXPECT_EQ(b.bias.path, "");
  EXPECT_EQ(b.header.scheme(), v1::SCHEME_DYNAMIC_SYMMETRIC);
  EXPECT_FALSE(b.header.has_input_scale());
  EXPECT_FALSE(b.header.has_input_zero_point());
  EXPECT_FALSE(b.header.has_max_batch_rows());
  EXPECT_FALSE(b.header.has_max_queue_delay_us());
  EXPECT_TRUE(b.header.forced_kernel().empty());

  // Without a folder, relative paths stay relative (to the working directory).
  auto here = parse_layer_manifest(R"({"layers": [{"name": "x", "weights": "w.npy",
                                       "weight_scale": "s.npy"}]})",
                                   "");
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_EQ((*here)[0].weights.path, "w.npy");
  // No layers at all is a manifest too.
  auto none = parse_layer_manifest(R"({"layers": []})", "/m");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(LayerManifestTest, EachMistakeIsNamedWithItsEntry) {
  struct Case {
    std::string json, message;
  };
  const std::string ok_files = R"("weights": "w.npy", "weight_scale": "s.npy")";
  const Case cases[] = {
      {R"({"layers": [)", "not valid JSON: parse error at line 1, column 13"},
      {R"({"layers": [], "x": 1e400})", "not valid JSON: number overflow parsing '1e400'"},
      {R"({"layers": [], "layers": []})", "the key \"layers\" is given twice"},
      // Nesting that deep would cost memory that grows with the square of the depth.
      {R"({"layers": [], "x": )" + std::string(100000, '[') + std::string(100000, ']') + "}",
       "nested more than 16 levels deep"},
      {R"({"layers": [], "x": )" + std::string(16, '[') + std::string(16, ']') + "}",
       "nested more than 16 levels deep"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(}, {"name": "b", "name": "c", )" + ok_files +
           "}]}",
       "layers[1]: the key \"name\" is given twice"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "weights": "v.npy"}]})",
       "layers[0]: the key \"weights\" is given twice"},
      {R"({"layers": [{"name": "bad name!", )" + ok_files + "}]}",
       "layers[0]: layer name 'bad name!' has characters outside [A-Za-z0-9_.:/-]"},
      {R"({"layers": [{"name": ")" + std::string(129, 'n') + R"(", )" + ok_files + "}]}",
       "layers[0]: layer name is 129 characters long; the limit is 128"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "bias": ""}]})",
       "layer 'a' (layers[0]): \"bias\" is an empty path (leave the key out for none)"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "input_scale": 1e39}]})",
       "layer 'a' (layers[0]): \"input_scale\" 1e+39 is out of the range of a float32"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "input_scale": 1e-50}]})",
       "layer 'a' (layers[0]): \"input_scale\" 1e-50 is out of the range of a float32"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "max_batch_rows": 64.0}]})",
       "layer 'a' (layers[0]): \"max_batch_rows\" must be an integer, got a number (64.0)"},
      {R"([1, 2])", "must be an object with a \"layers\" array, got an array"},
      {R"({"layers": [], "extra": 1})",
       "unknown key \"extra\"; the manifest holds \"layers\" only"},
      {R"({"layer": []})", "unknown key \"layer\""},
      {R"({})", "must have a \"layers\" array"},
      {R"({"layers": {}})", "must have a \"layers\" array"},
      {R"({"layers": [7]})", "layers[0] must be an object, got an integer"},
      {R"({"layers": [{)" + ok_files + "}]}",
       "layers[0]: \"name\" is required and must be a non-empty string"},
      {R"({"layers": [{"name": 5, )" + ok_files + "}]}",
       "layers[0]: \"name\" is required and must be a non-empty string"},
      {R"({"layers": [{"name": "a", "weight_scale": "s.npy"}]})",
       "layer 'a' (layers[0]): \"weights\" and \"weight_scale\" are required (.npy files or "
       "safetensors tensors)"},
      {R"({"layers": [{"name": "a", "weights": "w.npy"}]})",
       "layer 'a' (layers[0]): \"weights\" and \"weight_scale\" are required"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "bais": "b.npy"}]})",
       "layer 'a' (layers[0]): unknown key \"bais\"; the keys are name, weights, weight_scale, "
       "bias, scheme,"},
      {R"({"layers": [{"name": "a", "weights": 3, "weight_scale": "s.npy"}]})",
       "layer 'a' (layers[0]): \"weights\" must be the path of a .npy file or {\"file\": "
       "\"F.safetensors\", \"tensor\": \"T\"}, or an array of them, got an integer"},
      {R"({"layers": [{"name": "a", "weights": {"file": "m.safetensors"}, "weight_scale": "s.npy"}]})",
       "layer 'a' (layers[0]): \"weights\" must be the path of a .npy file or {\"file\": "
       "\"F.safetensors\", \"tensor\": \"T\"}, or an array of them; both keys are required"},
      {R"({"layers": [{"name": "a", "weights": {"file": "m.safetensors", "tensr": "w"},
           "weight_scale": "s.npy"}]})",
       "; \"tensr\" is not one of them or not a non-empty string"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "scheme": "int8"}]})",
       "layer 'a' (layers[0]): unknown scheme 'int8'; expected dynamic_symmetric, "
       "static_symmetric, dynamic_asymmetric or static_asymmetric"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "input_scale": "0.1"}]})",
       "layer 'a' (layers[0]): \"input_scale\" must be a number or {\"file\": ..., \"tensor\": "
       "...}, got a string"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "input_zero_point": 1.5}]})",
       "layer 'a' (layers[0]): \"input_zero_point\" must be an integer, got a number"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "input_zero_point": 3000000000}]})",
       "layer 'a' (layers[0]): \"input_zero_point\" must be in -2147483648..2147483647, got "
       "3000000000"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "max_batch_rows": 0}]})",
       "layer 'a' (layers[0]): \"max_batch_rows\" must be in 1..9223372036854775807, got 0"},
      {R"({"layers": [{"name": "a", )" + ok_files +
           R"(, "max_batch_rows": 18446744073709551615}]})",
       "layer 'a' (layers[0]): \"max_batch_rows\" is out of range"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "max_queue_delay_us": 10000001}]})",
       "layer 'a' (layers[0]): \"max_queue_delay_us\" must be in 0..10000000, got 10000001"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "logical_widths": 4}]})",
       "layer 'a' (layers[0]): \"logical_widths\" must be an array of positive integers, got an "
       "integer"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "logical_widths": [4, 0]}]})",
       "layer 'a' (layers[0]): \"logical_widths\" must hold positive integers, got 0"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "logical_widths": [4, "8"]}]})",
       "layer 'a' (layers[0]): \"logical_widths\" must hold positive integers, got a string"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(, "forced_kernel": null}]})",
       "layer 'a' (layers[0]): \"forced_kernel\" must be a string, got null"},
      {R"({"layers": [{"name": "a", )" + ok_files + R"(}, {"name": "b", )" + ok_files +
           R"(}, {"name": "a", )" + ok_files + "}]}",
       "layer 'a' is named twice (layers[0] and layers[2])"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    const absl::Status s = parse_error(c.json);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

class ManifestFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/qlinear_manifest_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : files_) unlink(f.c_str());
    rmdir(dir_.c_str());
  }
  std::string path(const std::string& name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }
  void save(const std::string& name, NpyDType dtype, std::vector<int64_t> shape,
            const std::string& data) {
    NpyArray a;
    a.dtype = dtype;
    a.shape = std::move(shape);
    a.data = data;
    ASSERT_TRUE(write_npy_file(path(name), a).ok());
  }
  // Writes `bytes` to the file `name` in the test's folder; returns its path.
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = path(name);
    FILE* f = fopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    if (f != nullptr) {
      fwrite(bytes.data(), 1, bytes.size(), f);
      fclose(f);
    }
    return p;
  }
  static std::string floats(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(ManifestFilesTest, ReadsTheWeightsScalesAndBias) {
  const std::string w = {1, -2, 3, -4, 5, -6};
  save("w.npy", NpyDType::kI1, {2, 3}, w);
  save("s.npy", NpyDType::kF4, {2, 1}, floats({0.5f, 0.25f}));
  save("b.npy", NpyDType::kF2, {2}, std::string("\x00\x3c\x00\xc0", 4));  // 1, -2 in fp16
  const std::string manifest = path("m.json");
  {
    FILE* f = fopen(manifest.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(R"({"layers": [{"name": "q", "weights": "w.npy", "weight_scale": "s.npy",
                          "bias": "b.npy", "forced_kernel": "cpu.reference"},
                         {"name": "r", "weights": "w.npy", "weight_scale": "w.npy"},
                         {"name": "s", "weights": "s.npy", "weight_scale": "s.npy"},
                         {"name": "t", "weights": "missing.npy", "weight_scale": "s.npy"}]})",
          f);
    fclose(f);
  }
  auto layers = read_layer_manifest(manifest);
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 4u);

  v1::LayerHeader h;
  std::vector<int8_t> weights;
  ASSERT_TRUE(read_manifest_layer((*layers)[0], &h, &weights).ok());
  EXPECT_EQ(h.name(), "q");
  EXPECT_EQ(h.n(), 2);
  EXPECT_EQ(h.k(), 3);
  EXPECT_EQ(h.forced_kernel(), "cpu.reference");
  EXPECT_EQ(std::string(weights.begin(), weights.end()), w);
  EXPECT_EQ(h.weight_scale().dtype(), v1::DTYPE_FP32);
  EXPECT_THAT(
      std::vector<int64_t>(h.weight_scale().shape().begin(), h.weight_scale().shape().end()),
      ::testing::ElementsAre(2, 1));
  EXPECT_EQ(h.weight_scale().data(), floats({0.5f, 0.25f}));
  EXPECT_EQ(h.bias().dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(h.bias().data(), std::string("\x00\x3c\x00\xc0", 4));

  // Each file's mistake, with the file named.
  absl::Status s = read_manifest_layer((*layers)[1], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            dir_ + "/w.npy: weight_scale must be float32 (<f4) or float16 (<f2), got |i1");
  s = read_manifest_layer((*layers)[2], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            dir_ + "/s.npy: weights must be int8 (|i1) of shape [N, K], got <f4 [2, 1]");
  s = read_manifest_layer((*layers)[3], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir_ + "/missing.npy"));

  // A manifest that is not there, or not JSON, is named by its path.
  s = read_layer_manifest(dir_ + "/nothing.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir_ + "/nothing.json"));
  s = read_layer_manifest(dir_ + "/w.npy").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir_ + "/w.npy: not valid JSON: "));
  s = read_layer_manifest(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir_ + " is not a regular file");
}

// A FIFO is refused without being opened (opening one blocks until something writes to it), and a
// bias file that holds no values is a mistake, not a layer without a bias.
TEST_F(ManifestFilesTest, AFifoAndAnEmptyBiasAreRefused) {
  const std::string fifo = path("f.json");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::Status s = read_layer_manifest(fifo).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), fifo + " is not a regular file");

  save("w.npy", NpyDType::kI1, {2, 3}, std::string{1, -2, 3, -4, 5, -6});
  save("s.npy", NpyDType::kF4, {2}, floats({0.5f, 0.25f}));
  save("b0.npy", NpyDType::kF4, {0}, "");
  const std::string manifest = write("m.json", R"({"layers": [
      {"name": "q", "weights": "w.npy", "weight_scale": "s.npy", "bias": "b0.npy"},
      {"name": "r", "weights": "f.json", "weight_scale": "s.npy"}]})");
  auto layers = read_layer_manifest(manifest);
  ASSERT_TRUE(layers.ok()) << layers.status();
  v1::LayerHeader h;
  std::vector<int8_t> weights;
  s = read_manifest_layer((*layers)[0], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir_ + "/b0.npy: bias has 0 values, expected n=2");
  s = read_manifest_layer((*layers)[1], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(fifo + " is not a regular file"));
}

// A safetensors file of `tensors` (name, dtype, shape, bytes) in the order given.
std::string safetensors_bytes(
    const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, std::string>>&
        tensors) {
  std::string header = "{", data;
  for (const auto& [name, dtype, shape, bytes] : tensors) {
    std::string dims;
    for (size_t i = 0; i < shape.size(); ++i) dims += (i ? "," : "") + std::to_string(shape[i]);
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" + dims +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + bytes.size()) + "]}";
    data += bytes;
  }
  header += ",\"__metadata__\":{\"format\":\"pt\"}}";
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

// What reading an entry's weights takes at its peak, from the files' sizes and headers alone: a
// .npy file twice (the file read, then the weights copied out of it), a safetensors tensor once
// (read straight into the weights), a fused module's parts all, plus the largest part's copies.
TEST_F(ManifestFilesTest, ReadBytesCountTheWeightsAndTheLargestCopy) {
  save("w.npy", NpyDType::kI1, {4, 8}, std::string(32, '\x01'));
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/w.npy").c_str(), &st), 0);
  const int64_t f = st.st_size;
  EXPECT_GT(f, 32);
  write("m.safetensors", safetensors_bytes({{"a", "I8", {2, 8}, std::string(16, '\x02')},
                                            {"b", "I8", {6, 8}, std::string(48, '\x03')},
                                            {"s", "F32", {6}, std::string(24, '\0')}}));
  auto source = [&](const std::string& file, const std::string& tensor = "") {
    TensorSource t;
    t.path = dir_ + "/" + file;
    t.tensor = tensor;
    return t;
  };
  auto bytes = [](std::vector<TensorSource> parts) {
    ManifestLayer l;
    if (parts.size() == 1) {
      l.weights = parts[0];
    } else {
      l.weights.parts = std::move(parts);
    }
    return manifest_layer_read_bytes(l);
  };
  EXPECT_EQ(*bytes({source("w.npy")}), 2 * f);
  EXPECT_EQ(*bytes({source("m.safetensors", "b")}), 48);
  EXPECT_EQ(*bytes({source("m.safetensors", "a"), source("m.safetensors", "b")}), 64 + 48);
  EXPECT_EQ(*bytes({source("w.npy"), source("m.safetensors", "a")}), f + 16 + 2 * f);
  EXPECT_EQ(bytes({source("none.npy")}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(bytes({source("m.safetensors", "nope")}).ok());
  EXPECT_FALSE(bytes({source("m.safetensors", "s")}).ok());  // not int8 weights
}

// Per-channel scale parts stored as rows ([1, N_i]) stack as [N_i] ones do, a [1, 1] part beside
// them taken as a row too; a part stored as a column beside a row is not alike.
TEST_F(ManifestFilesTest, FusedScalePartsStoredAsRowsStack) {
  write("m.safetensors", safetensors_bytes({{"a.weight", "I8", {2, 3}, std::string(6, '\x01')},
                                            {"b.weight", "I8", {1, 3}, std::string(3, '\x02')}}));
  save("r2.npy", NpyDType::kF4, {1, 2}, floats({0.5f, 0.25f}));
  save("r1.npy", NpyDType::kF4, {1, 1}, floats({2.f}));
  save("c2.npy", NpyDType::kF4, {2, 1}, floats({0.5f, 0.25f}));
  const std::string ab = R"("weights": [{"file": "m.safetensors", "tensor": "a.weight"},
      {"file": "m.safetensors", "tensor": "b.weight"}])";
  auto layers = read_layer_manifest(write("m.json", R"({"layers": [{"name": "rows", )" + ab +
                                                        R"(, "weight_scale": ["r2.npy", "r1.npy"]},
      {"name": "mixed", "weights": [{"file": "m.safetensors", "tensor": "a.weight"},
        {"file": "m.safetensors", "tensor": "a.weight"}], "weight_scale": ["c2.npy", "r2.npy"]}]})"));
  ASSERT_TRUE(layers.ok()) << layers.status();
  v1::LayerHeader h;
  std::vector<int8_t> weights;
  absl::Status s = read_manifest_layer((*layers)[0], &h, &weights);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::vector<int64_t>(h.weight_scale().shape().begin(), h.weight_scale().shape().end()),
            std::vector<int64_t>{3});
  EXPECT_EQ(h.weight_scale().data(), floats({0.5f, 0.25f, 2.f}));
  s = read_manifest_layer((*layers)[1], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("are not of shapes [N_i] (or [1, N_i]) or "
                                                  "[N_i, 1] alike"));
}

TEST_F(ManifestFilesTest, ReadsTensorsOfASafetensorsCheckpoint) {
  const std::string w = {1, -2, 3, -4, 5, -6};
  const std::string bf16_scales("\x00\x3f\x80\x3e", 4);  // 0.5, 0.25 in bf16
  const std::string f16_bias("\x00\x3c\x00\xc0", 4);     // 1, -2 in fp16
  float in_scale = 0.125f;
  int32_t zp = -7;
  const std::string file = safetensors_bytes({
      {"l.weight", "I8", {2, 3}, w},
      {"l.weight_scale", "BF16", {2, 1}, bf16_scales},
      {"l.bias", "F16", {2}, f16_bias},
      {"l.input_scale", "F32", {1}, std::string(reinterpret_cast<char*>(&in_scale), 4)},
      {"l.input_zero_point", "I32", {1}, std::string(reinterpret_cast<char*>(&zp), 4)},
      {"bad.weight", "F32", {2, 3}, std::string(24, '\0')},
      {"two.input_scale", "F32", {2}, std::string(8, '\0')},
      {"h.input_scale", "F16", {}, std::string("\x00\x34", 2)},    // 0.25
      {"b.input_scale", "BF16", {1}, std::string("\x00\x3e", 2)},  // 0.125
      {"z8.input_zero_point", "I8", {1}, std::string("\xfd", 1)},  // -3
  });
  {
    FILE* f = fopen(path("model.safetensors").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(file.data(), 1, file.size(), f);
    fclose(f);
  }
  save("s.npy", NpyDType::kF4, {2}, floats({0.5f, 0.25f}));
  auto ref = [](const std::string& t) {
    return R"({"file": "model.safetensors", "tensor": ")" + t + R"("})";
  };
  const std::string manifest = path("m.json");
  {
    FILE* f = fopen(manifest.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string json =
        R"({"layers": [{"name": "l", "scheme": "static_asymmetric", "weights": )" +
        ref("l.weight") + R"(, "weight_scale": )" + ref("l.weight_scale") + R"(, "bias": )" +
        ref("l.bias") + R"(, "input_scale": )" + ref("l.input_scale") +
        R"(, "input_zero_point": )" + ref("l.input_zero_point") + R"(},
        {"name": "missing", "weights": )" +
        ref("nope") + R"(, "weight_scale": "s.npy"},
        {"name": "f32", "weights": )" +
        ref("bad.weight") + R"(, "weight_scale": "s.npy"},
        {"name": "two", "weights": )" +
        ref("l.weight") + R"(, "weight_scale": "s.npy",
         "scheme": "static_symmetric", "input_scale": )" +
        ref("two.input_scale") + R"(},
        {"name": "npy", "weights": {"file": "s.npy", "tensor": "x"}, "weight_scale": "s.npy"},
        {"name": "h", "scheme": "static_asymmetric", "weights": )" +
        ref("l.weight") + R"(, "weight_scale": "s.npy", "input_scale": )" + ref("h.input_scale") +
        R"(, "input_zero_point": )" + ref("z8.input_zero_point") + R"(},
        {"name": "b", "scheme": "static_symmetric", "weights": )" +
        ref("l.weight") + R"(, "weight_scale": "s.npy", "input_scale": )" + ref("b.input_scale") +
        R"(}]})";
    fputs(json.c_str(), f);
    fclose(f);
  }
  auto layers = read_layer_manifest(manifest);
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 7u);
  EXPECT_EQ((*layers)[0].weights.path, dir_ + "/model.safetensors");
  EXPECT_EQ((*layers)[0].weights.tensor, "l.weight");
  EXPECT_EQ((*layers)[0].weights.describe(), dir_ + "/model.safetensors, tensor 'l.weight'");

  v1::LayerHeader h;
  std::vector<int8_t> weights;
  const absl::Status ok = read_manifest_layer((*layers)[0], &h, &weights);
  ASSERT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(h.n(), 2);
  EXPECT_EQ(h.k(), 3);
  EXPECT_EQ(std::string(weights.begin(), weights.end()), w);
  EXPECT_EQ(h.weight_scale().dtype(), v1::DTYPE_BF16);
  EXPECT_THAT(
      std::vector<int64_t>(h.weight_scale().shape().begin(), h.weight_scale().shape().end()),
      ::testing::ElementsAre(2, 1));
  EXPECT_EQ(h.weight_scale().data(), bf16_scales);
  EXPECT_EQ(h.bias().dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(h.bias().data(), f16_bias);
  ASSERT_TRUE(h.has_input_scale());
  EXPECT_EQ(h.input_scale(), 0.125f);
  ASSERT_TRUE(h.has_input_zero_point());
  EXPECT_EQ(h.input_zero_point(), -7);

  absl::Status s = read_manifest_layer((*layers)[1], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), dir_ + "/model.safetensors has no tensor 'nope'");
  s = read_manifest_layer((*layers)[2], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir_ +
                             "/model.safetensors, tensor 'bad.weight': weights must be I8 of "
                             "shape [N, K], got F32 [2, 3]");
  s = read_manifest_layer((*layers)[3], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir_ +
                             "/model.safetensors, tensor 'two.input_scale': input_scale must be "
                             "one value of F32, F16 or BF16, got F32 [2]");
  s = read_manifest_layer((*layers)[4], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir_ + "/s.npy: the header length "));
  // One value of F16, BF16 and I8 (the sign kept).
  ASSERT_TRUE(read_manifest_layer((*layers)[5], &h, &weights).ok());
  EXPECT_EQ(h.input_scale(), 0.25f);
  EXPECT_EQ(h.input_zero_point(), -3);
  ASSERT_TRUE(read_manifest_layer((*layers)[6], &h, &weights).ok());
  EXPECT_EQ(h.input_scale(), 0.125f);
  EXPECT_FALSE(h.has_input_zero_point());

  // The check before any layer loads finds the first tensor that is not there, without reading
  // data; the layers whose tensors are all there pass.
  s = check_manifest_tensors(*layers);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            "layer 'missing' (layers[1]): " + dir_ + "/model.safetensors has no tensor 'nope'");
  std::vector<ManifestLayer> good = {(*layers)[0], (*layers)[5], (*layers)[6]};
  EXPECT_TRUE(check_manifest_tensors(good).ok()) << check_manifest_tensors(good);
  std::vector<ManifestLayer> f32 = {(*layers)[0], (*layers)[2]};
  s = check_manifest_tensors(f32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("layer 'f32' (layers[2]): " + dir_ +
                        "/model.safetensors, tensor 'bad.weight': weights must be I8"));
}

// A fused module's parts (as vLLM fuses q/k/v and gate/up): weights stacked along N, the parts'
// Ns the logical widths, scales and biases stacked, per-tensor scales one per part, the largest
// static input scale.
TEST_F(ManifestFilesTest, FusedModulesStackTheirParts) {
  const std::string w = {1, -2, 3, -4, 5, -6};
  const std::string w4(8, '\x07');
  float quarter = 0.25f, eighth = 0.125f;
  const std::string file = safetensors_bytes({
      {"a.weight", "I8", {2, 3}, w},
      {"b.weight", "I8", {1, 3}, w.substr(0, 3)},
      {"c.weight", "I8", {2, 4}, w4},
      {"a.weight_scale", "BF16", {2, 1}, std::string("\x00\x3f\x80\x3e", 4)},
      {"s1", "F32", {1}, std::string(reinterpret_cast<char*>(&quarter), 4)},
      {"s2", "F32", {}, std::string(reinterpret_cast<char*>(&eighth), 4)},
  });
  write("m.safetensors", file);
  save("s2.npy", NpyDType::kF4, {2, 1}, floats({0.5f, 0.25f}));
  save("s1.npy", NpyDType::kF4, {1, 1}, floats({2.f}));
  auto ref = [](const std::string& t) {
    return R"({"file": "m.safetensors", "tensor": ")" + t + R"("})";
  };
  const std::string json =
      R"({"layers": [
    {"name": "ab", "weights": [)" +
      ref("a.weight") + ", " + ref("b.weight") +
      R"(], "weight_scale": ["s2.npy", "s1.npy"]},
    {"name": "pt", "weights": [)" +
      ref("a.weight") + ", " + ref("a.weight") + R"(], "weight_scale": [)" + ref("s1") + ", " +
      ref("s2") + R"(], "scheme": "static_symmetric", "input_scale": [)" + ref("s2") + ", " +
      ref("s1") +
      R"(]},
    {"name": "dt", "weights": [)" +
      ref("a.weight") + ", " + ref("a.weight") + R"(], "weight_scale": ["s2.npy", )" +
      ref("a.weight_scale") + R"(]},
    {"name": "k", "weights": [)" +
      ref("a.weight") + ", " + ref("c.weight") +
      R"(], "weight_scale": ["s2.npy", "s2.npy"]},
    {"name": "lw", "weights": [)" +
      ref("a.weight") + ", " + ref("b.weight") +
      R"(], "weight_scale": ["s2.npy", "s1.npy"], "logical_widths": [1, 2]},
      {"name": "sw", "weights": [)" +
      ref("a.weight") + ", " + ref("b.weight") + R"(], "weight_scale": ["s1.npy", "s2.npy"]},
      {"name": "sf", "weights": [)" +
      ref("a.weight") + ", " + ref("b.weight") + R"(], "weight_scale": [)" + ref("a.weight_scale") +
      ", " + ref("s1") + R"(]}]})";
  const std::string manifest = write("m.json", json);
  auto layers = read_layer_manifest(manifest);
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 7u);
  // Before any layer loads: the K of safetensors parts ("k"), and their scales' dtypes where all
  // parts are safetensors tensors; .npy parts are checked when read.
  std::vector<ManifestLayer> k_layer = {(*layers)[3]};
  absl::Status c = check_manifest_tensors(k_layer);
  EXPECT_EQ(c.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.message(), "layer 'k' (layers[3]): " + dir_ +
                             "/m.safetensors, tensor 'c.weight': K=4 where the first part has K=3");
  std::vector<ManifestLayer> fit = {(*layers)[0], (*layers)[1], (*layers)[2], (*layers)[4],
                                    (*layers)[5]};
  EXPECT_TRUE(check_manifest_tensors(fit).ok()) << check_manifest_tensors(fit);
  std::vector<ManifestLayer> sf = {(*layers)[6]};
  c = check_manifest_tensors(sf);
  EXPECT_EQ(c.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.message()),
              HasSubstr("layer 'sf' (layers[6]): [" + dir_ +
                        "/m.safetensors, tensor 'a.weight_scale'; " + dir_ +
                        "/m.safetensors, tensor 's1']: the parts of weight_scale are of "
                        "different dtypes"));

  v1::LayerHeader h;
  std::vector<int8_t> weights;
  absl::Status s = read_manifest_layer((*layers)[0], &h, &weights);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(h.n(), 3);
  EXPECT_EQ(h.k(), 3);
  EXPECT_EQ(std::string(weights.begin(), weights.end()), w + w.substr(0, 3));
  EXPECT_THAT(std::vector<int64_t>(h.logical_widths().begin(), h.logical_widths().end()),
              ::testing::ElementsAre(2, 1));
  EXPECT_THAT(
      std::vector<int64_t>(h.weight_scale().shape().begin(), h.weight_scale().shape().end()),
      ::testing::ElementsAre(3, 1));
  EXPECT_EQ(h.weight_scale().data(), floats({0.5f, 0.25f, 2.f}));

  // Per-tensor scales: one value per part; the largest input scale.
  s = read_manifest_layer((*layers)[1], &h, &weights);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(h.n(), 4);
  EXPECT_THAT(
      std::vector<int64_t>(h.weight_scale().shape().begin(), h.weight_scale().shape().end()),
      ::testing::ElementsAre(2));
  EXPECT_EQ(h.weight_scale().data(), floats({0.25f, 0.125f}));
  EXPECT_EQ(h.input_scale(), 0.25f);

  s = read_manifest_layer((*layers)[2], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the parts of weight_scale are of different dtypes"));
  s = read_manifest_layer((*layers)[3], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            dir_ + "/m.safetensors, tensor 'c.weight': K=4 where the first part has K=3");
  s = read_manifest_layer((*layers)[4], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "\"logical_widths\" [1, 2] differ from the weights' parts [2, 1]");
  // Each part's scales fit its own weights: swapped parts are refused.
  s = read_manifest_layer((*layers)[5], &h, &weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir_ +
                             "/s2.npy: part 1 of weight_scale holds 2 values where its weights "
                             "have 1 rows (or one for all, in every part)");

  // Parts only where they make sense.
  for (const auto& [json, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"layers": [{"name": "a", "weights": ["w.npy"], "weight_scale": "s.npy"}]})",
            "layer 'a' (layers[0]): \"weights\" as an array needs two or more parts"},
           {R"({"layers": [{"name": "a", "weights": "w.npy", "weight_scale": "s.npy",
              "input_zero_point": [1, 2]}]})",
            "layer 'a' (layers[0]): \"input_zero_point\" cannot be an array"},
           {R"({"layers": [{"name": "a", "weights": "w.npy", "weight_scale": "s.npy",
                "input_scale": [{"file": "m.safetensors", "tensor": "s1"}, 0.5],
                "scheme": "static_symmetric"}]})",
            "layer 'a' (layers[0]): each part of \"input_scale\" must be {\"file\""},
           {R"({"layers": [{"name": "a", "weights": "w.npy", "weight_scale": "s.npy",
                "input_scale": [{"file": "m.safetensors", "tensor": "s1"},
                                {"file": "m.safetensors", "tensor": "s2"}]}]})",
            "\"input_scale\" as an array of parts is for a static_symmetric fused module only"},
           {R"({"layers": [{"name": "a", "weights": ["w.npy", 4], "weight_scale": "s.npy"}]})",
            "layer 'a' (layers[0]): each part of \"weights\" must be the path of a .npy file "
            "or"}}) {
    const absl::Status e = parse_layer_manifest(json, "/m").status();
    EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(std::string(e.message()), HasSubstr(message)) << json;
  }
}

TEST_F(ManifestFilesTest, ASafetensorsHeaderThatDoesNotHoldIsRefused) {
  struct Case {
    std::string bytes, message;
  };
  const std::string ok = safetensors_bytes({{"w", "I8", {2, 2}, std::string(4, '\0')}});
  std::string truncated = ok.substr(0, ok.size() - 1);
  std::string lie = ok;
  lie.replace(lie.find("[0,4]"), 5, "[0,3]");
  std::string dtype = ok;
  dtype.replace(dtype.find("\"I8\""), 4, "\"Q4\"");
  const std::string twice = safetensors_bytes(
      {{"w", "I8", {2, 2}, std::string(4, '\0')}, {"w", "I8", {2, 2}, std::string(4, '\1')}});
  std::string overlap = safetensors_bytes(
      {{"a", "I8", {4}, std::string(4, '\0')}, {"b", "I8", {4}, std::string(4, '\1')}});
  overlap.replace(overlap.find("[4,8]"), 5, "[2,6]");
  const Case cases[] = {
      {twice, "the header names 'w' twice"},
      {overlap, "tensors 'a' and 'b' overlap in the file"},
      {"short", "too short for a safetensors file"},
      {truncated, "tensor 'w' ends past the end of the file (truncated?)"},
      {lie, "tensor 'w': data_offsets [0, 3] hold 3 bytes, its shape of I8 needs 4"},
      {std::string("\x04\0\0\0\0\0\0\0[1] ", 12), "the header is not a JSON object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const std::string p = path("case.safetensors");
    files_.pop_back();
    FILE* f = fopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(c.bytes.data(), 1, c.bytes.size(), f);
    fclose(f);
    const absl::Status s = read_safetensors_header(p).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(p + ": " + c.message));
  }
  files_.push_back(dir_ + "/case.safetensors");
  // A dtype not known here leaves the file readable; the tensor keeps it.
  const std::string p = path("newer.safetensors");
  FILE* f = fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite(dtype.data(), 1, dtype.size(), f);
  fclose(f);
  auto h = read_safetensors_header(p);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tensors.at("w").dtype, "Q4");
}

// A tensor is read only from the file its header was read from: one replaced in between (here
// by a file of other tensors) is refused, not read at the old offsets.
TEST_F(ManifestFilesTest, ASafetensorsFileReplacedAfterItsHeaderIsRefused) {
  const std::string p = write("c.safetensors", safetensors_bytes({{"w", "I8", {2, 2}, "abcd"}}));
  auto h = read_safetensors_header(p);
  ASSERT_TRUE(h.ok()) << h.status();
  auto t = read_safetensors_tensor(*h, "w");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "abcd");
  files_.pop_back();
  write("c.safetensors",
        safetensors_bytes({{"v", "I8", {4}, "wxyz"}, {"w", "I8", {2, 2}, "efgh"}}));
  t = read_safetensors_tensor(*h, "w");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_EQ(t.status().message(), p + " changed since its header was read; read it again");
}

// The check the manifest's "input_scale" and `qlinear-cli load --input-scale` share.
TEST(ExactFloat32Test, KeepsWhatAFloat32HoldsAndRefusesWhatWouldChange) {
  EXPECT_EQ(exact_float32(0.25), 0.25f);
  EXPECT_EQ(exact_float32(0), 0.f);
  EXPECT_EQ(exact_float32(-3e38), -3e38f);
  EXPECT_TRUE(exact_float32(1e-40).has_value());   // a subnormal float32, not 0
  EXPECT_FALSE(exact_float32(1e-50).has_value());  // would reach the server as 0
  EXPECT_FALSE(exact_float32(-1e39).has_value());  // as -inf
  EXPECT_FALSE(exact_float32(std::nan("")).has_value());
}

TEST(CheckBiasNotEmptyTest, RefusesABiasWithoutValues) {
  v1::Tensor bias;
  const absl::Status s = check_bias_not_empty(bias, "b.npy", 40);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "b.npy: bias has 0 values, expected n=40");
  bias.set_data(std::string(160, '\0'));
  EXPECT_TRUE(check_bias_not_empty(bias, "b.npy", 40).ok());
}

}  // namespace
}  // namespace qlinear
