# outbox_add_test(<name> SOURCES ... LIBS ... LABELS ... [TIMEOUT s] [COST s])
# One ctest entry per binary: a test binary that needs Postgres starts its cluster once.
# COST: about how many seconds it runs. ctest -j starts the costliest tests first; a fresh
# clone has no timings of earlier runs, and the longest test started last ran on alone.
function(outbox_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_COST)
    set(ARG_COST 0)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                                          COST ${ARG_COST})
endfunction()
