#include "common/npy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlinear {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

absl::Status bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("not a supported .npy file: ", what));
}

// A parser for the header, a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// It accepts what numpy.lib.format writes and small variations (quotes, spacing, trailing
// commas); it evaluates nothing.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : s_(text) {}

  absl::Status parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    if (!eat('{')) return error("the header is not a dict");
    for (;;) {
      skip_space();
      if (eat('}')) break;
      std::string key;
      if (absl::Status s = parse_string(&key); !s.ok()) return s;
      skip_space();
      if (!eat(':')) return error(absl::StrCat("expected ':' after '", key, "'"));
      skip_space();
      if (key == "descr") {
        if (absl::Status s = parse_string(descr); !s.ok()) return s;
        have_descr = true;
      } else if (key == "fortran_order") {
        if (absl::Status s = parse_bool(fortran_order); !s.ok()) return s;
        have_order = true;
      } else if (key == "shape") {
        if (absl::Status s = parse_shape(shape); !s.ok()) return s;
        have_shape = true;
      } else {
        return error(absl::StrCat("unexpected key '", key, "'"));
      }
      skip_space();
      if (eat(',')) continue;
      if (eat('}')) break;
      return error("expected ',' or '}'");
    }
    skip_space();
    if (pos_ != s_.size()) return error("unexpected text after the dict");
    if (!have_descr) return bad("the header has no 'descr'");
    if (!have_order) return bad("the header has no 'fortran_order'");
    if (!have_shape) return bad("the header has no 'shape'");
    return absl::OkStatus();
  }

 private:
  absl::Status error(absl::string_view what) const {
    // At most 200 bytes of the header, escaped: it may be anything, of any length.
    constexpr size_t kShown = 200;
    return bad(absl::StrCat("malformed header (", what, " at offset ", pos_,
                            "): ", absl::CHexEscape(s_.substr(0, kShown)),
                            s_.size() > kShown ? absl::StrCat("... (", s_.size(), " bytes)") : ""));
  }
  void skip_space() {
    while (pos_ < s_.size() && absl::ascii_isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool eat_word(absl::string_view w) {
    if (s_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  absl::Status parse_string(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) {
      return error("expected a quoted string");
    }
    const char quote = s_[pos_++];
    const size_t end = s_.find(quote, pos_);
    if (end == absl::string_view::npos) return error("unterminated string");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return absl::OkStatus();
  }
  absl::Status parse_bool(bool* out) {
    if (eat_word("True")) {
      *out = true;
    } else if (eat_word("False")) {
      *out = false;
    } else {
      return error("expected True or False");
    }
    return absl::OkStatus();
  }
  absl::Status parse_shape(std::vector<int64_t>* shape) {
    shape->clear();
    if (!eat('(')) return error("expected a tuple for 'shape'");
    for (;;) {
      skip_space();
      if (eat(')')) return absl::OkStatus();
      const size_t start = pos_;
      while (pos_ < s_.size() && absl::ascii_isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      int64_t d = 0;
      if (pos_ == start || !absl::SimpleAtoi(s_.substr(start, pos_ - start), &d)) {
        return error("expected a non-negative integer dimension");
      }
      eat('L');  // Python 2 longs
      shape->push_back(d);
      skip_space();
      if (eat(',')) continue;
      if (eat(')')) return absl::OkStatus();
      return error("expected ',' or ')' in 'shape'");
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

absl::StatusOr<NpyDType> dtype_from_descr(absl::string_view d) {
  if (d == "|i1" || d == "<i1" || d == "i1") return NpyDType::kI1;
  if (d == "<f2") return NpyDType::kF2;
  if (d == "<f4") return NpyDType::kF4;
  if (d == "<i4") return NpyDType::kI4;
  if (!d.empty() && d[0] == '>') {
    return bad(absl::StrCat("big-endian dtype '", d,
                            "'; save it little-endian (arr.astype(arr.dtype.newbyteorder('<')))"));
  }
  return bad(absl::StrCat("dtype '", d,
                          "' is not one of |i1 (int8), <f2 (float16), <f4 (float32), "
                          "<i4 (int32)"));
}

}  // namespace

absl::string_view npy_descr(NpyDType t) {
  switch (t) {
    case NpyDType::kI1:
      return "|i1";
    case NpyDType::kF2:
      return "<f2";
    case NpyDType::kF4:
      return "<f4";
    case NpyDType::kI4:
      return "<i4";
  }
  return "?";
}

size_t npy_dtype_size(NpyDType t) {
  switch (t) {
    case NpyDType::kI1:
      return 1;
    case NpyDType::kF2:
      return 2;
    case NpyDType::kF4:
    case NpyDType::kI4:
      return 4;
  }
  return 1;
}

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool is_npy(absl::string_view bytes) { return bytes.substr(0, kMagic.size()) == kMagic; }

absl::StatusOr<NpyView> view_npy(absl::string_view bytes) {
  if (!is_npy(bytes)) return bad("it does not start with the magic string \\x93NUMPY");
  if (bytes.size() < 10) return bad("the file ends inside the preamble");
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  size_t header_len = 0, prefix = 0;
  if (major == 1 && minor == 0) {
    header_len = static_cast<unsigned char>(bytes[8]) |
                 (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    prefix = 10;
  } else if (major == 2 && minor == 0) {
    if (bytes.size() < 12) return bad("the file ends inside the preamble");
    for (int i = 0; i < 4; ++i) {
      header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    }
    prefix = 12;
  } else {
    return bad(absl::StrCat("format version ", major, ".", minor,
                            " (only 1.0 and 2.0 are read; numpy writes 1.0 by default)"));
  }
  if (bytes.size() - prefix < header_len) {
    return bad(absl::StrCat("the header says ", header_len, " bytes but the file has only ",
                            bytes.size() - prefix, " after the preamble"));
  }
  const absl::string_view header = bytes.substr(prefix, header_len);
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  if (absl::Status s = HeaderParser(header).parse(&descr, &fortran_order, &shape); !s.ok()) {
    return s;
  }
  NpyView a;
  auto dtype = dtype_from_descr(descr);
  if (!dtype.ok()) return dtype.status();
  a.dtype = *dtype;
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d > 0 && elements > (int64_t{1} << 50) / d) {
      return bad(absl::StrCat("shape ", shape_string(shape), " is too large"));
    }
    elements *= d;
  }
  // A Fortran-order array of 0 or 1 dimensions has the same bytes as a C-order one.
  if (fortran_order && shape.size() > 1) {
    return bad(absl::StrCat("shape ", shape_string(shape),
                            " is in Fortran order; save np.ascontiguousarray(arr) instead"));
  }
  a.shape = std::move(shape);
  const size_t want = static_cast<size_t>(elements) * npy_dtype_size(a.dtype);
  const size_t have = bytes.size() - prefix - header_len;
  if (have != want) {
    return bad(absl::StrCat(have < want ? "truncated: " : "trailing bytes: ", "shape ",
                            shape_string(a.shape), " of ", descr, " needs ", want,
                            " bytes of data, the file has ", have));
  }
  a.data = bytes.substr(prefix + header_len);
  return a;
}

absl::StatusOr<NpyArray> parse_npy(absl::string_view bytes) {
  absl::StatusOr<NpyView> v = view_npy(bytes);
  if (!v.ok()) return v.status();
  NpyArray a;
  a.dtype = v->dtype;
  a.shape = std::move(v->shape);
  a.data = std::string(v->data);
  return a;
}

absl::StatusOr<std::string> serialize_npy(const NpyArray& a) {
  for (int64_t d : a.shape) {
    if (d < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", shape_string(a.shape)));
  }
  const size_t want = static_cast<size_t>(a.elements()) * npy_dtype_size(a.dtype);
  if (a.data.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", shape_string(a.shape), " of ",
                                                   npy_descr(a.dtype), " needs ", want,
                                                   " bytes, got ", a.data.size()));
  }
  std::string shape = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) {
    absl::StrAppend(&shape, i ? ", " : "", a.shape[i]);
  }
  if (a.shape.size() == 1) shape += ",";
  shape += ")";
  std::string header = absl::StrCat("{'descr': '", npy_descr(a.dtype),
                                    "', 'fortran_order': False, 'shape': ", shape, ", }");
  // The preamble plus header is padded with spaces to a multiple of 64 and ends in '\n'.
  size_t prefix = 10;
  size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  if (total - prefix > 65535) {  // version 1.0 has a 16-bit header length
    prefix = 12;
    total = (prefix + header.size() + 1 + 63) / 64 * 64;
  }
  header.resize(total - prefix - 1, ' ');
  header += '\n';
  std::string out(kMagic);
  out += static_cast<char>(prefix == 10 ? 1 : 2);
  out += '\0';
  const size_t len = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  out += a.data;
  return out;
}

absl::StatusOr<RegularFile> open_regular_file(const std::string& path, std::ifstream* in) {
  // Looked at before it is opened: opening a FIFO blocks until something writes to it, and a
  // folder opens too and reads as nothing.
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  in->open(path, std::ios::binary);
  if (!*in) {
    const int err = errno;
    std::string what = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    if (err == EACCES) return absl::PermissionDeniedError(what);
    return absl::NotFoundError(what);
  }
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  RegularFile f;
  f.bytes = static_cast<uint64_t>(st.st_size);
  f.device = static_cast<uint64_t>(st.st_dev);
  f.inode = static_cast<uint64_t>(st.st_ino);
  f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return f;
}

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream in;
  absl::StatusOr<RegularFile> file = open_regular_file(path, &in);
  if (!file.ok()) return file.status();
  // Read at once into a string of the file's size (no second copy).
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(file->bytes));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", file->bytes, " bytes to read ", path));
  }
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.gcount() != static_cast<std::streamsize>(bytes.size()) || in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading ", path, ": got ", in.gcount(), " of ",
                                            bytes.size(), " bytes"));
  }
  return bytes;
}

absl::Status write_file(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    const int err = errno;
    std::string what = absl::StrCat("cannot write ", path, ": ", std::strerror(err));
    if (err == EACCES) return absl::PermissionDeniedError(what);
    return absl::NotFoundError(what);
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> read_npy_file(const std::string& path) {
  auto bytes = read_file(path);
  if (!bytes.ok()) return bytes.status();
  auto a = parse_npy(*bytes);
  if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", a.status().message()));
  return a;
}

absl::Status write_npy_file(const std::string& path, const NpyArray& array) {
  auto bytes = serialize_npy(array);
  if (!bytes.ok()) return bytes.status();
  return write_file(path, *bytes);
}

}  // namespace qlinear
