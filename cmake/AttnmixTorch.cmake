# ATTNMIX_WITH_TORCH: the attnmix::torch target (the streaming language-model spine,
# docs/mechanisms.md#streaming-language-model and #moment-closure-far-field, libtorch).
# ON by default when libtorch is found (Debian: libtorch-dev; scripts/install-deps.sh installs it), an error when
# forced ON without it. Debian's package reports version 1.13.0, so the request is "1.13" (1.13.1 would fail).
find_package(Torch 1.13 QUIET CONFIG)
if(Torch_FOUND)
  option(ATTNMIX_WITH_TORCH "Build attnmix::torch (streaming LM spine on libtorch)" ON)
else()
  option(ATTNMIX_WITH_TORCH "Build attnmix::torch (streaming LM spine on libtorch)" OFF)
endif()
if(ATTNMIX_WITH_TORCH AND NOT Torch_FOUND)
  message(FATAL_ERROR "ATTNMIX_WITH_TORCH is ON but libtorch was not found (Debian: libtorch-dev; "
                      "scripts/install-deps.sh installs it)")
endif()
