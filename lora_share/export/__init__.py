"""Exporting the program: torch.export, XNNPACK lowering, and the ExecuTorch workarounds that keep it lean."""
