# Build options of attnmix (all prefixed ATTNMIX_).
option(ATTNMIX_BUILD_TESTS "Build the GoogleTest suites and register them with ctest" ${PROJECT_IS_TOP_LEVEL})
option(ATTNMIX_BUILD_BENCHMARKS "Build the Google Benchmark programs under bench/" OFF)
option(ATTNMIX_BUILD_CLI "Build the attnmix command-line tool" ON)
# ATTNMIX_WITH_PYTHON: ON when its dependencies are found (cmake/AttnmixPython.cmake).
option(ATTNMIX_WITH_OPENMP "Run E-steps on several threads with OpenMP" ON)
option(ATTNMIX_WARNINGS_AS_ERRORS "Treat compiler warnings as errors (ON in CI)" OFF)
option(ATTNMIX_NATIVE "Compile every attnmix target with -march=native" ON)
set(ATTNMIX_SANITIZE "" CACHE STRING "Sanitizers to enable, e.g. address,undefined")

# Applies the project-wide code generation flags to one of our targets.
function(attnmix_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  attnmix_target_warnings(${target})
  attnmix_target_sanitizers(${target})
  if(ATTNMIX_NATIVE)
    target_compile_options(${target} PUBLIC -march=native)
  endif()
endfunction()
# The libFuzzer targets under fuzz/ (clang only; cmake/AttnmixFuzz.cmake, docs/fuzzing.md).
option(ATTNMIX_BUILD_FUZZERS "Build the libFuzzer targets under fuzz/ (needs clang, e.g. clang++-14)" OFF)
