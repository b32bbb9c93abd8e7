# ATTNMIX_SANITIZE=address,undefined adds -fsanitize to each of our targets (attnmix_target_defaults). Every
# UndefinedBehaviorSanitizer report is fatal (-fno-sanitize-recover), so a test or a fuzz input that triggers one fails
# instead of printing a line and going on. `make test-sanitize` builds and runs the `unit` tests this way
# (docs/fuzzing.md); the fuzz build (ATTNMIX_BUILD_FUZZERS, cmake/AttnmixFuzz.cmake) adds fuzzer-no-link.
function(attnmix_target_sanitizers target)
  if(ATTNMIX_SANITIZE)
    string(REPLACE "," ";" ATTNMIX_SANITIZE_LIST "${ATTNMIX_SANITIZE}")
    set(_flags -fsanitize=${ATTNMIX_SANITIZE} -fno-omit-frame-pointer)
    if("undefined" IN_LIST ATTNMIX_SANITIZE_LIST)
      list(APPEND _flags -fno-sanitize-recover=undefined)
    endif()
    target_compile_options(${target} PRIVATE ${_flags})
    target_link_options(${target} PRIVATE ${_flags})
  endif()
endfunction()
