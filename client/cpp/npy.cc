// Implementation of client/cpp/npy.h. Format: "\x93NUMPY", major, minor, header length
// (uint16 for 1.0, uint32 for 2.0/3.0, little-endian), then a Python dict literal ending in '\n'.
#include "client/cpp/npy.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace orthoserve::client {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("invalid .npy: ", what)); }

// A tiny cursor over the header dict literal.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  // A quoted string ('...' or "...") without escapes.
  absl::StatusOr<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return Bad("expected a quoted string");
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Bad("unterminated string in header");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  // A bare word: True, False or a decimal integer.
  std::string Word() {
    SkipSpace();
    const size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '-')) {
      ++pos_;
    }
    return std::string(text_.substr(start, pos_ - start));
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<std::vector<int64_t>> ParseShape(HeaderParser& p) {
  if (!p.Consume('(')) return Bad("'shape' must be a tuple such as (3, 4)");
  std::vector<int64_t> shape;
  while (!p.Consume(')')) {
    const std::string word = p.Word();
    int64_t dim = 0;
    if (!absl::SimpleAtoi(word, &dim) || dim < 0) {
      return Bad(absl::StrCat("'shape' entry \"", word, "\" is not a non-negative integer"));
    }
    shape.push_back(dim);
    if (!p.Consume(',')) {
      if (!p.Consume(')')) return Bad("'shape' tuple is malformed");
      break;
    }
  }
  return shape;
}

struct Header {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

absl::StatusOr<Header> ParseHeaderDict(absl::string_view text, const NpyReadOptions& options) {
  HeaderParser p(text);
  if (!p.Consume('{')) return Bad("header is not a dict");
  Header header;
  bool have_descr = false, have_order = false, have_shape = false;
  while (!p.Consume('}')) {
    ASSIGN_OR_RETURN(std::string key, p.String());
    if (!p.Consume(':')) return Bad(absl::StrCat("missing ':' after '", key, "'"));
    if (key == "descr" && !have_descr) {
      ASSIGN_OR_RETURN(std::string descr, p.String());
      if (descr == "<f4") {
        header.dtype = DType::kF32;
      } else if (descr == "<f2") {
        header.dtype = DType::kF16;
      } else if (descr == "<V2" || descr == "|V2") {
        if (!options.void2_as_bf16) {
          return Bad(absl::StrCat("dtype '", descr,
                                  "' is raw 2-byte data (an ml_dtypes bfloat16 array?); "
                                  "read it as bfloat16 explicitly (orthoctl --bf16)"));
        }
        header.dtype = DType::kBF16;
      } else if (descr == ">f4" || descr == ">f2") {
        return Bad(absl::StrCat("dtype '", descr, "' is big-endian; save little-endian data (arr.astype('<f4'))"));
      } else {
        return Bad(absl::StrCat("dtype '", descr, "' is not supported; use float32 ('<f4') or float16 ('<f2')"));
      }
      have_descr = true;
    } else if (key == "fortran_order" && !have_order) {
      const std::string word = p.Word();
      if (word == "True") {
        return Bad("the array is in Fortran order; save a C-order copy (np.ascontiguousarray(a))");
      }
      if (word != "False") return Bad(absl::StrCat("'fortran_order' is \"", word, "\", not True or False"));
      have_order = true;
    } else if (key == "shape" && !have_shape) {
      ASSIGN_OR_RETURN(header.shape, ParseShape(p));
      have_shape = true;
    } else {
      return Bad(absl::StrCat("unexpected or repeated header key '", key, "'"));
    }
    if (!p.Consume(',')) {
      if (!p.Consume('}')) return Bad("header dict is malformed");
      break;
    }
  }
  if (!p.AtEnd()) return Bad("text after the header dict");
  if (!have_descr || !have_order || !have_shape) {
    return Bad("header lacks one of 'descr', 'fortran_order', 'shape'");
  }
  return header;
}

uint32_t ReadLe(const char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, const NpyReadOptions& options) {
  if (bytes.size() < kMagicLen + 2 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return Bad("not a .npy file (bad magic string)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return Bad(absl::StrCat("format version ", major, ".", minor, " is not 1.0, 2.0 or 3.0"));
  }
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (bytes.size() < prefix) return Bad("file ends inside the header length");
  const size_t header_len = ReadLe(bytes.data() + kMagicLen + 2, len_bytes);
  if (bytes.size() - prefix < header_len) {
    return Bad(absl::StrCat("header of ", header_len, " bytes is truncated (file has ", bytes.size(), " bytes)"));
  }
  absl::string_view header_text = bytes.substr(prefix, header_len);
  if (header_text.empty() || header_text.back() != '\n') return Bad("header does not end with a newline");
  header_text.remove_suffix(1);
  while (!header_text.empty() && header_text.back() == ' ') header_text.remove_suffix(1);
  ASSIGN_OR_RETURN(Header header, ParseHeaderDict(header_text, options));

  NpyArray array;
  array.dtype = header.dtype;
  array.shape = header.shape;
  uint64_t count = 1;
  for (int64_t d : header.shape) {
    if (d != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / static_cast<uint64_t>(d)) {
      return Bad("shape is too large");
    }
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t expected = count * ElementSize(header.dtype);
  const absl::string_view data = bytes.substr(prefix + header_len);
  if (data.size() != expected) {
    return Bad(absl::StrCat("shape (", absl::StrJoin(header.shape, ", "), ") of ", DTypeName(header.dtype), " needs ",
                            expected, " data bytes, the file has ", data.size(),
                            data.size() < expected ? " (truncated)" : " (trailing bytes)"));
  }
  array.data.assign(data.begin(), data.end());
  return array;
}

absl::StatusOr<std::string> EncodeNpy(const NpyArray& array) {
  const char* descr = nullptr;
  switch (array.dtype) {
    case DType::kF32:
      descr = "<f4";
      break;
    case DType::kF16:
      descr = "<f2";
      break;
    case DType::kBF16:
      descr = "<V2";
      break;
  }
  uint64_t count = 1;
  for (int64_t d : array.shape) {
    if (d < 0) return absl::InvalidArgumentError("negative dimension in shape");
    count *= static_cast<uint64_t>(d);
  }
  if (count * ElementSize(array.dtype) != array.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("array data has ", array.data.size(), " bytes; shape (",
                                                   absl::StrJoin(array.shape, ", "), ") needs ",
                                                   count * ElementSize(array.dtype)));
  }
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string dict = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  int major = 1;
  size_t prefix = kMagicLen + 2 + 2;
  if (prefix + dict.size() + 1 > 65535) {
    major = 2;
    prefix = kMagicLen + 2 + 4;
  }
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string out(kMagic, kMagicLen);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const uint32_t len = static_cast<uint32_t>(dict.size());
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += dict;
  out.append(array.data.begin(), array.data.end());
  return out;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path, const NpyReadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  absl::StatusOr<NpyArray> array = ParseNpy(contents.str(), options);
  if (!array.ok()) return Annotate(array.status(), path);
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeNpy(array));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::NotFoundError(absl::StrCat("cannot create ", path));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace orthoserve::client
