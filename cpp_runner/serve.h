// --serve: one request per input line, "adapter<TAB>comma-separated ids";
// one JSON line per request on output. A bad request gets {"error": ...} and
// serving goes on; end of input ends it.
#pragma once

#include <istream>
#include <ostream>

#include "flags.h"
#include "session.h"
#include "status.h"

namespace lora_share {

Status serve(const Session& session, const Options& options, std::istream& in,
             std::ostream& out);

}  // namespace lora_share
