"""Lower one program: XNNPACK where it can, ExecuTorch's portable kernels elsewhere, its shared
tensors external (to foundation.ptd, under their content keys) and the rest inside its .pte."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError
from ..export.program import FOUNDATION_TAG, _quiet_logs
from .sharing import content_key, state_tensors


@dataclass
class Lowered:
    pte: bytes
    external: dict[str, tuple]  # key -> (bytes, formats.layout.TensorLayout or None) it reads from foundation.ptd
    shared_fqns: dict[str, str]  # FQN in the archive -> key, of the tensors it takes from foundation.ptd


def _rename_shared(ep: torch.export.ExportedProgram, shared: set[str]) -> dict[str, str]:
    """Rename each shared tensor of ``ep`` to its content key (the name its data gets in foundation.ptd).
    Returns FQN -> key of those renamed."""
    tensors = state_tensors(ep)
    ep._state_dict, ep._constants = dict(ep.state_dict), dict(ep.constants)  # the archive's program keeps its names
    renamed = {}
    for spec in ep.graph_signature.input_specs:
        if spec.target not in tensors or spec.target in renamed:
            continue
        key = content_key(tensors[spec.target])
        if key not in shared or (key in ep.state_dict or key in ep.constants) and key != spec.target:
            continue  # not shared, or a second name for bytes already renamed: kept as it is
        store = ep._state_dict if spec.target in ep.state_dict else ep._constants
        store[key] = store.pop(spec.target)
        renamed[spec.target] = key
        spec.target = key
    return renamed


def _check_static(ep: torch.export.ExportedProgram, what: str) -> None:
    """The runtimes plan every activation ahead: a dynamic input size must have an upper bound."""
    from torch.utils._sympy.numbers import int_oo

    for name, r in ep.range_constraints.items():
        if r.upper == int_oo or not r.upper.is_number or int(r.upper) > 1 << 31:
            raise UserError(
                f"{what}: a dynamic size ({name}) has no upper bound, so its memory cannot be planned: "
                "export with torch.export.Dim(..., max=N), or with static shapes"
            )


def lower(ep: torch.export.ExportedProgram, shared: set[str], workdir: Path, what: str) -> Lowered:
    """``ep`` lowered to an ExecuTorch program; tensors whose content key is in ``shared`` are external."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.pass_base import PassResult

    from ..formats import read_ptd

    _check_static(ep, what)
    ep = ep.run_decompositions({})  # the archive may hold a pre-dispatch (training) IR graph
    renamed = _rename_shared(ep, shared)
    keys = set(renamed.values())

    def is_shared(node: torch.fx.Node) -> bool:
        # Lowering names a state placeholder after its target (p_<key>, b_<key>, c_<key>), and the
        # targets of the shared tensors are their keys.
        return node.op == "placeholder" and node.name.split("_", 1)[-1] in keys

    def tag(gm: torch.fx.GraphModule):
        for node in gm.graph.nodes:
            if is_shared(node):
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = FOUNDATION_TAG
        return PassResult(gm, True)

    def external(node: torch.fx.Node):
        return FOUNDATION_TAG if is_shared(node) else None

    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with torch.no_grad(), warnings.catch_warnings(), _quiet_logs():
            warnings.simplefilter("ignore")
            edge = to_edge_transform_and_lower(
                ep,
                transform_passes=[tag],
                partitioner=[XnnpackPartitioner()],
                compile_config=EdgeCompileConfig(_check_ir_validity=False),
            )
            program = edge.to_executorch(ExecutorchBackendConfig(external_constants=external))
            program.write_tensor_data_to_file(str(workdir))
    except UserError:
        raise
    except Exception as e:  # an op or a graph ExecuTorch cannot lower: name the program, not our stack
        raise UserError(
            f"{what}: ExecuTorch cannot lower this program ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    ptd = workdir / f"{FOUNDATION_TAG}.ptd"
    data = {}
    if ptd.is_file():
        read = read_ptd(ptd)
        data = {e.key: (read.data(e.key), e.layout) for e in read.entries}
        ptd.unlink()
    return Lowered(program.buffer, data, renamed)
