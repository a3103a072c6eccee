"""The checkpoint's tokenizer in a build: its files, its chat template as text pieces, text in and out."""
