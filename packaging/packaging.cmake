# SPDX-License-Identifier: Apache-2.0
# CMake package config, pkg-config file and CPack (TGZ, DEB) settings.
include(CMakePackageConfigHelpers)
set(FLY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flykernels)
install(EXPORT flykernelsTargets NAMESPACE flykernels:: DESTINATION ${FLY_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_SOURCE_DIR}/packaging/flykernelsConfig.cmake.in
  ${CMAKE_BINARY_DIR}/flykernelsConfig.cmake INSTALL_DESTINATION ${FLY_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/flykernelsConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/flykernelsConfig.cmake ${CMAKE_BINARY_DIR}/flykernelsConfigVersion.cmake
  DESTINATION ${FLY_CMAKE_DIR} COMPONENT dev)

# pkg-config: prefix relative to the .pc file's directory (lib/<triplet>/pkgconfig -> ../../..).
set(FLY_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH FLY_PC_PCDIR_TO_PREFIX ${CMAKE_INSTALL_PREFIX}/${FLY_PC_DIR} ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" FLY_PC_PCDIR_TO_PREFIX "${FLY_PC_PCDIR_TO_PREFIX}")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")  # an absolute directory stays where it was configured
    set(FLY_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(FLY_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
configure_file(${CMAKE_SOURCE_DIR}/packaging/flykernels.pc.in ${CMAKE_BINARY_DIR}/flykernels.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/flykernels.pc DESTINATION ${FLY_PC_DIR} COMPONENT dev)

# Licence: each DEB ships /usr/share/doc/<its package>/copyright (Debian copyright format 1.0,
# Apache-2.0, pointing at /usr/share/common-licenses/Apache-2.0); .ci/install_check.sh checks it.
set(fly_deb_runtime libflykernels${PROJECT_VERSION_MAJOR})
set(fly_doc_packages "runtime=${fly_deb_runtime}" "dev=libflykernels-dev")
if(FLY_BUILD_TOOLS)
  list(APPEND fly_doc_packages "tools=flykernels-tools")
endif()
foreach(entry ${fly_doc_packages})
  string(REPLACE "=" ";" entry "${entry}")
  list(GET entry 0 component)
  list(GET entry 1 package)
  install(FILES ${CMAKE_SOURCE_DIR}/packaging/copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${package}
          COMPONENT ${component})
endforeach()

# Debian changelog: /usr/share/doc/<package>/changelog.Debian.gz in each DEB, compressed as Debian
# policy asks (gzip -9n: best compression, no name or time stamp, so the bytes are reproducible).
# packaging/changelog.Debian's first entry must carry the project version (checked here and by
# .ci/install_check.sh). Only the DEBs carry it (the TGZ is no Debian package).
file(STRINGS ${CMAKE_SOURCE_DIR}/packaging/changelog.Debian fly_changelog_head LIMIT_COUNT 1)
if(NOT fly_changelog_head MATCHES "^flykernels \\(${PROJECT_VERSION}\\) ")
  message(WARNING "packaging/changelog.Debian: its first entry (${fly_changelog_head}) is not version "
                  "${PROJECT_VERSION}: add an entry for this version")
endif()
find_program(FLY_GZIP gzip)
set(fly_changelog_gz ${CMAKE_BINARY_DIR}/packaging/changelog.Debian.gz)
if(FLY_GZIP)
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/packaging)
  execute_process(COMMAND ${FLY_GZIP} -9n -c ${CMAKE_SOURCE_DIR}/packaging/changelog.Debian
                  OUTPUT_FILE ${fly_changelog_gz} RESULT_VARIABLE fly_gzip_rc)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/packaging/changelog.Debian)
  if(fly_gzip_rc EQUAL 0)
    foreach(entry ${fly_doc_packages})
      string(REPLACE "=" ";" entry "${entry}")
      list(GET entry 0 component)
      list(GET entry 1 package)
      install(FILES ${fly_changelog_gz} DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${package} COMPONENT ${component})
    endforeach()
  endif()
else()
  message(WARNING "gzip not found: the DEBs will have no changelog.Debian.gz")
endif()

# ---- CPack: `cpack --config <build>/CPackConfig.cmake` makes the TGZ (everything) and three DEBs.
set(CPACK_PACKAGE_NAME flykernels)
set(CPACK_PACKAGE_VENDOR FlyKernels)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(FLY_PACKAGE_CONTACT "FlyKernels maintainers <maintainers@flykernels.dev>" CACHE STRING
    "Maintainer field of the DEBs")
if(FLY_PACKAGE_CONTACT MATCHES "@localhost>$")  # the placeholder of earlier versions, kept in old caches
  set(FLY_PACKAGE_CONTACT "FlyKernels maintainers <maintainers@flykernels.dev>" CACHE STRING "Maintainer field of the DEBs" FORCE)
endif()
set(CPACK_PACKAGE_CONTACT "${FLY_PACKAGE_CONTACT}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "AOT-compiled Hopper kernels with a tuning database")
set(CPACK_PACKAGE_DESCRIPTION
    "GEMM, RMSNorm, TopK and attention kernels for NVIDIA Hopper (sm_90a), compiled ahead of time and \
embedded in one shared library with a C ABI; a SQLite tuning database picks the kernel per shape. \
The CUDA driver is loaded at run time: without a GPU the library loads and reports FLY_ERROR_NO_DEVICE.")
set(CPACK_GENERATOR "TGZ;DEB")
set(CPACK_COMPONENTS_ALL runtime dev)
if(FLY_BUILD_TOOLS)
  list(APPEND CPACK_COMPONENTS_ALL tools)
endif()
# TGZ: one relocatable tree of every component.
set(CPACK_ARCHIVE_COMPONENT_INSTALL OFF)
# DEB: one package per component, Debian names, declared dependencies (.ci/install_check.sh
# checks that they cover every library the packaged files link against).
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(fly_deb_version "${PROJECT_VERSION}")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${fly_deb_runtime})
# libc6 (>= V) is completed at cpack time from the newest GLIBC_ symbol version the packaged
# binaries use (packaging/cpack_project.cmake.in reads them with objdump): "libc6" here is the
# placeholder it replaces.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "libc6, libgcc-s1, libstdc++6, libsqlite3-0, libzstd1")
# The shared library is registered with the linker cache on install and removal: an
# `activate-noawait ldconfig` trigger (what debhelper emits for libraries), permissions as dpkg wants.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_SOURCE_DIR}/packaging/triggers)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libflykernels-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${fly_deb_runtime} (= ${fly_deb_version})")
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME flykernels-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "${fly_deb_runtime} (= ${fly_deb_version}), libc6, libgcc-s1, libstdc++6, libsqlite3-0")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "FlyKernels shared library (kernels and tuning database embedded)")
set(CPACK_COMPONENT_DEV_DESCRIPTION "FlyKernels headers (C ABI, C++ layer), CMake package and pkg-config file")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION "flyinfo, flytune, flybench and the suites and tuning spaces they read")
# At cpack time: libc6's minimum version from the binaries, and the DEB's .pc with prefix=/usr
# (a DEB is never moved, so its pkg-config output needs no ${pcfiledir}/../../.. paths; the TGZ and
# `cmake --install` keep the relocatable form).
set(FLY_PACKAGED_BINARIES $<TARGET_FILE:flykernels>)
if(FLY_BUILD_TOOLS)
  list(APPEND FLY_PACKAGED_BINARIES $<TARGET_FILE:flyinfo> $<TARGET_FILE:flytune> $<TARGET_FILE:flybench>)
endif()
find_program(FLY_OBJDUMP NAMES objdump ${CMAKE_OBJDUMP})
configure_file(${CMAKE_SOURCE_DIR}/packaging/cpack_project.cmake.in ${CMAKE_BINARY_DIR}/packaging/cpack_project.cmake.gen @ONLY)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/packaging/cpack_project.cmake
     INPUT ${CMAKE_BINARY_DIR}/packaging/cpack_project.cmake.gen)
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_BINARY_DIR}/packaging/cpack_project.cmake)
set(CPACK_PRE_BUILD_SCRIPTS ${CMAKE_SOURCE_DIR}/packaging/cpack_deb_pc.cmake)
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/build[^/]*/" "/__pycache__/")
include(CPack)
