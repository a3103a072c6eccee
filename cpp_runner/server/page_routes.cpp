// GET / and GET /page/NAME: the page's files from the table page/embed.cmake
// generates. Each answer carries a Content-Security-Policy that allows
// nothing but this server: no script, style, font, image or connection from
// another host, no inline script, and no framing by another site, so the page
// can do in a browser only what the API already lets any client do.
#include <httplib.h>

#include "http_app.h"
#include "page_assets.h"

namespace lora_share::server {
namespace {

constexpr char kPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

void send_asset(const PageAsset& asset, httplib::Response& res) {
  res.set_header("Content-Security-Policy", kPolicy);
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  // The files change with the binary: the browser asks again on each load.
  res.set_header("Cache-Control", "no-cache");
  res.set_content(reinterpret_cast<const char*>(asset.data), asset.size, asset.content_type);
}

}  // namespace

const PageAsset* find_page_asset(const std::string& name) {
  for (const PageAsset& asset : page_assets())
    if (name == asset.name) return &asset;
  return nullptr;
}

void install_page(httplib::Server& http) {
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    const PageAsset* index = find_page_asset("index.html");
    if (index == nullptr) return send_error(res, 500, "this server was built without its page (index.html)");
    send_asset(*index, res);
  });
  http.Get(R"(/page/(.*))", [](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    const PageAsset* asset = find_page_asset(name);
    if (asset == nullptr) {
      return send_error(res, 404,
                        "no page file called '" + name + "': /page/ serves the page's own files only (GET / opens it)");
    }
    send_asset(*asset, res);
  });
}

}  // namespace lora_share::server
