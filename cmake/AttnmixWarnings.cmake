# Warnings for attnmix's own targets only; CMAKE_CXX_FLAGS is never touched.
function(attnmix_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    # GCC 12 reports false positives inside its own AVX-512 intrinsics when Eigen inlines them.
    -Wno-maybe-uninitialized
    # The eight-lane helpers pass 64-byte vectors between inline functions; on a processor without AVX-512 GCC notes
    # that such a call's ABI changed in GCC 4.6 (-Wpsabi). No such function crosses a library boundary.
    -Wno-psabi)
  if(ATTNMIX_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
