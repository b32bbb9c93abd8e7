// SPDX-License-Identifier: Apache-2.0
/// @file samplers.hpp
/// What the Python sampler classes share: the object behind an XSampler class, its constructor and the
/// distribution's sampler() method, and its sample(size=None, *, batched=True), which gives one observation
/// (size=None) or a list of `size` observations. `batched` is accepted, as the reference design's signature has it,
/// and changes nothing.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "convert.hpp"
#include "docstrings.hpp"
#include "roles.hpp"

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

/// The context length a sampler of a family with an open one draws when none is given: the library samplers' default.
inline constexpr int64_t kDefaultContextLength = 6;

/// A leaf family's sampler, wired both ways: the sampler class's constructor XSampler(dist, seed=None) (dist must be
/// the family's distribution), the distribution's sampler(seed=None) (documented by `method_doc`), and the class's
/// dist and sample() (def_sampling). `draw(model, seed)` makes the library's sampler. A family whose observations have
/// an open context length draws with `draw(model, seed, n)`, and both take the keyword-only
/// context_length=kDefaultContextLength (a positive int). Messages name the class or the distribution called.
template <class Dist, class Sampler, class Draw, class Observation>
void def_leaf_sampler(py::class_<Dist, DistributionHandle>& dist_class, py::class_<SamplerOf<Sampler>>& sampler_class,
                      Draw draw, Observation observation, const char* method_doc = "") {
  using pybind11::literals::operator""_a;
  using Holder = SamplerOf<Sampler>;
  using Model = std::remove_cvref_t<decltype(std::declval<const Dist&>().model())>;
  constexpr bool kOpenLength = std::is_invocable_v<Draw, const Model&, uint64_t, int64_t>;
  const std::string dist_name = dist_class.attr("__name__").template cast<std::string>();
  const std::string sampler_name = sampler_class.attr("__name__").template cast<std::string>();
  const auto make = [draw](py::object dist, py::handle seed, py::handle context_length, const std::string& where) {
    const Model& model = dist.cast<const Dist&>().model();
    if constexpr (kOpenLength) {
      const int64_t n = positive_int(context_length, where, "context_length");
      return Holder{draw(model, sampler_seed(seed, where), n), std::move(dist)};
    } else {
      return Holder{draw(model, sampler_seed(seed, where)), std::move(dist)};
    }
  };
  const auto construct = [make, dist_name, sampler_name](py::object dist, py::object seed, py::object n) {
    if (!py::isinstance<Dist>(dist)) throw TypeError(sampler_name + ": dist must be a " + dist_name);
    return make(std::move(dist), seed, n, sampler_name);
  };
  const auto method = [make, dist_name](py::object self, py::object seed, py::object n) {
    return make(std::move(self), seed, n, dist_name);
  };
  if constexpr (kOpenLength) {
    sampler_class.def(py::init(construct), "dist"_a, "seed"_a = py::none(), py::kw_only(),
                      "context_length"_a = kDefaultContextLength);
    dist_class.def("sampler", method, "seed"_a = py::none(), py::kw_only(), "context_length"_a = kDefaultContextLength,
                   method_doc);
  } else {
    sampler_class.def(
        py::init([construct](py::object dist, py::object seed) { return construct(std::move(dist), seed, {}); }),
        "dist"_a, "seed"_a = py::none());
    dist_class.def(
        "sampler", [method](py::object self, py::object seed) { return method(std::move(self), seed, {}); },
        "seed"_a = py::none(), method_doc);
  }
  def_sampling(sampler_class, std::move(observation));
}

}  // namespace attnmix::python
