# cerb_set_warnings(target): the project's warning set, per target, never
# global. -Werror only with CERB_WERROR (CI turns it on).
function(cerb_set_warnings tgt)
  target_compile_options(${tgt} PRIVATE -Wall -Wextra -Wshadow -Wstrict-prototypes
    -Wmissing-prototypes -Wpointer-arith -Wformat=2 -Wno-unused-parameter)
  if(CERB_WERROR)
    target_compile_options(${tgt} PRIVATE -Werror)
  endif()
endfunction()
