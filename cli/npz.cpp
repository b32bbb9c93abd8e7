// SPDX-License-Identifier: Apache-2.0
// .npz archives through libzip and the .npy header/data decoder (format documented in
// numpy.lib.format).
#include "npz.hpp"

#include <zip.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>

#include "attnmix/core/errors.hpp"

namespace attnmix::cli {

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

std::vector<int64_t> parse_shape(const std::string& header, const std::string& where) {
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
    } else if (c == ',' || c == ')') {
      if (!number.empty()) shape.push_back(std::stoll(number));
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
  return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
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
  size_t count = 0;  // elements in the whole array
};

/// Bytes of the magic, version and header-length fields, and the header length they give (raw holds at least the
/// first 12 bytes of the member, or the whole member when it is shorter).
std::pair<size_t, size_t> header_extent(const unsigned char* raw, size_t available, const std::string& where) {
  if (available < 10 || std::memcmp(raw, "\x93NUMPY", 6) != 0)
    throw ValueError(where + ": not a .npy array (bad magic)");
  const int major = raw[6];
  if (major == 1) return {10, load_le<uint16_t>(raw + 8)};
  if (major == 2 || major == 3) {
    if (available < 12) throw ValueError(where + ": truncated .npy header");
    return {12, load_le<uint32_t>(raw + 8)};
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
  h.count = 1;
  for (int64_t extent : out.shape) h.count *= static_cast<size_t>(extent);
  out.row_size = 1;
  for (size_t a = 1; a < out.shape.size(); ++a) out.row_size *= out.shape[a];
  const size_t needed = h.count * static_cast<size_t>(size);
  if (member_size < h.data_offset || member_size - h.data_offset < needed)
    throw ValueError(where + ": truncated data (shape " + out.shape_text() + " needs " + std::to_string(needed) +
                     " bytes, found " + std::to_string(member_size < h.data_offset ? 0 : member_size - h.data_offset) +
                     ")");
  return h;
}

/// Decodes rows [first_row, first_row + n_rows) along axis 0 from `data`, which holds exactly those rows (C order),
/// or the whole array (first_row 0, every row) when it is in Fortran order.
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
    for (size_t k = 0; k < count; ++k)
      out.ints[k] = decode_int(data + source_index(k) * item, h.kind == 'b' ? 'u' : h.kind, h.item);
  }
  return out;
}

/// Reads exactly `size` bytes of a member. @throws std::runtime_error on a read error or a short read.
std::string read_bytes(zip_file_t* file, size_t size, const std::string& where) {
  std::string bytes(size, '\0');
  const zip_int64_t got = size == 0 ? 0 : zip_fread(file, bytes.data(), size);
  if (got < 0 || static_cast<size_t>(got) != size)
    throw std::runtime_error(where + ": cannot read the member: " +
                             (got < 0 ? std::string(zip_file_strerror(file)) : std::string("short read")));
  return bytes;
}

/// Reads and discards `size` bytes of a member (a deflated member can only be read in order).
void skip_bytes(zip_file_t* file, size_t size, const std::string& where) {
  constexpr size_t kBlock = size_t{1} << 20;
  std::string block(std::min(size, kBlock), '\0');
  while (size > 0) {
    const size_t step = std::min(size, kBlock);
    const zip_int64_t got = zip_fread(file, block.data(), step);
    if (got < 0 || static_cast<size_t>(got) != step)
      throw std::runtime_error(where + ": cannot read the member: " +
                               (got < 0 ? std::string(zip_file_strerror(file)) : std::string("short read")));
    size -= step;
  }
}

/// One member, streamed: the header, then only the bytes of the stripe's rows (C order, at least one axis), or the
/// whole data (Fortran order with two or more axes, or a scalar).
NpyArray read_member(zip_file_t* file, size_t member_size, int part, int parts, const std::string& where) {
  std::string prefix = read_bytes(file, std::min<size_t>(12, member_size), where);
  const auto [fixed, header_len] =
      header_extent(reinterpret_cast<const unsigned char*>(prefix.data()), prefix.size(), where);
  if (member_size < fixed + header_len) throw ValueError(where + ": truncated .npy header");
  prefix += read_bytes(file, fixed + header_len - prefix.size(), where);
  const NpyHeader h = parse_header(prefix, member_size, where);
  const auto& shape = h.array.shape;
  const size_t item = static_cast<size_t>(h.item);
  if (shape.empty() || (h.fortran && shape.size() >= 2)) {
    const std::string data = read_bytes(file, h.count * item, where);
    return decode(h, reinterpret_cast<const unsigned char*>(data.data()), 0, shape.empty() ? 1 : shape[0]);
  }
  const int64_t n = shape[0];
  const int64_t begin = n * part / parts;
  const int64_t end = n * (part + 1) / parts;
  const size_t row_bytes = static_cast<size_t>(h.array.row_size) * item;
  skip_bytes(file, static_cast<size_t>(begin) * row_bytes, where);
  const std::string data = read_bytes(file, static_cast<size_t>(end - begin) * row_bytes, where);
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
  zip_t* archive = zip_open(path.c_str(), ZIP_RDONLY, &code);
  if (!archive) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    const std::string reason = zip_error_strerror(&error);
    zip_error_fini(&error);
    throw std::runtime_error(path + ": cannot open the .npz archive: " + reason);
  }
  const std::unique_ptr<zip_t, decltype(&zip_discard)> guard(archive, &zip_discard);
  std::map<std::string, NpyArray> arrays;
  const zip_int64_t n_entries = zip_get_num_entries(archive, 0);
  for (zip_int64_t i = 0; i < n_entries; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive, static_cast<zip_uint64_t>(i), 0, &st) != 0 ||
        !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE))
      throw std::runtime_error(path + ": cannot read entry " + std::to_string(i) + ": " +
                               zip_strerror(archive));
    std::string name = st.name;
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".npy") != 0)
      throw ValueError(path + ": member '" + name + "' is not a .npy array");
    zip_file_t* file = zip_fopen_index(archive, static_cast<zip_uint64_t>(i), 0);
    if (!file)
      throw std::runtime_error(path + ": cannot open member " + name + ": " +
                               zip_strerror(archive));
    const std::unique_ptr<zip_file_t, decltype(&zip_fclose)> file_guard(file, &zip_fclose);
    arrays[name.substr(0, name.size() - 4)] =
        read_member(file, static_cast<size_t>(st.size), part, parts, path + ": " + name);
  }
  return arrays;
}

}  // namespace attnmix::cli
