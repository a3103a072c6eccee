# xgrammar's C++ core (Apache-2.0), built from its PyPI sdist into a static
# library that liblora_share links with its symbols hidden: the grammar engine
# behind structured output (runtime/constraint/, docs/structured-output.md).
# No Python at run time and no source of it in the repository: the sdist is
# downloaded once, its sha256 checked, into <repo>/.cache/ (gitignored, shared
# by the x86 and aarch64 builds) and unpacked into this build folder.
set(LORA_SHARE_XGRAMMAR_VERSION 0.2.8)
set(LORA_SHARE_XGRAMMAR_SHA256 8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80)
set(LORA_SHARE_XGRAMMAR_URL
  "https://files.pythonhosted.org/packages/03/0f/29f521535729be740779c2c98b630ef6607cf28be9b669895dd2b821ff63/xgrammar-${LORA_SHARE_XGRAMMAR_VERSION}.tar.gz")
set(LORA_SHARE_CACHE_DIR "${CMAKE_CURRENT_SOURCE_DIR}/../.cache" CACHE PATH
  "Folder for downloaded third-party sources (the xgrammar sdist)")

set(_xgrammar_archive "${LORA_SHARE_CACHE_DIR}/xgrammar-${LORA_SHARE_XGRAMMAR_VERSION}.tar.gz")
if(NOT EXISTS "${_xgrammar_archive}")
  message(STATUS "Downloading the xgrammar ${LORA_SHARE_XGRAMMAR_VERSION} sdist from PyPI")
  # A temporary name, renamed once the hash matched: an interrupted download leaves nothing behind.
  file(DOWNLOAD "${LORA_SHARE_XGRAMMAR_URL}" "${_xgrammar_archive}.part"
    EXPECTED_HASH SHA256=${LORA_SHARE_XGRAMMAR_SHA256} STATUS _status TLS_VERIFY ON)
  list(GET _status 0 _code)
  if(NOT _code EQUAL 0)
    file(REMOVE "${_xgrammar_archive}.part")
    message(FATAL_ERROR "Downloading ${LORA_SHARE_XGRAMMAR_URL} failed: ${_status}")
  endif()
  file(RENAME "${_xgrammar_archive}.part" "${_xgrammar_archive}")
endif()
# The cached file is checked again: a damaged cache must not build.
file(SHA256 "${_xgrammar_archive}" _hash)
if(NOT _hash STREQUAL LORA_SHARE_XGRAMMAR_SHA256)
  message(FATAL_ERROR "${_xgrammar_archive} has sha256 ${_hash}, not ${LORA_SHARE_XGRAMMAR_SHA256}: delete it "
    "and configure again to download it")
endif()

set(_xgrammar_source "${CMAKE_BINARY_DIR}/xgrammar-${LORA_SHARE_XGRAMMAR_VERSION}")
if(NOT EXISTS "${_xgrammar_source}/CMakeLists.txt")
  file(ARCHIVE_EXTRACT INPUT "${_xgrammar_archive}" DESTINATION "${CMAKE_BINARY_DIR}")
endif()

# xgrammar's CMakeLists reads config.cmake from the top build folder first (its
# own cmake/config.cmake turns the Python bindings and a tvm_ffi lookup on). It
# is included in xgrammar's directory scope, before its flags are set, so
# what it appends stays there:
#   - no Python bindings: the static `xgrammar` target alone;
#   - its install rules skipped (they would put libxgrammar.a and its headers
#     into lora-share's package): the switch its CMakeLists reads for wheels;
#   - no LTO (-flto=auto otherwise: objects the cross linker and ar would need
#     a plugin for), symbols hidden (liblora_share exports its C API alone);
#   - its log lines and fatal errors go through lora-share's handlers
#     (runtime/constraint/xgrammar_log.cpp): a library must not print, and a
#     schema keyword xgrammar ignores with a warning becomes a refusal.
file(WRITE "${CMAKE_BINARY_DIR}/config.cmake" "# Written by cpp_runner/cmake/xgrammar.cmake.
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
set(SKBUILD ON)
string(APPEND CMAKE_CXX_FLAGS \" -fno-lto -fvisibility=hidden -fvisibility-inlines-hidden\")
add_compile_definitions(XGRAMMAR_LOG_CUSTOMIZE=1)
")
add_subdirectory("${_xgrammar_source}" "${CMAKE_BINARY_DIR}/xgrammar" EXCLUDE_FROM_ALL)
set_target_properties(xgrammar PROPERTIES POSITION_INDEPENDENT_CODE ON)
# Its headers as system headers for its users: lora-share's -Wall -Wextra are for its own code.
set_property(TARGET xgrammar APPEND PROPERTY INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_xgrammar_source}/include"
  "${_xgrammar_source}/3rdparty/dlpack/include" "${_xgrammar_source}/3rdparty/picojson")
# Its public compile definitions (XGRAMMAR_ENABLE_CPPTRACE=0, ...) reach lora_share
# through the target; XGRAMMAR_LOG_CUSTOMIZE is for its sources and ours.
target_compile_definitions(xgrammar PUBLIC XGRAMMAR_LOG_CUSTOMIZE=1)
