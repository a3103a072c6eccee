// The server's own page (GET /): its files, built into the binary from
// server/page/ by page/embed.cmake, and the routes that serve them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace httplib {
class Server;
}  // namespace httplib

namespace lora_share::server {

struct PageAsset {
  const char* name;          // the file's name in server/page/ ("index.html")
  const char* content_type;  // from its extension
  const unsigned char* data;
  size_t size;
};

// Every file of the page (generated page_assets.cpp).
const std::vector<PageAsset>& page_assets();

// The asset called exactly `name`, or nullptr: the lookup is by name in the
// table, never a path on disk, so "../x" or "a/b" cannot reach anything else.
const PageAsset* find_page_asset(const std::string& name);

// GET / (index.html) and GET /page/NAME (the other files); an unknown name is
// a 404. The page calls the public API only: it adds no route of its own.
void install_page(httplib::Server& http);

}  // namespace lora_share::server
