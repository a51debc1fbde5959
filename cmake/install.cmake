# `cmake --install build --prefix P`: the flashtune CMake package.
#   P/include/flashtune/attention.h, attention.hpp          the runtime's C ABI and C++ interface
#   P/include/flashtune/{core,results,worker,tuner,process,reference,templates,configs/generated}/   the libraries'
#       headers (the source tree's folders), the kernel templates and the generated config tables (include
#       <flashtune/configs/generated/dispatch.hpp> with flashtune::tuner linked: its include path holds
#       templates/ for tuned_config.h)
#   P/lib/libflashtune_attention.so (flashtune::attention), libflashtune_tuner.a (flashtune::tuner, with
#   libflashtune_results.a, libflashtune_worker.a, libflashtune_core.a and libflashtune_process.a under it),
#   libflashtune_reference.a (flashtune::reference); P/bin/flashtune and flashtune-worker
#   P/lib/cmake/flashtune/flashtuneConfig.cmake, ...ConfigVersion.cmake, and one targets file per
#       component (flashtune{Attention,Reference,Tuner}Targets.cmake), so that a consumer of
#       flashtune::attention alone loads nothing that needs SQLite3 or NVRTC's development files
# The templates are embedded in the libraries, so nothing here reads the source tree at run time
# (except `flashtune report`, which runs reports/make_report.py from the source tree it was built in).
include(CMakePackageConfigHelpers)

set_target_properties(flashtune_tuner PROPERTIES EXPORT_NAME tuner)
set_target_properties(flashtune_results PROPERTIES EXPORT_NAME results)
set_target_properties(flashtune_worker PROPERTIES EXPORT_NAME worker)
set_target_properties(flashtune_core PROPERTIES EXPORT_NAME core)
set_target_properties(flashtune_process PROPERTIES EXPORT_NAME process)
set_target_properties(flashtune_reference PROPERTIES EXPORT_NAME reference)
add_library(flashtune::tuner ALIAS flashtune_tuner)
add_library(flashtune::reference ALIAS flashtune_reference)

install(TARGETS flashtune_attention EXPORT flashtuneAttentionTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS flashtune_reference EXPORT flashtuneReferenceTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS flashtune_tuner flashtune_results flashtune_worker flashtune_core flashtune_process
        EXPORT flashtuneTunerTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS flashtune flashtune-worker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(FT_INC ${CMAKE_INSTALL_INCLUDEDIR}/flashtune)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/flashtune/ DESTINATION ${FT_INC} FILES_MATCHING PATTERN "*.h*")
foreach(dir core results worker tuner process)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${FT_INC}/${dir} FILES_MATCHING PATTERN "*.hpp")
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/reference/attention_ref.hpp DESTINATION ${FT_INC}/reference)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/templates/ DESTINATION ${FT_INC}/templates
        FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/generated/ DESTINATION ${FT_INC}/configs/generated
        FILES_MATCHING PATTERN "*.hpp")

set(FT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashtune)
foreach(set Attention Reference Tuner)
  install(EXPORT flashtune${set}Targets NAMESPACE flashtune:: DESTINATION ${FT_CMAKE_DIR})
endforeach()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashtuneConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/flashtuneConfig.cmake INSTALL_DESTINATION ${FT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashtuneConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashtuneConfig.cmake ${PROJECT_BINARY_DIR}/flashtuneConfigVersion.cmake
        DESTINATION ${FT_CMAKE_DIR})
