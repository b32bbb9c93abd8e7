// SPDX-License-Identifier: Apache-2.0
// .npz archives through libzip and the .npy header/data decoder (format documented in
// numpy.lib.format).
#include "attnmix/io/npz.hpp"

#include <zip.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/sizes.hpp"

namespace attnmix {

size_t NpyArray::size() const { return kind == Kind::kFloat ? reals.size() : ints.size(); }

std::string NpyArray::shape_text() const {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) out += ",";
  return out + ")";
}

namespace {

/// The text after `'key':` in a .npy header dict, with leading spaces skipped.
size_t find_value(const std::string& header, const std::string& key, const std::string& where) {
  const size_t pos = header.find("'" + key + "'");
  if (pos == std::string::npos)
    throw ValueError(where + ": malformed .npy header (no '" + key + "'): " + header);
  size_t colon = header.find(':', pos);
  if (colon == std::string::npos) throw ValueError(where + ": malformed .npy header: " + header);
  ++colon;
  while (colon < header.size() && header[colon] == ' ') ++colon;
  return colon;
}

/// The extents of the header's 'shape' tuple. Each is a run of at most 18 decimal digits (so it fits int64
/// without overflow); a longer one is rejected here, a large product of extents by checked_product.
std::vector<int64_t> parse_shape(const std::string& header, const std::string& where) {
  constexpr size_t kMaxDigits = 18;  // 10^18 - 1 < 2^63
  size_t pos = find_value(header, "shape", where);
  const size_t close = header.find(')', pos);
  if (header[pos] != '(' || close == std::string::npos)
    throw ValueError(where + ": malformed .npy shape: " + header);
  std::vector<int64_t> shape;
  std::string number;
  for (size_t i = pos + 1; i <= close; ++i) {
    const char c = header[i];
    if (c >= '0' && c <= '9') {
      number += c;
      if (number.size() > kMaxDigits)
        throw ValueError(where + ": shape: extent " + std::to_string(shape.size()) + " has more than " +
                         std::to_string(kMaxDigits) + " digits (an array has at most 2^48 elements): " +
                         header.substr(pos, close + 1 - pos));
    } else if (c == ',' || c == ')') {
      if (!number.empty()) {
        int64_t extent = 0;
        for (char digit : number) extent = extent * 10 + (digit - '0');  // ≤ 18 digits: no overflow
        shape.push_back(extent);
      }
      number.clear();
    } else if (c != ' ' && c != 'L') {
      throw ValueError(where + ": malformed .npy shape: " + header);
    }
  }
  return shape;
}

template <class T>
T load_le(const unsigned char* p) {
  T value;
  std::memcpy(&value, p,
              sizeof value);  // x86-64 and aarch64 are little-endian, like the dtypes accepted here
  return value;
}

int64_t decode_int(const unsigned char* p, char kind, int size) {
  if (kind == 'i') {
    switch (size) {
      case 1:
        return load_le<int8_t>(p);
      case 2:
        return load_le<int16_t>(p);
      case 4:
        return load_le<int32_t>(p);
      default:
        return load_le<int64_t>(p);
    }
  }
  uint64_t u = 0;
  switch (size) {
    case 1:
      u = load_le<uint8_t>(p);
      break;
    case 2:
      u = load_le<uint16_t>(p);
      break;
    case 4:
      u = load_le<uint32_t>(p);
      break;
    default:
      u = load_le<uint64_t>(p);
      break;
  }
  // A uint64 above INT64_MAX has no int64 value: decode() rejects it before calling here.
  return static_cast<int64_t>(u);
}

}  // namespace

namespace {

/// A parsed .npy header: the array's description (shape, dtype), where its data starts, and how to decode it.
struct NpyHeader {
  NpyArray array;        // descr, shape and kind set; no data
  char kind = '?';       // 'b', 'i', 'u' or 'f'
  int item = 0;          // bytes per element
  bool fortran = false;  // column-major data
  size_t data_offset = 0;
  size_t count = 0;   // elements in the whole array (at most kMaxElements, so count · item cannot overflow)
  std::string where;  // "data.npz: context.npy", for decode's messages
};

/// Bytes of the magic, version and header-length fields (10 for version 1, 12 for versions 2 and 3), and the header
/// length they give. raw holds `available` bytes: the first 10 of the member (or all of it when it is shorter), and
/// 2 more for versions 2 and 3.
std::pair<size_t, size_t> header_extent(const unsigned char* raw, size_t available, const std::string& where) {
  if (available < 10 || std::memcmp(raw, "\x93NUMPY", 6) != 0)
    throw ValueError(where + ": not a .npy array (bad magic)");
  const int major = raw[6];
  if (major == 1) return {10, load_le<uint16_t>(raw + 8)};
  if (major == 2 || major == 3) {
    if (available < 12) throw ValueError(where + ": truncated .npy header");
    return {12, load_le<uint32_t>(raw + 8)};  // fixed + header_len < 2^33: no overflow in size_t
  }
  throw ValueError(where + ": unsupported .npy format version " + std::to_string(major));
}

/// Parses the header at the start of `bytes` (which holds at least the whole header); member_size is the size of
/// the whole member, against which the data is checked for truncation.
NpyHeader parse_header(const std::string& bytes, size_t member_size, const std::string& where) {
  const auto* raw = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto [fixed, header_len] = header_extent(raw, bytes.size(), where);
  if (bytes.size() < fixed + header_len) throw ValueError(where + ": truncated .npy header");
  const std::string header = bytes.substr(fixed, header_len);

  NpyHeader h;
  h.where = where;
  h.data_offset = fixed + header_len;
  NpyArray& out = h.array;
  const size_t descr_pos = find_value(header, "descr", where);
  if (header[descr_pos] != '\'')
    throw ValueError(where + ": structured dtypes are not supported (descr " +
                     header.substr(descr_pos, 40) + ")");
  const size_t descr_end = header.find('\'', descr_pos + 1);
  if (descr_end == std::string::npos) throw ValueError(where + ": malformed .npy descr: " + header);
  out.descr = header.substr(descr_pos + 1, descr_end - descr_pos - 1);
  h.fortran = header.compare(find_value(header, "fortran_order", where), 4, "True") == 0;
  out.shape = parse_shape(header, where);

  const std::string& d = out.descr;
  const char order = d.empty() ? '?' : d[0];
  h.kind = d.size() >= 2 ? d[1] : '?';
  h.item = d.size() >= 3 ? std::atoi(d.c_str() + 2) : 0;
  const char kind = h.kind;
  const int size = h.item;
  const bool sized_ok =
      (kind == 'b' && size == 1) ||
      ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) ||
      (kind == 'f' && (size == 4 || size == 8));
  if (!sized_ok || d.size() != 3)
    throw ValueError(where + ": unsupported dtype '" + d +
                     "' (supported: bool, int8-64, uint8-64, float32, float64)");
  if (order == '>' && size > 1)
    throw ValueError(where + ": big-endian dtype '" + d + "' is not supported; use arr.astype('<" +
                     d.substr(1) + "')");
  out.kind = kind == 'b'   ? NpyArray::Kind::kBool
             : kind == 'f' ? NpyArray::Kind::kFloat
                           : NpyArray::Kind::kInt;
  // Every size derived from the shape is checked: the element count and the row size are at most 2^48, so the
  // byte count (count · item, item ≤ 8) and every index below fit in int64 and size_t.
  h.count = static_cast<size_t>(checked_product(where, "shape", out.shape.data(), out.shape.size()));
  out.row_size = out.shape.size() <= 1
                     ? 1
                     : checked_product(where, "shape[1:] (the row size)", out.shape.data() + 1, out.shape.size() - 1);
  const size_t needed = h.count * static_cast<size_t>(size);
  if (member_size < h.data_offset || member_size - h.data_offset < needed)
    throw ValueError(where + ": truncated data (shape " + out.shape_text() + " needs " + std::to_string(needed) +
                     " bytes, found " + std::to_string(member_size < h.data_offset ? 0 : member_size - h.data_offset) +
                     ")");
  return h;
}

/// Decodes rows [first_row, first_row + n_rows) along axis 0 from `data`, which holds exactly those rows (C order),
/// or the whole array (first_row 0, every row) when it is in Fortran order.
/// @throws ValueError for a uint64 element above INT64_MAX (an id has no such value), naming its row.
NpyArray decode(const NpyHeader& h, const unsigned char* data, int64_t first_row, int64_t n_rows) {
  NpyArray out = h.array;
  out.first_row = first_row;
  const size_t count = out.shape.empty() ? 1 : static_cast<size_t>(n_rows * out.row_size);
  const auto& shape = out.shape;
  // Element k of the output (C order) comes from element src(k) of the data (Fortran order when flagged).
  std::vector<size_t> c_strides(shape.size()), f_strides(shape.size());
  size_t c_stride = 1, f_stride = 1;
  for (size_t a = shape.size(); a-- > 0;) {
    c_strides[a] = c_stride;
    c_stride *= static_cast<size_t>(shape[a]);
  }
  for (size_t a = 0; a < shape.size(); ++a) {
    f_strides[a] = f_stride;
    f_stride *= static_cast<size_t>(shape[a]);
  }
  const auto source_index = [&](size_t k) {
    if (!h.fortran) return k;
    size_t src = 0;
    for (size_t a = 0; a < shape.size(); ++a)
      src += (k / c_strides[a] % static_cast<size_t>(shape[a])) * f_strides[a];
    return src;
  };
  const size_t item = static_cast<size_t>(h.item);
  if (out.kind == NpyArray::Kind::kFloat) {
    out.reals.resize(count);
    for (size_t k = 0; k < count; ++k) {
      const unsigned char* p = data + source_index(k) * item;
      out.reals[k] = h.item == 4 ? static_cast<double>(load_le<float>(p)) : load_le<double>(p);
    }
  } else {
    out.ints.resize(count);
    const bool uint64 = h.kind == 'u' && h.item == 8;
    for (size_t k = 0; k < count; ++k) {
      const unsigned char* p = data + source_index(k) * item;
      if (uint64 && load_le<uint64_t>(p) > static_cast<uint64_t>(INT64_MAX)) {
        const auto row_size = static_cast<size_t>(out.row_size);
        const std::string element =
            shape.empty() ? "the scalar"
            : shape.size() == 1
                ? "row " + std::to_string(first_row + static_cast<int64_t>(k))
                : "row " + std::to_string(first_row + static_cast<int64_t>(k / row_size)) + ", element " +
                      std::to_string(k % row_size);
        throw ValueError(h.where + ": " + element + ": the uint64 value " + std::to_string(load_le<uint64_t>(p)) +
                         " is above the int64 maximum " + std::to_string(INT64_MAX));
      }
      out.ints[k] = decode_int(p, h.kind == 'b' ? 'u' : h.kind, h.item);
    }
  }
  return out;
}

/// Throws IoError "<what>: <libzip's reason>" with the system's errno when libzip reports one.
[[noreturn]] void throw_zip_error(const std::string& what, zip_error_t* error) {
  const int system_error = zip_error_system_type(error) == ZIP_ET_SYS ? zip_error_code_system(error) : 0;
  throw IoError(what + ": " + zip_error_strerror(error), system_error);
}

/// A member read in order, from its first byte to its last, so that libzip can check its CRC-32 and size at the end
/// (finish): libzip checks them only when a read reaches the end of the data (a read that returns 0).
class MemberReader {
 public:
  MemberReader(zip_file_t* file, size_t size, std::string where) : file_(file), size_(size), where_(std::move(where)) {}

  [[nodiscard]] size_t size() const { return size_; }
  [[nodiscard]] const std::string& where() const { return where_; }

  /// Reads exactly `n` more bytes, in blocks (a member's claimed size never sizes an allocation before its bytes
  /// arrive). @throws IoError on a read error or a short read; ValueError on a CRC-32 mismatch.
  std::string read(size_t n) {
    std::string bytes;
    bytes.reserve(std::min(n, kBlock));
    while (bytes.size() < n) {
      const size_t step = std::min(n - bytes.size(), kBlock);
      const size_t at = bytes.size();
      bytes.resize(at + step);
      read_into(bytes.data() + at, step);
    }
    return bytes;
  }

  /// Reads and discards `n` more bytes (a deflated member can only be read in order).
  void skip(size_t n) {
    std::string block(std::min(n, kBlock), '\0');
    while (n > 0) {
      const size_t step = std::min(n, kBlock);
      read_into(block.data(), step);
      n -= step;
    }
  }

  /// Reads the rest of the member and then its end, where libzip compares the CRC-32 of every byte read with the
  /// archive's. @throws ValueError "<where>: CRC-32 mismatch …" when they differ.
  void finish() {
    skip(size_ - consumed_);
    char extra = 0;
    const zip_int64_t got = zip_fread(file_, &extra, 1);
    if (got < 0) fail();
    if (got > 0)
      throw ValueError(where_ + ": the member holds more data than the " + std::to_string(size_) +
                       " bytes the archive states");
  }

 private:
  static constexpr size_t kBlock = size_t{1} << 20;

  void read_into(char* into, size_t n) {
    const zip_int64_t got = zip_fread(file_, into, n);
    if (got < 0) fail();
    if (static_cast<size_t>(got) != n)
      throw IoError(where_ + ": cannot read the member: short read (" + std::to_string(consumed_ + static_cast<size_t>(got)) +
                        " of " + std::to_string(size_) + " bytes)",
                    0);
    consumed_ += n;
  }

  [[noreturn]] void fail() const {
    zip_error_t* error = zip_file_get_error(file_);
    if (zip_error_code_zip(error) == ZIP_ER_CRC)
      throw ValueError(where_ + ": CRC-32 mismatch: the member's data does not match the checksum stored in the "
                                "archive (the file is corrupt)");
    throw_zip_error(where_ + ": cannot read the member", error);
  }

  zip_file_t* file_;
  size_t size_;
  size_t consumed_ = 0;
  std::string where_;
};

/// One member, streamed: the header, then only the bytes of the stripe's rows (C order, at least one axis), or the
/// whole data (Fortran order with two or more axes, or a scalar). The rest of the member is left to finish().
NpyArray read_member(MemberReader& in, int part, int parts) {
  const std::string& where = in.where();
  const size_t member_size = in.size();
  // The magic and version (10 bytes; 12 for versions 2 and 3, whose header length has 4 bytes), then the header.
  std::string prefix = in.read(std::min<size_t>(10, member_size));
  if (prefix.size() == 10 && (prefix[6] == 2 || prefix[6] == 3))
    prefix += in.read(std::min<size_t>(2, member_size - 10));
  const auto [fixed, header_len] =
      header_extent(reinterpret_cast<const unsigned char*>(prefix.data()), prefix.size(), where);
  if (member_size < fixed + header_len) throw ValueError(where + ": truncated .npy header");
  prefix += in.read(fixed + header_len - prefix.size());  // prefix.size() == fixed here
  const NpyHeader h = parse_header(prefix, member_size, where);
  const auto& shape = h.array.shape;
  const size_t item = static_cast<size_t>(h.item);
  if (shape.empty() || (h.fortran && shape.size() >= 2)) {
    const std::string data = in.read(h.count * item);
    return decode(h, reinterpret_cast<const unsigned char*>(data.data()), 0, shape.empty() ? 1 : shape[0]);
  }
  // The stripe [n·part/parts, n·(part+1)/parts) without forming n·part (n ≤ 2^48, parts < 2^31): with
  // n = q·parts + r, n·part/parts = q·part + r·part/parts, and r·part < 2^62.
  const int64_t n = shape[0];
  const auto stripe_start = [&](int64_t p) { return n / parts * p + n % parts * p / parts; };
  const int64_t begin = stripe_start(part);
  const int64_t end = stripe_start(part + 1);
  const size_t row_bytes = static_cast<size_t>(h.array.row_size) * item;
  in.skip(static_cast<size_t>(begin) * row_bytes);
  const std::string data = in.read(static_cast<size_t>(end - begin) * row_bytes);
  return decode(h, reinterpret_cast<const unsigned char*>(data.data()), begin, end - begin);
}

}  // namespace

size_t NpyArray::at(int64_t row, int64_t col) const {
  return static_cast<size_t>((row - first_row) * row_size + col);
}

NpyArray parse_npy(const std::string& bytes, const std::string& where) {
  const NpyHeader h = parse_header(bytes, bytes.size(), where);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data()) + h.data_offset;
  return decode(h, data, 0, h.array.shape.empty() ? 1 : h.array.shape[0]);
}

std::map<std::string, NpyArray> read_npz(const std::string& path, int part, int parts) {
  int code = 0;
  // ZIP_CHECKCONS: the local headers must agree with the central directory, and members must not overlap. It also
  // refuses a name given twice (ZIP_ER_EXISTS) without naming it: then the archive is opened without the check and
  // the loop below names the duplicate.
  zip_t* archive = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
  if (!archive && code == ZIP_ER_EXISTS) archive = zip_open(path.c_str(), ZIP_RDONLY, &code);
  if (!archive) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    const int system_error = zip_error_system_type(&error) == ZIP_ET_SYS ? zip_error_code_system(&error) : 0;
    const std::string reason = zip_error_strerror(&error);
    zip_error_fini(&error);
    throw IoError(path + ": cannot open the .npz archive: " + reason, system_error);
  }
  const std::unique_ptr<zip_t, decltype(&zip_discard)> guard(archive, &zip_discard);
  std::map<std::string, NpyArray> arrays;
  const zip_int64_t n_entries = zip_get_num_entries(archive, 0);
  for (zip_int64_t i = 0; i < n_entries; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive, static_cast<zip_uint64_t>(i), 0, &st) != 0 ||
        !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE))
      throw_zip_error(path + ": cannot read entry " + std::to_string(i), zip_get_error(archive));
    std::string name = st.name;
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".npy") != 0)
      throw ValueError(path + ": member '" + name + "' is not a .npy array");
    std::string key = name.substr(0, name.size() - 4);
    // A second member of the same name would silently replace the first (numpy's np.load keeps the last).
    if (arrays.contains(key)) throw ValueError(path + ": duplicate member '" + name + "'");
    zip_file_t* file = zip_fopen_index(archive, static_cast<zip_uint64_t>(i), 0);
    if (!file) throw_zip_error(path + ": cannot open member " + name, zip_get_error(archive));
    const std::unique_ptr<zip_file_t, decltype(&zip_fclose)> file_guard(file, &zip_fclose);
    MemberReader in(file, static_cast<size_t>(st.size), path + ": " + name);
    NpyArray array = read_member(in, part, parts);
    in.finish();  // the rest of the member (beyond the stripe), then its CRC-32
    arrays.emplace(std::move(key), std::move(array));
  }
  return arrays;
}

}  // namespace attnmix
