# cerb_add_sanitizers(target): ASan+UBSan (CERB_ASAN) or TSan (CERB_TSAN) on
# one target, compile and link, instead of global flags; with CERB_FUZZ also
# libFuzzer's coverage instrumentation.
function(cerb_add_sanitizers tgt)
  if(CERB_ASAN AND CERB_TSAN)
    message(FATAL_ERROR "CERB_ASAN and CERB_TSAN are mutually exclusive")
  endif()
  # With CERB_FUZZ every target carries libFuzzer's coverage instrumentation
  # (compile only: -fsanitize=fuzzer itself is linked into the harnesses).
  if(CERB_FUZZ)
    target_compile_options(${tgt} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
  if(CERB_ASAN)
    set(f -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  elseif(CERB_TSAN)
    set(f -fsanitize=thread -fno-omit-frame-pointer)
  else()
    return()
  endif()
  target_compile_options(${tgt} PRIVATE ${f})
  get_target_property(type ${tgt} TYPE)
  if(NOT type STREQUAL "OBJECT_LIBRARY" AND NOT type STREQUAL "STATIC_LIBRARY")
    target_link_options(${tgt} PRIVATE ${f})
  endif()
endfunction()
