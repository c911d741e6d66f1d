// A layer manifest: a JSON file that names layers and the .npy files holding them. qlinear-server
// loads every layer in it at start-up (--layer-manifest), before it listens; qlinear-cli uploads
// them to a running server (load --manifest). One file serves both, so that a server that starts
// again, or a replica added later, holds the same layers.
//
//   {
//     "layers": [
//       {
//         "name": "model.layers.0.mlp.down_proj",       required; [A-Za-z0-9_.:/-]{1,128}
//         "weights": "down_proj.weight.npy",              required; int8 (|i1) [N, K]
//         "weight_scale": "down_proj.weight_scale.npy",   required; float32 or float16, of a
//                                                         LayerHeader's shapes ([N], [1], ...)
//         "bias": "down_proj.bias.npy",                   float32 or float16 [N]
//         "scheme": "dynamic_symmetric",                  the default; static_symmetric,
//                                                         dynamic_asymmetric, static_asymmetric
//         "input_scale": 0.02,                            static schemes
//         "input_zero_point": 3,                          static_asymmetric
//         "logical_widths": [4096, 1024, 1024],           fused modules
//         "forced_kernel": "cpu.reference",
//         "weight_sha256": "9f86d081...",                 verified when given
//         "max_batch_rows": 64,                           unset: the server's flags
//         "max_queue_delay_us": 100
//       }
//     ]
//   }
//
// Each tensor (weights, weight_scale, bias, and input_scale and input_zero_point given as
// tensors) may instead be a tensor of a safetensors file, as a checkpoint holds it:
//   "weights": {"file": "model-00001-of-00002.safetensors",
//               "tensor": "model.layers.0.mlp.down_proj.weight"}                 I8 [N, K]
//   "weight_scale": {"file": ..., "tensor": "...down_proj.weight_scale"}     F32, F16 or BF16
//   "input_scale": {"file": ..., "tensor": "...down_proj.input_scale"}      one F32/F16/BF16
//   "input_zero_point": {"file": ..., "tensor": "...input_zero_point"}      one I32 or I8
// weights, weight_scale, bias and input_scale may also be arrays of such sources, the parts of
// a fused module (TensorSource::parts). (qlinear-cli manifest --checkpoint writes such a manifest
// for a compressed-tensors W8A8 checkpoint.) Relative paths are taken from the manifest's
// folder. An unknown key, a value of the wrong type and a name given twice are errors that name
// the entry, so that a typo never loads a layer other than the one meant. What the values mean, and
// what is checked of them (shapes, schemes, scales), is the LayerHeader's
// (proto/qlinear/v1/qlinear.proto); the server checks it on load, as for an upload.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "qlinear/v1/qlinear.pb.h"

namespace qlinear {

// Where a tensor comes from: a .npy file (`tensor` empty), or tensor `tensor` of a safetensors
// file. `path` is resolved against the manifest's folder; empty: not given.
struct TensorSource {
  std::string path, tensor;
  // Or the parts of a fused module (vLLM's qkv_proj from q_proj, k_proj and v_proj; gate_up_proj
  // from gate_proj and up_proj), given as an array: weights are concatenated along N (the
  // parts' Ns are the layer's logical widths), weight_scale and bias likewise (per-tensor
  // scales become one value per logical width; each part's values fit its own rows),
  // input_scale takes the largest (static symmetric only). path and tensor are then empty.
  std::vector<TensorSource> parts;
  bool given() const { return !path.empty() || !parts.empty(); }
  // "PATH", or "PATH, tensor 'T'", for messages.
  std::string describe() const;
};

// One entry of a manifest, its files not yet read.
struct ManifestLayer {
  int index = 0;  // its position in "layers", from 0
  // Every field the manifest gives but n, k and the tensors (read_manifest_layer's).
  v1::LayerHeader header;
  TensorSource weights, weight_scale, bias;
  // Given as tensors (else in `header` where given as numbers, or not at all).
  TensorSource input_scale, input_zero_point;

  // "layer 'NAME' (entry I)", for messages.
  std::string describe() const;
};

// The scheme named `name` ("dynamic_symmetric", ...: kernels/core/layer.h's scheme_name);
// INVALID_ARGUMENT lists the names.
absl::StatusOr<v1::Scheme> parse_scheme_name(absl::string_view name);

// The entries of the manifest `json`, whose relative paths are taken from `base_dir`.
// INVALID_ARGUMENT says what is wrong and where.
absl::StatusOr<std::vector<ManifestLayer>> parse_layer_manifest(absl::string_view json,
                                                                absl::string_view base_dir);

// The same, from the file at `path` (NOT_FOUND or PERMISSION_DENIED when it cannot be read).
// Messages start with the path.
absl::StatusOr<std::vector<ManifestLayer>> read_layer_manifest(const std::string& path);

// The headers of the safetensors files a manifest names, each read once: a caller that checks a
// manifest and then reads its layers passes one to both, so that no header is parsed twice.
class SafetensorsHeaderCache {
 public:
  absl::StatusOr<const SafetensorsHeader*> get(const std::string& path);

 private:
  std::map<std::string, SafetensorsHeader> headers_;
};

// Checks, without reading their data, that every tensor the layers name is there: each .npy
// file exists, and each safetensors tensor is in its file with a dtype and shape it can be read
// as (each file's header read once, into `headers` where given). Messages name the layer and the
// file (and tensor).
absl::Status check_manifest_tensors(const std::vector<ManifestLayer>& layers,
                                    SafetensorsHeaderCache* headers = nullptr);

// Reads an entry's tensors: `*header` becomes its whole header (n and k from the weights' shape,
// weight_scale and bias as stored, input_scale and input_zero_point where given as tensors),
// `*weights` its N*K weight bytes. Safetensors headers are taken from `headers` where given.
// Messages name the file (and tensor).
absl::Status read_manifest_layer(const ManifestLayer& layer, v1::LayerHeader* header,
                                 std::vector<int8_t>* weights,
                                 SafetensorsHeaderCache* headers = nullptr);

// The host memory that reading an entry's weights takes at its peak (read_manifest_layer): the
// weights, and beside them a .npy file's bytes while it is copied (a fused module's part also its
// own copy), the largest such; from the files' sizes and the safetensors headers, without reading
// any data. A start-up compares it with the memory left before reading, as an upload's header
// is compared.
absl::StatusOr<int64_t> manifest_layer_read_bytes(const ManifestLayer& layer,
                                                  SafetensorsHeaderCache* headers = nullptr);

// `value` as the float32 a header carries; nullopt where it is beyond a float32's range or lost
// in it (a nonzero value that rounds to 0), which would reach the server as another value (inf,
// 0) than the one given.
std::optional<float> exact_float32(double value);

// OK unless `bias`, read from `source`, holds no values: an upload whose bias has no bytes has no
// bias, so a file with none is a mistake (INVALID_ARGUMENT "<source>: bias has 0 values,
// expected n=<n>").
absl::Status check_bias_not_empty(const v1::Tensor& bias, absl::string_view source, int64_t n);

// A float tensor (a weight scale, a bias) from a .npy file of float32 or float16, its shape kept;
// `what` names it in the message of a file of another dtype.
absl::StatusOr<v1::Tensor> read_float_tensor_npy(const std::string& path, absl::string_view what);

}  // namespace qlinear
