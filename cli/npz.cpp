// SPDX-License-Identifier: Apache-2.0
// .npz archives through libzip and the .npy header/data decoder (format documented in
// numpy.lib.format).
#include "npz.hpp"

#include <zip.h>

#include <cstring>
#include <memory>
#include <stdexcept>

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

NpyArray parse_npy(const std::string& bytes, const std::string& where) {
  const auto* raw = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 10 || std::memcmp(raw, "\x93NUMPY", 6) != 0)
    throw ValueError(where + ": not a .npy array (bad magic)");
  const int major = raw[6];
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = load_le<uint16_t>(raw + 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw ValueError(where + ": truncated .npy header");
    header_len = load_le<uint32_t>(raw + 8);
    offset = 12;
  } else {
    throw ValueError(where + ": unsupported .npy format version " + std::to_string(major));
  }
  if (bytes.size() < offset + header_len) throw ValueError(where + ": truncated .npy header");
  const std::string header = bytes.substr(offset, header_len);
  offset += header_len;

  NpyArray out;
  const size_t descr_pos = find_value(header, "descr", where);
  if (header[descr_pos] != '\'')
    throw ValueError(where + ": structured dtypes are not supported (descr " +
                     header.substr(descr_pos, 40) + ")");
  const size_t descr_end = header.find('\'', descr_pos + 1);
  if (descr_end == std::string::npos) throw ValueError(where + ": malformed .npy descr: " + header);
  out.descr = header.substr(descr_pos + 1, descr_end - descr_pos - 1);
  const bool fortran = header.compare(find_value(header, "fortran_order", where), 4, "True") == 0;
  out.shape = parse_shape(header, where);

  const std::string& d = out.descr;
  const char order = d.empty() ? '?' : d[0];
  const char kind = d.size() >= 2 ? d[1] : '?';
  const int size = d.size() >= 3 ? std::atoi(d.c_str() + 2) : 0;
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

  size_t count = 1;
  for (int64_t extent : out.shape) count *= static_cast<size_t>(extent);
  const size_t item = static_cast<size_t>(size);
  if (bytes.size() - offset < count * item)
    throw ValueError(where + ": truncated data (shape " + out.shape_text() + " needs " +
                     std::to_string(count * item) + " bytes, found " +
                     std::to_string(bytes.size() - offset) + ")");

  // Element k of the output (C order) comes from element src(k) of the file (Fortran order when
  // flagged).
  std::vector<size_t> c_strides(out.shape.size()), f_strides(out.shape.size());
  size_t c_stride = 1, f_stride = 1;
  for (size_t a = out.shape.size(); a-- > 0;) {
    c_strides[a] = c_stride;
    c_stride *= static_cast<size_t>(out.shape[a]);
  }
  for (size_t a = 0; a < out.shape.size(); ++a) {
    f_strides[a] = f_stride;
    f_stride *= static_cast<size_t>(out.shape[a]);
  }
  const auto source_index = [&](size_t k) {
    if (!fortran) return k;
    size_t src = 0;
    for (size_t a = 0; a < out.shape.size(); ++a)
      src += (k / c_strides[a] % static_cast<size_t>(out.shape[a])) * f_strides[a];
    return src;
  };
  const unsigned char* data = raw + offset;
  if (out.kind == NpyArray::Kind::kFloat) {
    out.reals.resize(count);
    for (size_t k = 0; k < count; ++k) {
      const unsigned char* p = data + source_index(k) * item;
      out.reals[k] = size == 4 ? static_cast<double>(load_le<float>(p)) : load_le<double>(p);
    }
  } else {
    out.ints.resize(count);
    for (size_t k = 0; k < count; ++k)
      out.ints[k] = decode_int(data + source_index(k) * item, kind == 'b' ? 'u' : kind, size);
  }
  return out;
}

std::map<std::string, NpyArray> read_npz(const std::string& path) {
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
    std::string bytes(static_cast<size_t>(st.size), '\0');
    const zip_int64_t got = zip_fread(file, bytes.data(), st.size);
    const std::string file_error = got < 0 ? zip_file_strerror(file) : "";
    zip_fclose(file);
    if (got < 0 || static_cast<zip_uint64_t>(got) != st.size)
      throw std::runtime_error(path + ": cannot read member " + name + ": " +
                               (file_error.empty() ? "short read" : file_error));
    arrays[name.substr(0, name.size() - 4)] = parse_npy(bytes, path + ": " + name);
  }
  return arrays;
}

}  // namespace attnmix::cli
