# One place for the warning set every corma target uses.
function(corma_set_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
    -Woverloaded-virtual -Wimplicit-fallthrough
    # g++ 12 reports a false mismatch on Asio's awaitable frames.
    -Wno-mismatched-new-delete
    # g++ 12 warns about std::atomic_thread_fence under TSan; Asio uses it.
    $<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>
    # g++ 12 at -O2 and above reports impossible overlaps and sizes inside
    # libstdc++'s own std::string code (GCC bugs 105329 and 105651, fixed
    # in 13): false alarms that would bury real warnings.
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict -Wno-stringop-overread>
    $<$<BOOL:${CORMA_WARNINGS_AS_ERRORS}>:-Werror>)
endfunction()
