"""The decoder lora-share exports, its families, its LoRA envelope and quantization."""
