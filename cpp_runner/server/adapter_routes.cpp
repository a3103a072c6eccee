// Adapters added and removed while the server runs: POST /v1/adapters,
// DELETE /v1/adapters/NAME, and the folder watch's offers (adapter_watch.h),
// which register through the same App::add_adapter.
//
// Requests in flight finish on what they started with: a removed name is
// taken out of the served set first (new requests on it get 404 at once,
// /v1/models stops listing it), then ls_remove_adapter waits until no request
// uses the adapter and unloads it; DELETE answers after that.
#include <algorithm>
#include <iostream>
#include <utility>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "file_stem.h"
#include "http_app.h"
#include "status.h"

namespace lora_share::server {
namespace {

using nlohmann::json;

// The .pte a POST /v1/adapters body names: {"path": "..."}, a path on the
// server's machine, relative ones against the served folder.
StatusOr<std::string> posted_path(const std::string& body, const std::string& dir) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::usage("the body must be a JSON object: {\"path\": \"ADAPTER.pte\"}");
  for (const auto& item : j.items())
    if (item.key() != "path")
      return Status::usage("unknown field '" + item.key() + "': the body is {\"path\": \"ADAPTER.pte\"}");
  if (!j.contains("path") || !j["path"].is_string() || j["path"].get<std::string>().empty())
    return Status::usage(
        "path must be a non-empty string: the .pte to serve (relative paths are "
        "read in the served folder " +
        dir + ")");
  const std::string path = j["path"].get<std::string>();
  return path.front() == '/' ? path : dir + "/" + path;
}

std::string model_json(const std::string& name, bool deleted) {
  json out = {{"id", name}, {"object", "model"}};
  if (deleted)
    out["deleted"] = true;
  else
    out.update({{"created", 0}, {"owned_by", "lora-share"}});
  return out.dump();
}

}  // namespace

App::Added App::add_adapter(const std::string& pte) {
  Added added;
  added.name = file_stem(pte);
  if (added.name == LS_BASE_NAME) {
    added.http_status = 400;
    added.message = pte + ": 'base' (the file stem) names the foundation alone: rename the file";
    return added;
  }
  if (serves(added.name)) {
    added.http_status = 409;
    added.message = "an adapter named '" + added.name + "' is served already: DELETE /v1/adapters/" + added.name +
                    " first, or rename " + pte;
    return added;
  }
  ls_error err;
  ls_adapter* handle = ls_load_adapter(runtime_, pte.c_str(), &err);
  if (handle == nullptr) {
    added.code = err.code;
    // A file that is missing, damaged or built for another foundation is the request's fault.
    added.http_status = err.code == LS_ERR_BUDGET                                ? 507
                        : err.code == LS_ERR_LOAD || err.code == LS_ERR_ARGUMENT ? 400
                                                                                 : 500;
    added.message = err.message;
    return added;
  }
  std::lock_guard<std::mutex> lock(adapters_lock_);
  adapters_.push_back(added.name);
  removed_.erase(added.name);
  return added;
}

void App::offer_from_folder(const std::string& name, const std::string& pte) {
  std::lock_guard<std::mutex> registry(registry_lock_);
  if (serves(name) || removed_.count(name) != 0) return;
  const Added added = add_adapter(pte);
  if (added.http_status != 201) {
    std::cerr << "refused adapter " << name << ": " << ls_status_name(added.code) << ": " << added.message << std::endl;
    return;
  }
  std::cerr << "serving adapter " << added.name << " (added to " << dir_ << "/manifest.json)" << std::endl;
}

void App::post_adapter(const httplib::Request& req, httplib::Response& res) {
  auto pte = posted_path(req.body, dir_);
  if (!pte.ok()) return send_error(res, 400, "POST /v1/adapters: " + pte.status().message());
  std::lock_guard<std::mutex> registry(registry_lock_);
  const Added added = add_adapter(pte.value());
  if (added.http_status != 201) return send_error(res, added.http_status, "POST /v1/adapters: " + added.message);
  std::cerr << "serving adapter " << added.name << " (POST /v1/adapters " << pte.value() << ")" << std::endl;
  res.status = 201;
  res.set_content(model_json(added.name, /*deleted=*/false), kJson);
}

void App::delete_adapter(const httplib::Request& req, httplib::Response& res) {
  const std::string name = req.matches[1];
  if (name == LS_BASE_NAME)
    return send_error(res, 400, "'base' is the foundation alone, which every adapter runs on: it cannot be removed");
  std::lock_guard<std::mutex> registry(registry_lock_);
  {
    std::lock_guard<std::mutex> lock(adapters_lock_);
    auto& served = adapters_;
    auto it = std::find(served.begin(), served.end(), name);
    if (it == served.end())
      return send_error(res, 404, "no adapter called '" + name + "' is served: GET /v1/models lists them");
    served.erase(it);
    removed_.insert(name);
  }
  ls_error err;
  if (ls_remove_adapter(runtime_, name.c_str(), &err) != LS_OK)
    return send_error(res, err.code == LS_ERR_NOT_FOUND ? 404 : 500, err.message);
  std::cerr << "removed adapter " << name << " (DELETE /v1/adapters/" << name << ")" << std::endl;
  res.set_content(model_json(name, /*deleted=*/true), kJson);
}

}  // namespace lora_share::server
