// Incremental SHA-256 (OpenSSL) for the weight checksum of a layer upload.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace qlinear {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  // Lower-case hex digest; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(const void* data, size_t size);

}  // namespace qlinear
