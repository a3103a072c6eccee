"""lora-share: one shared foundation.ptd, one small .pte per LoRA adapter, on ExecuTorch.

Python API (the CLI calls the same functions)::

    import lora_share
    lora_share.validate("configs/llama_adapters.yaml")      # -> BuildConfig, or raises ConfigErrors
    manifest = lora_share.build("configs/llama_adapters.yaml")
    gen = lora_share.run("out/llama_adapters/counter.pte", "out/llama_adapters/foundation.ptd", [1, 17, 42])
    rt = lora_share.Runtime("out/smollm2")                   # the C library, in-process: no torch needed
    rt.create_chat_completion([{"role": "user", "content": "Hi"}], adapter="brief")
"""

import logging

# torchao (pulled in by executorch) logs optional CUDA kernels it cannot load, and torch
# warns about its Enum registration; neither concerns a CPU export, so keep the CLI readable.
logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

from .errors import ConfigErrors, UserError  # noqa: E402


def build(config_path, quiet: bool = False) -> dict:
    """Build every output of a config file (a foundation and adapters, or programs from PT2
    archives); returns the manifest."""
    from .config import load_config

    if load_config(config_path).programs is not None:
        from .programs.build import build_programs

        return build_programs(config_path, quiet=quiet)
    from .deploy.builder import build as _build

    return _build(config_path, quiet=quiet)


def run(pte, ptd, tokens, max_new_tokens: int = 16, temperature: float = 0.0, seed: int = 0, shared_ptd=None):
    """Generate with an adapter .pte over a foundation .ptd through ExecuTorch's Python runtime
    (``shared_ptd``: the build's adapters_shared.ptd, for adapters that read tensors from it).

    ``tokens`` is a text prompt (a str, encoded with the build's tokenizer beside ``ptd``, as
    ``lora-share run --prompt``) or a list of token ids."""
    from .inference.python_runtime import run as _run

    if isinstance(tokens, str):
        from .tokenizer.files import bind_tokenizer
        from .tokenizer.text import encode_prompt

        tokens = encode_prompt(bind_tokenizer(ptd), tokens, flag="tokens")
    elif not isinstance(tokens, (list, tuple)) or not all(isinstance(t, int) for t in tokens):
        raise TypeError(
            f"lora_share.run: tokens must be a text prompt (str) or a list of token ids (ints), "
            f"got {type(tokens).__name__} {tokens!r:.60}"
        )
    if not isinstance(max_new_tokens, int):
        raise TypeError(f"lora_share.run: max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    return _run(pte, ptd, list(tokens), max_new_tokens, temperature, seed, shared_ptd=shared_ptd)


def __getattr__(name: str):
    """Imported on first use: ``Runtime`` (the C library, no torch: all a wheel install needs) and
    ``validate`` (the config loader) do not pull each other's dependencies in."""
    if name in ("Runtime", "NativeError"):
        from .inference import runtime

        return getattr(runtime, name)
    if name == "validate":
        from .config import load_config

        return load_config
    raise AttributeError(f"module 'lora_share' has no attribute {name!r}")


__all__ = ["build", "run", "validate", "Runtime", "NativeError", "ConfigErrors", "UserError"]
