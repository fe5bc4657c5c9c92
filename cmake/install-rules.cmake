# `cmake --install` produces a CMake package: find_package(corma), then link
# corma::corma, corma::ucx and corma::verbs (the backends that were built).
# corma::headers and corma::backend_kit come along because the static
# archives need them; neither has headers of its own in the package.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CORMA_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/corma")

install(TARGETS corma corma_headers corma_backend_kit EXPORT corma-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/corma DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT corma-targets NAMESPACE corma:: DESTINATION ${CORMA_INSTALL_CMAKEDIR})

set(CORMA_PACKAGE_WITH_UCX ${CORMA_WITH_UCX})
configure_package_config_file(cmake/corma-config.cmake.in
  "${PROJECT_BINARY_DIR}/corma-config.cmake"
  INSTALL_DESTINATION ${CORMA_INSTALL_CMAKEDIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/corma-config-version.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/corma-config.cmake"
              "${PROJECT_BINARY_DIR}/corma-config-version.cmake"
        DESTINATION ${CORMA_INSTALL_CMAKEDIR})
