# kilnd and the gRPC layer it serves (included from server/CMakeLists.txt).

kiln_cc_library(kiln_server
  SRCS
    ${CMAKE_CURRENT_LIST_DIR}/service.cc
  DEPS
    kiln_wire
    kiln_auth
    kiln_compile_service
    kiln_ext
    kiln_proto
    PkgConfig::GRPCPP
    absl::status
    absl::synchronization
    absl::time
    spdlog::spdlog)

# The Prometheus /metrics endpoint (cpp-httplib), beside gRPC.
kiln_cc_library(kiln_metrics
  SRCS ${CMAKE_CURRENT_LIST_DIR}/metrics.cc
  DEPS kiln_proto PkgConfig::CPPHTTPLIB absl::status absl::statusor absl::strings
    absl::str_format Threads::Threads)

add_executable(kilnd ${CMAKE_CURRENT_LIST_DIR}/main.cc ${CMAKE_CURRENT_LIST_DIR}/flags.cc)
target_link_libraries(kilnd PRIVATE
  kiln_server
  kiln_auth
  kiln_metrics
  kiln_compile_service
  kiln_ext
  kiln_worker
  kiln_store
  kiln_tiered_store
  kiln_shared
  ${GRPCPP_REFLECTION}
  absl::flags
  absl::flags_config
  absl::flags_parse
  absl::flags_usage
  absl::strings
  absl::time
  spdlog::spdlog
  Threads::Threads)

# The health probe containers and scripts run against kilnd's gRPC health service.
add_executable(kiln_health_probe ${CMAKE_CURRENT_LIST_DIR}/health_probe.cc)
target_link_libraries(kiln_health_probe PRIVATE PkgConfig::GRPCPP)
if(TARGET kiln-nvrtc)
  add_dependencies(kilnd kiln-nvrtc)
endif()
