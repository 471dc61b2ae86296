# FindCUDNN: locates cuDNN 8/9 headers and the library. cuDNN may sit beside the CUDA
# toolkit (/usr/local/cuda) or in the system multiarch paths (Debian/Ubuntu packages).
# Sets CUDNN_FOUND, CUDNN_VERSION and the imported target CUDNN::cudnn. CUDNN_ROOT or the
# environment variable of the same name can point at another installation.
set(_cudnn_hints $ENV{CUDNN_ROOT} ${CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _cudnn_hints ${CUDAToolkit_INCLUDE_DIRS}/..)
endif()
find_path(CUDNN_INCLUDE_DIR cudnn_version.h
  HINTS ${_cudnn_hints} PATH_SUFFIXES include include/x86_64-linux-gnu include/aarch64-linux-gnu)
find_library(CUDNN_LIBRARY cudnn
  HINTS ${_cudnn_hints} PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _v REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  string(REGEX MATCH "CUDNN_MAJOR +([0-9]+)" _m "${_v}")
  set(_major ${CMAKE_MATCH_1})
  string(REGEX MATCH "CUDNN_MINOR +([0-9]+)" _m "${_v}")
  set(_minor ${CMAKE_MATCH_1})
  string(REGEX MATCH "CUDNN_PATCHLEVEL +([0-9]+)" _m "${_v}")
  set(CUDNN_VERSION "${_major}.${_minor}.${CMAKE_MATCH_1}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
