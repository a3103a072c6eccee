// build/lora-share-server: parse flags -> open the deployment -> listen ->
// serve until SIGINT/SIGTERM.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

#include <httplib.h>
#include <sys/socket.h>

#include "deployment.h"
#include "http_app.h"
#include "server_flags.h"

namespace ls = lora_share;
namespace srv = lora_share::server;

namespace {

int fail(const ls::Status& status) {
  std::cerr << "error: " << status.message() << "\n";
  return static_cast<int>(status.code());
}

// The runtime for the deployment folder, under the budget.
ls::StatusOr<ls_runtime*> open_runtime(const srv::ServerOptions& options) {
  ls_options opts;
  ls_options_init(&opts);
  opts.budget_bytes = options.memory_budget;
  opts.parallel = options.parallel;
  opts.packed_cache = options.no_packed_cache ? 0 : 1;
  opts.packed_cache_dir = options.packed_cache.empty() ? nullptr : options.packed_cache.c_str();
  ls_error err;
  ls_runtime* runtime = ls_open_dir(options.dir.c_str(), &opts, &err);
  if (runtime == nullptr) {
    return err.code == LS_ERR_ARGUMENT || err.code == LS_ERR_BUDGET ? ls::Status::usage(err.message)
                                                                    : ls::Status::failure(err.message);
  }
  return runtime;
}

// Signals are taken by one thread with sigwait, which may then stop the
// server safely (a signal handler may not).
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

int main(int argc, char** argv) {
  auto options = srv::parse_server_flags(argc, argv);
  if (!options.ok()) return fail(options.status());
  if (options->help) {
    std::cout << srv::server_usage(argv[0]);
    return 0;
  }
  // Before any thread starts, so every thread inherits the mask.
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that left is a failed write, not a dead server

  auto deployment = srv::open_deployment(options->dir);
  if (!deployment.ok()) return fail(deployment.status());
  auto runtime = open_runtime(*options);
  if (!runtime.ok()) return fail(runtime.status());
  srv::App app(runtime.value(), std::move(deployment.value()));
  // Adapters added to the folder are served within a second, no restart.
  app.watch_folder(std::chrono::milliseconds(500));

  httplib::Server http;
  http.set_payload_max_length(options->max_body);
  // A streamed answer holds its connection's thread to the end, and a request
  // beyond --parallel holds one while it waits for a slot: threads for both,
  // and spare ones so /health and /v1/stats answer while every slot is busy.
  const size_t threads = std::max<size_t>(CPPHTTPLIB_THREAD_POOL_COUNT, 2 * options->parallel + 4);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's default sets SO_REUSEPORT, with which a second server on the
  // same port binds too and the kernel splits the traffic between the two.
  // SO_REUSEADDR alone only lets a restart reuse a port left in TIME_WAIT.
  int listen_fd = -1;
  http.set_socket_options([&listen_fd](int fd) {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = fd;
  });
  app.install(http);
  errno = 0;
  const int port = options->port == 0 ? http.bind_to_any_port(options->host)
                                      : (http.bind_to_port(options->host, options->port) ? options->port : -1);
  if (port < 0) {
    if (errno == EADDRINUSE) {
      return fail(ls::Status::failure("port " + std::to_string(options->port) + " is in use (on " + options->host +
                                      "), by another server or program: stop it or pick "
                                      "another --port"));
    }
    return fail(ls::Status::failure("cannot listen on " + options->host + ":" + std::to_string(options->port) + " (" +
                                    std::strerror(errno) +
                                    "; is it an address of this machine?): "
                                    "pick another --host or --port"));
  }
  // The library listens with a backlog of 5: connections beyond it would be
  // refused while a request runs. listen() again on the bound socket raises it.
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  std::thread([&http, signals] {
    int signal = 0;
    sigwait(&signals, &signal);
    http.stop();
  }).detach();
  std::cerr << "listening on http://" << options->host << ":" << port << " (" << options->dir << ")" << std::endl;
  http.listen_after_bind();
  return 0;
}
