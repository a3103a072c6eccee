// build/runner --input: a program built from PT2 archives, its forward run
// once on .npy tensors through the C API (ls_load_program, ls_run_program).
#pragma once

#include "flags.h"
#include "status.h"

namespace lora_share {

// Opens --ptd, loads every --pte against it (the shared tensors mapped and
// packed once), runs the --adapter's program (default: the first) on the
// --input files, prints each output's shape and writes them to --output.
Status run_program_mode(const Options& options);

}  // namespace lora_share
