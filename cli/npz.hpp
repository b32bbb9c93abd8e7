// SPDX-License-Identifier: Apache-2.0
/// @file npz.hpp
/// Reads NumPy .npz archives (numpy.savez / savez_compressed) with libzip: stored and deflated
/// members, .npy format versions 1-3, little-endian bool/int/uint/float dtypes (|b1 <i1..<i8
/// <u1..<u8 <f4 <f8), C or Fortran order (Fortran arrays are reordered to C order here). Other
/// dtypes are rejected with a message naming the file, the member and the dtype. Errors are
/// std::runtime_error (the archive cannot be read) or attnmix::ValueError / attnmix::TypeError (the
/// content is not what a data file needs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attnmix::cli {

/// One array of an archive, decoded to int64 (bool, int, uint dtypes) or double (float dtypes), in
/// C order.
struct NpyArray {
  enum class Kind { kBool, kInt, kFloat };
  std::string descr;           // the dtype as numpy wrote it, e.g. "<i8"
  std::vector<int64_t> shape;  // () for a scalar
  Kind kind = Kind::kInt;
  std::vector<int64_t> ints;  // kBool (0/1) and kInt; uint64 values above INT64_MAX saturate
  std::vector<double> reals;  // kFloat
  [[nodiscard]] size_t size() const;
  /// "(3, 4)" as numpy prints shapes.
  [[nodiscard]] std::string shape_text() const;
};

/// Every member of the archive, keyed by its name without ".npy" ("context", "query", ...).
/// @throws std::runtime_error (unreadable archive), ValueError (malformed or unsupported member).
[[nodiscard]] std::map<std::string, NpyArray> read_npz(const std::string& path);

/// Decodes one .npy member (exposed for tests). `where` prefixes error messages ("data.npz:
/// context.npy").
[[nodiscard]] NpyArray parse_npy(const std::string& bytes, const std::string& where);

}  // namespace attnmix::cli
