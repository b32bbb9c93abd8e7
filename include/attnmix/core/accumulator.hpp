// SPDX-License-Identifier: Apache-2.0
/// @file accumulator.hpp
/// Flat additive sufficient statistics (`docs/mechanisms.md#building-blocks`).
///
/// Every leaf accumulator keeps its statistics in ONE contiguous buffer of doubles whose layout (an ordered list of
/// named, shaped fields) is declared once per family. That single list is the value() tuple layout, the pack order,
/// the serialisation order and the MPI reduction unit; combine is element-wise addition of two buffers, scale is
/// element-wise multiplication, equality is entry-wise equality of buffers (NaN equal to NaN).
///
/// FlatAccumulator<Derived> supplies combine / from_value / pack / unpack / scale for a family that provides
///   void validate(std::string_view where) const;   // finiteness, counts ≥ 0 and the family's mass laws
/// Statistics are validated before they are added or copied in, so a rejected value changes nothing.
///
/// A family whose statistics carry a non-additive attachment (the optimizer state of the variational families,
/// `docs/mechanisms.md#variational-embedding-attention`) also provides
///   void merge_attachment(const Derived& v, AttachmentMerge how);   // checks first, throws before any change
/// which combine (kStrict), merge_trusted (kAdopt) and from_value (kReplace) call before touching the buffer.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

/// Count fields must be ≥ 0; real fields only finite.
enum class FieldKind { kCount, kReal };

/// One named, shaped field of an accumulator's statistics, as a family declares it to StatLayout (name, shape,
/// kind); StatLayout fills in where it sits in the flat buffer and how many entries it has.
struct FieldSpec {
  /// The field's name in value(), messages and model files ("key_sum", "comp_count").
  std::string name;
  std::vector<Index> shape;  ///< the extents of the field, row-major; {} for a scalar
  FieldKind kind = FieldKind::kCount;  ///< what validation requires of its entries (counts ≥ 0, or finite reals)
  Index offset = 0;          ///< the index of its first entry in the flat buffer; filled by StatLayout
  Index size = 1;            ///< its number of entries, the product of shape (1 for a scalar); filled by StatLayout
};

/// How a sharded M-step splits a statistics buffer over the ranks (inference/sharded_mstep.hpp): each run hands
/// blocks[q] consecutive entries, from its offset in flat order, to rank q, in rank order; the entries in no run
/// belong to every rank.
struct StatsSplit {
  /// One run of the flat buffer split over the ranks.
  struct Run {
    Index offset = 0;             ///< the flat index of its first entry
    std::vector<int64_t> blocks;  ///< each rank's consecutive entries, in rank order
  };
  std::vector<Run> runs;  ///< in increasing offset, not overlapping
  int rank = 0;           ///< the rank whose entries are meant (this process's)
};

/// The declared layout of one accumulator: fields in value() order, packed back to back.
class StatLayout {
 public:
  /// Each field's size is the checked product of its shape (sizes.hpp), and so is the total.
  /// @throws ValueError "<where>: statistic <name> (a x b) must have at most 2^48 elements" for a shape too large.
  StatLayout(std::string_view where, std::vector<FieldSpec> fields);
  /// The fields in value() order, with their offsets and sizes filled in.
  [[nodiscard]] const std::vector<FieldSpec>& fields() const noexcept { return fields_; }
  /// The total number of doubles in the flat buffer: the sum of the fields' sizes (at most 2^48).
  [[nodiscard]] Index flat_size() const noexcept { return flat_size_; }
  /// Whether both layouts have the same fields in the same order: equal names, shapes and kinds. O(number of fields).
  [[nodiscard]] bool operator==(const StatLayout& other) const;
  /// "key_sum (16,8), key_mass (16,), ..." for messages.
  [[nodiscard]] std::string describe() const;

 private:
  std::vector<FieldSpec> fields_;
  Index flat_size_ = 0;
};

/// A flat statistics buffer with its layout. Copying copies the buffer (value semantics).
class FlatStats {
 public:
  /// A zeroed buffer of layout->flat_size() doubles. The layout (non-null) is shared, not copied: copies of this
  /// buffer point at the same layout object.
  explicit FlatStats(std::shared_ptr<const StatLayout> layout);

  /// The declared layout of this buffer.
  [[nodiscard]] const StatLayout& layout() const noexcept { return *layout_; }
  /// The number of doubles in the buffer, layout().flat_size().
  [[nodiscard]] Index flat_size() const noexcept { return layout_->flat_size(); }
  /// The whole buffer, read-only, in layout order (the pack order).
  [[nodiscard]] std::span<const double> flat() const noexcept { return data_; }
  /// The whole buffer, writable; nothing written through it is validated. For the library's own code: the reducer
  /// and the sum over the processes of a distributed fit write it in place (inference/reduce.hpp, optimize.hpp).
  [[nodiscard]] std::span<double> flat() noexcept { return data_; }
  /// Pointer to the first entry of field i (row-major within the field).
  [[nodiscard]] double* field(size_t i) noexcept { return data_.data() + layout_->fields()[i].offset; }
  /// Read-only pointer to the first entry of field i (row-major within the field); i must be below
  /// layout().fields().size().
  [[nodiscard]] const double* field(size_t i) const noexcept {
    return data_.data() + layout_->fields()[i].offset;
  }
  /// Sets every entry to 0 (the keys of an accumulator stay). O(flat_size()).
  void set_zero();
  /// Equality of layout and buffer, entry by entry, with NaN equal to NaN (tests, determinism checks); 0.0 and -0.0
  /// compare equal.
  [[nodiscard]] bool operator==(const FlatStats& other) const;

 protected:
  /// Throws ValueError unless other has the same layout (names, shapes and kinds).
  void check_same_layout(std::string_view where, const StatLayout& other) const;
  /// Every entry finite, count fields ≥ 0; with split, only the entries of split.rank.
  void check_entries(std::string_view where, const StatsSplit* split = nullptr) const;
  /// Adds values element-wise, without validation; values must have flat_size() entries.
  void add_unchecked(std::span<const double> values);
  /// Multiplies every entry by c, without validation.
  void scale_unchecked(double c);
  /// Overwrites the buffer with values, without validation; values must have flat_size() entries.
  void assign_unchecked(std::span<const double> values);

 private:
  std::shared_ptr<const StatLayout> layout_;
  std::vector<double> data_;
};

/// How combine-like operations treat a family's attachment (see the file comment).
enum class AttachmentMerge {
  kStrict,   ///< combine: both absent, or identical
  kAdopt,    ///< merge_trusted: an absent attachment takes the other's; two present ones must be identical
  kReplace,  ///< from_value: take the other's
};

/// CRTP base: the validated value semantics shared by all families (`docs/mechanisms.md#building-blocks`).
template <class Derived>
class FlatAccumulator : public FlatStats {
 public:
  /// A zeroed accumulator of the given layout, without keys (FlatStats's constructor).
  using FlatStats::FlatStats;

  /// A snapshot: later changes to this accumulator never alias it.
  [[nodiscard]] Derived value() const { return self(); }
  /// Validates v, then adds it element-wise. @throws ValueError on a layout or mass-law violation.
  void combine(const Derived& v) {
    check_same_layout(Derived::kWhere, v.layout());
    v.validate(Derived::kWhere);
    merge_attachment_of(v, AttachmentMerge::kStrict);
    add_unchecked(v.flat());
  }
  /// Validates v, then overwrites the statistics (keys stay). @throws ValueError when a check fails.
  void from_value(const Derived& v) {
    check_same_layout(Derived::kWhere, v.layout());
    v.validate(Derived::kWhere);
    merge_attachment_of(v, AttachmentMerge::kReplace);
    assign_unchecked(v.flat());
  }
  /// Writes the flat buffer (size flat_size()) in layout order.
  void pack(std::span<double> out) const {
    if (static_cast<Index>(out.size()) != flat_size())
      throw ValueError(std::string(Derived::kWhere) + ": pack buffer has the wrong size");
    std::copy(flat().begin(), flat().end(), out.begin());
  }
  /// Validates a packed buffer, then overwrites the statistics. @throws ValueError when a check fails.
  void unpack(std::span<const double> in) {
    if (static_cast<Index>(in.size()) != flat_size())
      throw ValueError(std::string(Derived::kWhere) + ": packed statistics must have " +
                       std::to_string(flat_size()) + " entries (got " + std::to_string(in.size()) + ")");
    Derived candidate = self();
    candidate.assign_unchecked(in);
    candidate.validate(Derived::kWhere);
    assign_unchecked(in);
  }
  /// Multiplies every field by c (finite, ≥ 0). @throws ValueError when a check fails.
  void scale(double c) {
    if (!(std::isfinite(c) && c >= 0.0))
      throw ValueError(std::string(Derived::kWhere) + ": scale must be finite and >= 0");
    scale_unchecked(c);
  }
  /// Adds without validation: for partials produced by this library's own E-steps.
  void merge_trusted(const Derived& other) {
    check_same_layout(Derived::kWhere, other.layout());
    merge_attachment_of(other, AttachmentMerge::kAdopt);
    add_unchecked(other.flat());
  }

  /// The key of keyed tying (`docs/mechanisms.md#building-blocks`): sites with the same key pool their statistics
  /// after the E-step; nothing for an untied site. The key is not part of the statistics: combine, pack and equality
  /// ignore it.
  [[nodiscard]] const std::optional<std::string>& keys() const noexcept { return keys_; }
  /// Sets (or, with nothing, clears) the key of keyed tying; families call it from their constructors.
  void set_keys(std::optional<std::string> keys) { keys_ = std::move(keys); }

 private:
  [[nodiscard]] const Derived& self() const { return static_cast<const Derived&>(*this); }
  void merge_attachment_of(const Derived& v, AttachmentMerge how) {
    if constexpr (requires(Derived& d) { d.merge_attachment(v, how); })
      static_cast<Derived&>(*this).merge_attachment(v, how);
  }
  std::optional<std::string> keys_;
};

}  // namespace attnmix
