# outbox_embed_sql(<target> <namespace> <header-name> FILES a.sql b.sql ... [DEPENDS fragments...])
# Generates a header that holds each .sql file as a std::string_view constant named
# after the file (0001_init.sql -> k0001_init), plus a table of (name, text) pairs, so
# no SQL string literals are scattered through C++ and the binary carries its SQL.
function(outbox_embed_sql target ns header)
  cmake_parse_arguments(ARG "" "" "FILES;DEPENDS" ${ARGN})
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/generated)
  set(out ${out_dir}/${header})
  # A ';' would split the argument, so pass the list joined with '|'.
  string(REPLACE ";" "|" files_arg "${ARG_FILES}")
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} -DNS=${ns} "-DFILES=${files_arg}"
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedSqlScript.cmake
    DEPENDS ${ARG_FILES} ${ARG_DEPENDS} ${PROJECT_SOURCE_DIR}/cmake/EmbedSqlScript.cmake
    COMMENT "Embedding SQL into ${header}"
    VERBATIM)
  add_custom_target(${target}_gen DEPENDS ${out})
  add_library(${target} INTERFACE)
  add_dependencies(${target} ${target}_gen)
  target_include_directories(${target} INTERFACE ${out_dir})
endfunction()
