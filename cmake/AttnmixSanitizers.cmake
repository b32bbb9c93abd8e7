# ATTNMIX_SANITIZE=address,undefined adds -fsanitize to one of our targets.
function(attnmix_target_sanitizers target)
  if(ATTNMIX_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${ATTNMIX_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${ATTNMIX_SANITIZE})
  endif()
endfunction()
