// SPDX-License-Identifier: Apache-2.0
/// @file npz.hpp
/// Reads NumPy .npz archives (numpy.savez / savez_compressed) with libzip: stored and deflated
/// members, .npy format versions 1-3, little-endian bool/int/uint/float dtypes (|b1 <i1..<i8
/// <u1..<u8 <f4 <f8), C or Fortran order (Fortran arrays are reordered to C order here). Other
/// dtypes are rejected with a message naming the file, the member and the dtype. Errors are
/// attnmix::IoError (the archive cannot be opened or read) or attnmix::ValueError / attnmix::TypeError (the
/// content is not what a data file needs). Integrity: every member is read to its end so that its CRC-32 is
/// verified (a stripe too: the rest of the member is read and discarded), a name may appear only once, and every
/// size taken from a header (the element count, the row size) goes through checked_product (at most 2^48
/// elements; an extent has at most 18 digits).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attnmix {

/// One array of an archive, decoded to int64 (bool, int, uint dtypes) or double (float dtypes), in
/// C order: all of it, or only a stripe of its rows (axis 0), [first_row, first_row + held rows).
struct NpyArray {
  /// The decoded element type: bool (|b1, held in ints as 0/1), integer (int8-64 and uint8-64, held in ints) or
  /// float (float32 and float64, held in reals as doubles).
  enum class Kind { kBool, kInt, kFloat };
  std::string descr;           ///< the dtype as numpy wrote it, e.g. "<i8"
  std::vector<int64_t> shape;  ///< of the whole array in the file; () for a scalar
  Kind kind = Kind::kInt;      ///< which of ints and reals holds the elements
  int64_t first_row = 0;      ///< axis-0 index of the first row held
  int64_t row_size = 1;       ///< elements per row (the product of shape[1:]; 1 for a scalar or a 1-D array)
  std::vector<int64_t> ints;  ///< kBool (0/1) and kInt (a uint64 value above INT64_MAX is rejected)
  std::vector<double> reals;  ///< kFloat
  /// The number of elements held (of ints for kBool and kInt, of reals for kFloat): held rows × row_size.
  [[nodiscard]] size_t size() const;
  /// Index into ints / reals of element `col` of row `row` (an axis-0 index of the file, among the rows held).
  [[nodiscard]] size_t at(int64_t row, int64_t col = 0) const;
  /// "(3, 4)" as numpy prints shapes.
  [[nodiscard]] std::string shape_text() const;
};

/// Every member of the archive, keyed by its name without ".npy" ("context", "query", ...). With parts > 1 each
/// array of at least one axis holds only rows [n·part/parts, n·(part+1)/parts) of its n rows (the stripe of one
/// process of a distributed fit, RowStripe): members are streamed, so memory holds the stripe, while shapes and
/// errors still describe the whole file. (A Fortran-ordered array of two or more axes is decoded whole.)
/// @throws IoError (unreadable archive or member), ValueError (malformed or unsupported member, a shape of more than
///         2^48 elements, a CRC-32 mismatch, a duplicate member name, a uint64 value above INT64_MAX).
[[nodiscard]] std::map<std::string, NpyArray> read_npz(const std::string& path, int part = 0, int parts = 1);

/// Decodes one .npy member (exposed for tests). `where` prefixes error messages ("data.npz:
/// context.npy").
[[nodiscard]] NpyArray parse_npy(const std::string& bytes, const std::string& where);

}  // namespace attnmix
