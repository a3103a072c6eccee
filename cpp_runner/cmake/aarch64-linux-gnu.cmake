# Cross-compiling the runtime for aarch64 Linux on an x86-64 Debian host (make arm64):
# Debian's g++-aarch64-linux-gnu, the arm64 -dev packages installed with multiarch
# (dpkg --add-architecture arm64) under /usr/lib/aarch64-linux-gnu, and the executorch
# aarch64 wheel, unpacked and passed as CMAKE_PREFIX_PATH (it lies under "/").
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /)
# Programs (pkg-config) run on the host; libraries, headers and packages come from the target's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config must read the arm64 .pc files (PCRE2, utf8proc, cpp-httplib), never the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
