// SPDX-License-Identifier: Apache-2.0
/// @file samplers.hpp
/// What the Python sampler classes share: the object behind an XSampler class and its
/// sample(size=None, *, batched=True), which gives one observation (size=None) or a list of `size` observations.
/// `batched` is accepted, as the reference design's signature has it, and changes nothing.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "convert.hpp"
#include "docstrings.hpp"

namespace attnmix::python {

/// The object behind an XSampler class: the library's sampler and the distribution it draws from (`dist`).
template <class Sampler>
struct SamplerOf {
  Sampler sampler;
  py::object dist;
};

/// The `size` of sample(size, batched=...): nullopt for one observation, else how many (an integer ≥ 0).
[[nodiscard]] inline std::optional<int64_t> sample_size(py::handle size, py::handle batched, std::string_view where) {
  (void)flag(batched, where, "batched");
  if (size.is_none()) return std::nullopt;
  return nonnegative_int(size, where, "size");
}

/// sample(size, batched=...) of a sampler that draws one observation at a time: draw_one(), or a list of `size`
/// consecutive draw_one()s (so sample(size=m) equals m calls of sample()).
template <class DrawOne>
py::object sample_observations(py::handle size, py::handle batched, std::string_view where, DrawOne&& draw_one) {
  const std::optional<int64_t> m = sample_size(size, batched, where);
  if (!m) return draw_one();
  py::list out;
  for (int64_t k = 0; k < *m; ++k) out.append(draw_one());
  return out;
}

/// The `dist` attribute and sample(size=None, *, batched=True) of a leaf family's sampler class, whose observations
/// are observation(sampler.sample()) in the form the family's encoder reads.
template <class Sampler, class Observation>
void def_sampling(py::class_<SamplerOf<Sampler>>& cls, Observation observation) {
  using pybind11::literals::operator""_a;
  using Holder = SamplerOf<Sampler>;
  const std::string where = cls.attr("__name__").template cast<std::string>() + ".sample";
  cls.def_property_readonly("dist", [](const Holder& s) { return s.dist; }, doc::kSamplerDist)
      .def(
          "sample",
          [where, observation](Holder& s, py::object size, py::object batched) {
            return sample_observations(size, batched, where, [&] { return observation(s.sampler.sample()); });
          },
          "size"_a = py::none(), py::kw_only(), "batched"_a = true, doc::kSample);
}

}  // namespace attnmix::python
