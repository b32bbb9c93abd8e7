# Warnings for attnmix's own targets only; CMAKE_CXX_FLAGS is never touched.
function(attnmix_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    # GCC 12 reports false positives inside its own AVX-512 intrinsics when Eigen inlines them.
    -Wno-maybe-uninitialized
    # The eight-lane helpers pass 64-byte vectors between inline functions; on a processor without AVX-512 GCC notes
    # that such a call's ABI changed in GCC 4.6 (-Wpsabi). No such function crosses a library boundary.
    -Wno-psabi)
  # At -O1 (the sanitizer and fuzz builds) GCC 12 also reports -Wuninitialized inside those intrinsics: the
  # `__m512d __Y = __Y;` of _mm512_undefined_pd, reached through Eigen's AVX-512 log (GCC bug 105593, fixed in 13).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<CONFIG:Debug>:-Wno-uninitialized>)
  endif()
  if(ATTNMIX_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
