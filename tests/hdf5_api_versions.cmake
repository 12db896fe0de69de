# The sources that call HDF5 must compile under every API version the installed HDF5 offers
# (H5_USE_*_API) and, on a 1.10 header, under an emulation of the
# names 1.12 and 1.14 changed (support/hdf5_next_api.h). One ctest per choice, each a syntax-only
# compile of those sources.
set(ATTNSCOPE_HDF5_SOURCES
    ${PROJECT_SOURCE_DIR}/lib/src/dump_attributes.cpp ${PROJECT_SOURCE_DIR}/lib/src/dump_reader.cpp
    ${PROJECT_SOURCE_DIR}/lib/src/dump_writer.cpp ${PROJECT_SOURCE_DIR}/lib/src/hdf5_util.cpp
    ${PROJECT_SOURCE_DIR}/lib/src/dump_variant.cpp ${PROJECT_SOURCE_DIR}/lib/src/hdf5_writer.cpp
    ${PROJECT_SOURCE_DIR}/lib/src/hdf5_checked_driver.cpp ${PROJECT_SOURCE_DIR}/lib/src/hdf5_vlen_check.cpp)
get_target_property(_eigen_inc Eigen3::Eigen INTERFACE_INCLUDE_DIRECTORIES)
set(_api_flags -std=c++20 -fsyntax-only -Wall -Werror -DATTNSCOPE_VERSION="0"
    -I${PROJECT_SOURCE_DIR}/lib/include -I${PROJECT_SOURCE_DIR}/lib/src
    -I${PROJECT_SOURCE_DIR}/analyses/include -I${PROJECT_SOURCE_DIR}/apps)
foreach(dir ${HDF5_INCLUDE_DIRS} ${_eigen_inc})
  list(APPEND _api_flags -isystem ${dir})
endforeach()
foreach(def ${HDF5_C_DEFINITIONS})
  list(APPEND _api_flags ${def})
endforeach()

# Each choice is NAME=FLAG[|FLAG...].
# (Debian's HDF5 1.10 defaults to the 1.8 API, so deprecated symbols cannot be turned off there.)
set(_api_choices "v16=-DH5_USE_16_API" "v18=-DH5_USE_18_API")
if(HDF5_VERSION VERSION_GREATER_EQUAL 1.12)
  list(APPEND _api_choices "default=" "v110=-DH5_USE_110_API" "v112=-DH5_USE_112_API")
else()
  list(APPEND _api_choices "next=-include|${CMAKE_CURRENT_SOURCE_DIR}/support/hdf5_next_api.h")
endif()
if(HDF5_VERSION VERSION_GREATER_EQUAL 1.14)
  list(APPEND _api_choices "v114=-DH5_USE_114_API")
endif()
foreach(choice ${_api_choices})
  string(FIND "${choice}" "=" _eq)
  string(SUBSTRING "${choice}" 0 ${_eq} _name)
  math(EXPR _eq "${_eq} + 1")
  string(SUBSTRING "${choice}" ${_eq} -1 _defs)
  string(REPLACE "|" ";" _defs "${_defs}")
  add_test(NAME hdf5_api.${_name}
           COMMAND ${CMAKE_CXX_COMPILER} ${_api_flags} ${_defs} ${ATTNSCOPE_HDF5_SOURCES})
endforeach()
