# mw_library(NAME DIR DEPS...): one static library per source folder, from the .cpp files in it
# (and, with CUDA, the .cu files in DIR/cuda). Dependencies are PUBLIC so the layering is explicit.
#
# Note [One include directory per target]: sources include headers by their path under src/
# ("core/tensor.h", "offload/io/file.h"), but a target does not put src/ itself on the include
# path. It publishes BUILD/include/NAME/, holding one symbolic link, REL -> src/REL, to its own
# folder. So a target sees only its own headers and those of the targets it links: an upward
# include of a header-only file fails to compile instead of slipping through. tests/layering checks
# the same rule against the table in docs/architecture.md, for every target, from the sources.
function(mw_library name dir)
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.cpp ${dir}/cpu/*.cpp)
  if(MW_HAVE_CUDA)
    file(GLOB cu_srcs CONFIGURE_DEPENDS ${dir}/cuda/*.cu ${dir}/cuda/*.cpp)
    list(APPEND srcs ${cu_srcs})
  else()
    file(GLOB stub_srcs CONFIGURE_DEPENDS ${dir}/nocuda/*.cpp)
    list(APPEND srcs ${stub_srcs})
  endif()
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/src ${dir})
  set(include_root ${PROJECT_BINARY_DIR}/include/${name})
  get_filename_component(link_parent ${include_root}/${rel} DIRECTORY)
  file(MAKE_DIRECTORY ${link_parent})
  file(CREATE_LINK ${dir} ${include_root}/${rel} SYMBOLIC)
  if(NOT srcs)  # a folder whose code has not landed yet: header-only for now
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${include_root})
    target_link_libraries(${name} INTERFACE ${ARGN})
    return()
  endif()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${include_root})
  target_link_libraries(${name} PUBLIC ${ARGN})
  if(MW_HAVE_CUDA)
    target_compile_definitions(${name} PUBLIC MW_HAVE_CUDA=1)
  endif()
endfunction()
