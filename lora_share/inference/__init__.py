"""Using a deployment from Python: inference through ExecuTorch's runtime or the C library, generation, verify,
inspect."""
