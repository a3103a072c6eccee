"""Reading checkpoints: the foundation (Hugging Face folder, GGUF, synthetic) and LoRA adapters (PEFT, synthetic)."""
