"""Run a program's ``forward`` on tensors: .npy files in, .npy (one output) or .npz (several) out,
through ExecuTorch's Python runtime (the same files build/runner reads)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..formats.layout import SCALAR_TYPES
from ..inference.python_runtime import _explain, _native_stderr, _require_file


class LoadedProgram:
    """A program .pte loaded against its deployment's foundation.ptd."""

    def __init__(self, pte: Path, ptd: Path):
        import torch  # noqa: F401  (registers the tensor types the runtime returns)
        from executorch.runtime import Runtime

        self.pte, self.ptd = _require_file(pte, "--pte"), _require_file(ptd, "--ptd")
        with _native_stderr() as log:
            try:
                program = Runtime.get().load_program(str(self.pte), data_path=str(self.ptd))
                self.forward = program.load_method("forward")
                meta = program.metadata("forward")
                failure = None
            except RuntimeError as e:
                failure = e
        if failure is not None:
            raise UserError(f"could not load {self.pte} with {self.ptd}: {_explain(failure, log.lines())}")
        self.inputs = [
            (tuple(meta.input_tensor_meta(i).sizes()), SCALAR_TYPES[meta.input_tensor_meta(i).dtype()][0])
            for i in range(meta.num_inputs())
        ]

    def check(self, arrays: list[np.ndarray], names: list[str]) -> None:
        """Each array has the shape and dtype forward takes at its position; else one error naming it."""
        if len(arrays) != len(self.inputs):
            raise UserError(
                f"{self.pte}: forward takes {len(self.inputs)} input(s) "
                f"({', '.join(_describe(s, d) for s, d in self.inputs)}), got {len(arrays)} --input"
            )
        for i, (a, name, (shape, dtype)) in enumerate(zip(arrays, names, self.inputs)):
            if a.dtype.name != dtype or tuple(a.shape) != shape:
                raise UserError(
                    f"{name}: input {i} of {self.pte.name}'s forward is {_describe(shape, dtype)}, "
                    f"this file holds {_describe(a.shape, a.dtype.name)}"
                )

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """forward's outputs for ``arrays`` (checked by ``check``)."""
        import torch

        outs = self.forward.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        return [o.numpy().copy() if isinstance(o, torch.Tensor) else np.asarray(o) for o in outs]


def _describe(shape, dtype: str) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


def read_inputs(paths: list[Path]) -> list[np.ndarray]:
    """The .npy files, in order (no pickled objects)."""
    arrays = []
    for path in paths:
        try:
            array = np.load(_require_file(Path(path), "--input"), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise UserError(f"--input {path}: not a .npy file of plain numbers ({e})") from None
        if not isinstance(array, np.ndarray):  # a .npz archive
            array.close()
            raise UserError(f"--input {path}: a .npz archive; give one .npy file per input, in forward's order")
        arrays.append(array)
    return arrays


def write_outputs(path: Path, outputs: list[np.ndarray]) -> None:
    """One output as .npy, several as .npz (output_0, output_1, ...); written whole or not at all."""
    path = Path(path)
    several = len(outputs) > 1
    if several and path.suffix != ".npz":
        raise UserError(f"--output {path}: forward returns {len(outputs)} tensors: name a .npz file")
    if not several and path.suffix != ".npy":
        raise UserError(f"--output {path}: forward returns one tensor: name a .npy file")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            if several:
                np.savez(f, **{f"output_{i}": o for i, o in enumerate(outputs)})
            else:
                np.save(f, outputs[0])
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"--output {path}: cannot write: {e.strerror}") from None


def run_files(pte: Path, ptd: Path, inputs: list[Path], output: Path | None) -> list[np.ndarray]:
    """``lora-share run --input ... [--output ...]``: forward of ``pte`` on the .npy ``inputs``."""
    arrays = read_inputs(inputs)
    program = LoadedProgram(pte, ptd)
    program.check(arrays, [f"--input {p}" for p in inputs])
    outputs = program.run(arrays)
    if output is not None:
        write_outputs(output, outputs)
    return outputs
