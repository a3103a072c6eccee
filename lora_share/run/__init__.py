"""Running a deployment from Python: ExecuTorch's runtime, the C library, generation, verify, inspect."""
