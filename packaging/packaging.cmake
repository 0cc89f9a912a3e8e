# CMake package config, pkg-config file and CPack settings.
include(CMakePackageConfigHelpers)
install(EXPORT flykernelsTargets NAMESPACE flykernels:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flykernels)
configure_package_config_file(${CMAKE_SOURCE_DIR}/packaging/flykernelsConfig.cmake.in
  ${CMAKE_BINARY_DIR}/flykernelsConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flykernels)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/flykernelsConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/flykernelsConfig.cmake ${CMAKE_BINARY_DIR}/flykernelsConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flykernels)
configure_file(${CMAKE_SOURCE_DIR}/packaging/flykernels.pc.in ${CMAKE_BINARY_DIR}/flykernels.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/flykernels.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
set(CPACK_PACKAGE_NAME flykernels)
set(CPACK_PACKAGE_VENDOR FlyKernels)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "AOT-compiled Hopper kernels with a tuning database")
set(CPACK_GENERATOR TGZ)
include(CPack)
