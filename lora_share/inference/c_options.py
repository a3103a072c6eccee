"""The per-request options of the C library beyond sampling (lora_share.h, STRUCTURED OUTPUT):
a constraint, OpenAI's logit_bias, logprobs with top_logprobs, and n choices, with the token-info
callback that reports each token's choice and log-probabilities.

``c_library.Runtime.generate_choices`` and ``check_options`` use these; nothing here adds behaviour:
the structs are the header's, field for field.
"""

from __future__ import annotations

import ctypes
import json
import math

# ls_constraint_kind, by the names a request gives them.
CONSTRAINT_KINDS = {"json_schema": 1, "json_object": 2, "grammar": 3, "regex": 4, "choices": 5}


class TokenInfo(ctypes.Structure):
    """ls_token_info."""

    _fields_ = [
        ("token", ctypes.c_int64),
        ("choice", ctypes.c_int32),
        ("logprob", ctypes.c_float),
        ("n_top", ctypes.c_int32),
        ("top_ids", ctypes.POINTER(ctypes.c_int64)),
        ("top_logprobs", ctypes.POINTER(ctypes.c_float)),
    ]


TOKEN_INFO_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(TokenInfo), ctypes.c_void_p)

# The fields ls_generate_options appends after cache_prompt, in order.
REQUEST_FIELDS = [
    ("constraint", ctypes.c_int),
    ("constraint_text", ctypes.c_char_p),
    ("choices", ctypes.POINTER(ctypes.c_char_p)),
    ("n_choices", ctypes.c_size_t),
    ("logit_bias_ids", ctypes.POINTER(ctypes.c_int64)),
    ("logit_bias_values", ctypes.POINTER(ctypes.c_double)),
    ("n_logit_bias", ctypes.c_size_t),
    ("logprobs", ctypes.c_int),
    ("top_logprobs", ctypes.c_int),
    ("n", ctypes.c_int),
    ("on_token_info", TOKEN_INFO_CALLBACK),
    ("token_info_user_data", ctypes.c_void_p),
    ("speculative", ctypes.c_int),
    ("prediction", ctypes.POINTER(ctypes.c_int64)),
    ("n_prediction", ctypes.c_size_t),
    ("drafted", ctypes.POINTER(ctypes.c_uint64)),
    ("accepted", ctypes.POINTER(ctypes.c_uint64)),
]


def set_request_options(
    opts,
    constraint: dict | None = None,
    logit_bias: dict | None = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    n: int = 1,
    speculative: bool = True,
    prediction: list[int] | None = None,
) -> list:
    """Fills ``opts`` (an ls_generate_options from ls_generate_options_init) with these options; returns
    the ctypes objects its pointers point into, which the caller keeps alive while the call runs.

    ``constraint``: one key, the kind, and its value: ``{"json_schema": schema}`` (a dict, dumped, or
    its JSON text), ``{"json_object": True}``, ``{"grammar": ebnf}``, ``{"regex": pattern}``,
    ``{"choices": [text, ...]}``. ``logit_bias``: ``{token id: bias}``. ``speculative`` False: no drafts;
    ``prediction``: the answer's ids as expected, drafted from (lora_share.h's SPECULATION)."""
    keep: list = []
    if constraint is not None:
        if not (isinstance(constraint, dict) and len(constraint) == 1 and next(iter(constraint)) in CONSTRAINT_KINDS):
            raise TypeError(f"constraint must be one of {{kind: value}} with kind in {sorted(CONSTRAINT_KINDS)}")
        kind, value = next(iter(constraint.items()))
        opts.constraint = CONSTRAINT_KINDS[kind]
        if kind == "choices":
            array = (ctypes.c_char_p * max(len(value), 1))(*[c.encode() for c in value])
            keep.append(array)
            opts.choices, opts.n_choices = array, len(value)
        elif kind != "json_object":
            text = value if isinstance(value, str) else json.dumps(value)
            keep.append(text.encode())
            opts.constraint_text = keep[-1]
    if logit_bias:
        ids = (ctypes.c_int64 * len(logit_bias))(*logit_bias.keys())
        values = (ctypes.c_double * len(logit_bias))(*logit_bias.values())
        keep += [ids, values]
        opts.logit_bias_ids, opts.logit_bias_values, opts.n_logit_bias = ids, values, len(logit_bias)
    opts.logprobs, opts.top_logprobs, opts.n = int(logprobs), top_logprobs, n
    opts.speculative = int(speculative)
    if prediction:
        ids = (ctypes.c_int64 * len(prediction))(*prediction)
        keep.append(ids)
        opts.prediction, opts.n_prediction = ids, len(prediction)
    return keep


class ChoiceCollector:
    """An on_token_info callback that gathers each choice's tokens and log-probabilities:
    ``choices[i]`` is ``{"tokens": [...], "logprobs": [...], "top_logprobs": [[(id, logprob), ...], ...]}``
    (the last two empty without logprobs)."""

    def __init__(self, n: int):
        self.choices = [{"tokens": [], "logprobs": [], "top_logprobs": []} for _ in range(n)]
        self.callback = TOKEN_INFO_CALLBACK(self._on_token)

    def _on_token(self, info_pointer, _user) -> int:
        info = info_pointer.contents
        choice = self.choices[info.choice]
        choice["tokens"].append(info.token)
        if not math.isnan(info.logprob):
            choice["logprobs"].append(info.logprob)
            choice["top_logprobs"].append([(info.top_ids[i], info.top_logprobs[i]) for i in range(info.n_top)])
        return 0
