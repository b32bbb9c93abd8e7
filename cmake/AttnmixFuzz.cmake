# ATTNMIX_BUILD_FUZZERS (cmake/AttnmixOptions.cmake): the fuzz targets under fuzz/ (docs/fuzzing.md).
# With clang (Debian: clang-14 and libclang-rt-14-dev; -DCMAKE_CXX_COMPILER=clang++-14) they link libFuzzer, and
# every attnmix target of the build is instrumented for coverage and for AddressSanitizer +
# UndefinedBehaviorSanitizer (ATTNMIX_SANITIZE becomes fuzzer-no-link plus address,undefined, or plus what the cache
# names), so that the library code a fuzzer reaches guides it and reports its own bugs.
# With GCC (needed for fuzz_checkpoint: libtorch 1.13's headers do not compile with clang in C++20) they link
# fuzz/standalone_main.cpp, a small mutation engine without coverage feedback, under address,undefined.
if(ATTNMIX_BUILD_FUZZERS)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(ATTNMIX_FUZZ_ENGINE libfuzzer)
    if(ATTNMIX_SANITIZE)
      set(ATTNMIX_SANITIZE "fuzzer-no-link,${ATTNMIX_SANITIZE}")  # a normal variable: the cache keeps the user's list
    else()
      set(ATTNMIX_SANITIZE "fuzzer-no-link,address,undefined")
    endif()
  elseif(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(ATTNMIX_FUZZ_ENGINE standalone)
    if(NOT ATTNMIX_SANITIZE)
      set(ATTNMIX_SANITIZE "address,undefined")
    endif()
  else()
    message(FATAL_ERROR "ATTNMIX_BUILD_FUZZERS needs clang (libFuzzer) or GCC (fuzz/standalone_main.cpp); got "
                        "${CMAKE_CXX_COMPILER_ID}")
  endif()
endif()
