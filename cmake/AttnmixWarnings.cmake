# Warnings for attnmix's own targets only; CMAKE_CXX_FLAGS is never touched.
function(attnmix_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    # GCC 12 reports false positives inside its own AVX-512 intrinsics when Eigen inlines them.
    -Wno-maybe-uninitialized)
  if(ATTNMIX_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
