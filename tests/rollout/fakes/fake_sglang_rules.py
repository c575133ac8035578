"""What an SGLang server does with a request, reproduced for `FakeSGLangServer`
(tests/rollout/fakes/fake_sglang.py).

Written from reading SGLang's own code in the released wheels (`pip download --no-deps
sglang==0.5.21` and `==0.5.23`); nothing here is copied from it. Each rule names the release, the
file (under `sglang/srt/` unless it says otherwise) and the line where that release does it. The
observable parts (status codes, body shapes, message texts) are reproduced exactly; how SGLang
arrives at them is not.

`RELEASES` are the releases emulated: 0.5.21 (the Dockerfile's pin) and 0.5.23 (the latest read).
Where they differ, the rule takes the release as an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

RELEASES = ("0.5.21", "0.5.23")
TOP_K_ALL = 1 << 30  # sampling/sampling_params.py 0.5.21 l. 40
_SAMPLING_EPS = 1e-6  # l. 39


class HTTPAnswer(Exception):
    """A request the server answers with an error: `status` and the JSON (or text) body it sends."""

    def __init__(self, status: int, payload: Any) -> None:
        super().__init__(f"HTTP {status}: {payload}")
        self.status = status
        self.payload = payload


def value_error(message: str) -> HTTPAnswer:
    """A ValueError raised while SGLang handles /generate: HTTP 400 `{"error": {"message": ...}}`
    (`_create_error_response`, entrypoints/http_server.py 0.5.21 l. 2143, 0.5.23 l. 2246)."""
    return HTTPAnswer(400, {"error": {"message": message}})


def internal_error() -> HTTPAnswer:
    """An exception SGLang does not catch (the /generate route catches ValueError only, http_server.py
    0.5.21 l. 953-960): Starlette's plain-text 500."""
    return HTTPAnswer(500, b"Internal Server Error")


def validation_error(message: str) -> HTTPAnswer:
    """A body FastAPI cannot parse into the route's request type: HTTP 400 with the `ErrorResponse`
    shape (`validation_exception_handler`, http_server.py 0.5.21 l. 613-669; `ErrorResponse`,
    entrypoints/openai/protocol.py 0.5.21 l. 100)."""
    return HTTPAnswer(400, {"object": "error", "message": message, "type": "Bad Request", "param": None,
                            "code": 400})


def not_found() -> HTTPAnswer:
    """An unknown route: FastAPI's HTTPException(404) through SGLang's handler (http_server.py 0.5.21
    l. 556-609): the `ErrorResponse` shape with `type` "404"."""
    return HTTPAnswer(404,
                      {"object": "error", "message": "Not Found", "type": "404", "param": None, "code": 404})


# ---- 0.5.23's contract gate ---------------------------------------------------------------------
# 0.5.23 checks every /generate body against the generated schema before anything else
# (`generate_contract_error`, entrypoints/api_contract.py 0.5.23 l. 12, called at http_server.py
# l. 937-939): a violation is HTTP 400 `{"error": "<serde-style text>"}`. `sampling_params` rejects
# unknown keys (`SamplingParams`, sglang/api/v1/api_types.py 0.5.23 l. 177-207; decoder l. 1259-1321,
# field order l. 1256); the request object itself ignores unknown keys (l. 236-278).

CONTRACT_SAMPLING_FIELDS: dict[str, str] = {  # name -> JSON kind, in the schema's order
    "max_new_tokens": "i64", "stop": "str_or_list", "stop_token_ids": "i64_list", "stop_regex": "str_or_list",
    "temperature": "f64", "top_p": "f64", "top_k": "i64", "min_p": "f64", "frequency_penalty": "f64",
    "presence_penalty": "f64", "repetition_penalty": "f64", "min_new_tokens": "i64", "n": "i64",
    "json_schema": "str", "regex": "str", "ebnf": "str", "structural_tag": "str", "ignore_eos": "bool",
    "skip_special_tokens": "bool", "spaces_between_special_tokens": "bool", "no_stop_trim": "bool",
    "stream_interval": "i64", "logit_bias": "map_f64", "sampling_seed": "i64", "custom_params": "any",
    "beam_width": "i64", "watermark": "map", "choice": "str_list",
}
CONTRACT_REQUEST_FIELDS: dict[str, str] = {  # the GenerateRequest fields swerl's client and the tests send
    "input_ids": "ids_or_batch", "stream": "bool", "return_logprob": "bool_or_list",
    "logprob_start_len": "i64_or_list", "text": "str_or_list",
}

_EXPECTED = {"i64": "i64", "f64": "f64", "bool": "a boolean", "str": "a string", "map": "a map",
             "map_f64": "a map"}


def _unexpected(v: Any) -> str:
    """serde's `Unexpected` display (api_types.py 0.5.23 l. 30-46)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else type(v).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_kind(v: Any, kind: str) -> None:
    ok = {"i64": _is_int(v), "f64": _is_int(v) or isinstance(v, float), "bool": isinstance(v, bool),
          "str": isinstance(v, str), "map": isinstance(v, dict), "any": True,
          "map_f64": isinstance(v, dict) and all(_is_int(x) or isinstance(x, float) for x in v.values()),
          "str_or_list": isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
          "str_list": isinstance(v, list) and all(isinstance(x, str) for x in v),
          "i64_list": isinstance(v, list) and all(_is_int(x) for x in v),
          "bool_or_list": isinstance(v, bool)
          or (isinstance(v, list) and all(isinstance(x, bool) for x in v)),
          "i64_or_list": _is_int(v) or (isinstance(v, list) and all(_is_int(x) for x in v)),
          "ids_or_batch": isinstance(v, list) and (all(_is_int(x) for x in v) or all(
              isinstance(r, list) and all(_is_int(x) for x in r) for r in v))}[kind]
    if not ok:
        raise HTTPAnswer(400, {"error": f"invalid type: {_unexpected(v)}, expected "
                                        f"{_EXPECTED.get(kind, 'a sequence')}"})


def unknown_field_message(key: str, fields: Iterable[str]) -> str:
    """serde's unknown-field text (api_types.py 0.5.23 l. 97-108)."""
    fs = tuple(fields)
    if not fs:
        return f"unknown field `{key}`, there are no fields"
    if len(fs) == 1:
        return f"unknown field `{key}`, expected `{fs[0]}`"
    if len(fs) == 2:
        return f"unknown field `{key}`, expected `{fs[0]}` or `{fs[1]}`"
    return f"unknown field `{key}`, expected one of " + ", ".join(f"`{f}`" for f in fs)


def contract_check(body: Any) -> None:
    """0.5.23's gate on a /generate body; raises the HTTP 400 it answers."""
    if not isinstance(body, dict):
        raise HTTPAnswer(400,
                         {"error": f"invalid type: {_unexpected(body)}, expected struct GenerateRequest"})
    for key, kind in CONTRACT_REQUEST_FIELDS.items():
        if body.get(key) is not None:
            _check_kind(body[key], kind)
    sps = body.get("sampling_params")
    if sps is None:
        return
    for sp in sps if isinstance(sps, list) else [sps]:
        if not isinstance(sp, dict):
            raise HTTPAnswer(400,
                             {"error": f"invalid type: {_unexpected(sp)}, expected struct SamplingParams"})
        for key, v in sp.items():
            if key not in CONTRACT_SAMPLING_FIELDS:
                raise HTTPAnswer(400, {"error": unknown_field_message(key, CONTRACT_SAMPLING_FIELDS)})
            if v is not None:
                _check_kind(v, CONTRACT_SAMPLING_FIELDS[key])


# ---- SamplingParams: construction, normalisation, verify ---------------------------------------

# The keyword arguments `SamplingParams(**kwargs)` takes (a msgspec Struct: API fields and internal
# ones alike; sampling/sampling_params.py 0.5.21 l. 123-162; 0.5.23 adds `watermark`, l. 181). Any
# other key is a TypeError there (`TokenizerManager._create_tokenized_object`,
# managers/tokenizer_manager.py 0.5.21 l. 1478, 0.5.23 l. 1565): HTTP 500 on 0.5.21, which has no
# contract gate in front.
_STRUCT_FIELDS_0521 = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
    "is_normalized", "ebnf_full_assistant",
)
STRUCT_FIELDS = {"0.5.21": _STRUCT_FIELDS_0521, "0.5.23": (*_STRUCT_FIELDS_0521, "watermark")}

DEFAULTS: dict[str, Any] = {  # the struct's defaults (sampling_params.py 0.5.21 l. 123-154)
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "stop_regex": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": TOP_K_ALL, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "beam_width": None, "json_schema": None,
    "regex": None, "ebnf": None, "structural_tag": None, "ignore_eos": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "no_stop_trim": False, "stream_interval": None, "logit_bias": None,
    "sampling_seed": None, "custom_params": None,
}
# `SamplingParams.__post_init__` (l. 164-222) puts the default back for these when a request sends null
_NULL_TO_DEFAULT = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                    "repetition_penalty", "min_new_tokens", "n", "ignore_eos", "skip_special_tokens",
                    "spaces_between_special_tokens", "no_stop_trim")


def sampling_params(kwargs: Mapping[str, Any], release: str, vocab_size: int,
                    preferred: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sampling parameters SGLang runs a request with: the request's `sampling_params` laid over
    the server's `--preferred-sampling-params` (tokenizer_manager.py 0.5.21 l. 1469-1472), built,
    normalised (`__post_init__`, sampling_params.py 0.5.21 l. 164-222) and verified (`verify`,
    l. 224-301). Raises the HTTPAnswer the server sends."""
    merged = {**(preferred or {}), **kwargs}
    unknown = [k for k in merged if k not in STRUCT_FIELDS[release]]
    if unknown:  # TypeError: Unexpected keyword argument
        raise internal_error()
    sp = {**DEFAULTS, **merged}
    for k in _NULL_TO_DEFAULT:
        if sp[k] is None:
            sp[k] = DEFAULTS[k]
    try:
        # stop_token_ids: a set of ints, None when empty (l. 174-178)
        ids = {int(t) for t in sp["stop_token_ids"] or () if t is not None}
        sp["stop_token_ids"] = ids or None
        sp["top_k"] = -1 if sp["top_k"] is None else sp["top_k"]  # l. 182
        for k in ("json_schema", "regex", "ebnf", "structural_tag"):  # empty grammar = unset (l. 211-214)
            sp[k] = sp[k] or None
        if 0 <= sp["temperature"] < _SAMPLING_EPS:  # greedy: temperature 1, top_k 1 (l. 217-220)
            sp["temperature"], sp["top_k"] = 1.0, 1
        if sp["top_k"] == -1:  # the whole vocabulary (l. 221-222)
            sp["top_k"] = TOP_K_ALL
        _verify(sp, vocab_size)
    except TypeError as e:  # a value of the wrong type reaches a comparison: not caught by SGLang
        raise internal_error() from e
    return sp


def _verify(sp: dict[str, Any], vocab_size: int) -> None:
    """`SamplingParams.verify` (sampling_params.py 0.5.21 l. 224-301, 0.5.23 l. 252): the checks
    and messages of the parameters a rollout client can send (grammar exclusivity included)."""
    def bad(message: str) -> HTTPAnswer:
        return value_error(message)

    if sp["beam_width"] is not None and sp["beam_width"] < 1:
        raise bad(f"beam_width must be at least 1, got {sp['beam_width']}.")
    if not math.isfinite(sp["temperature"]) or sp["temperature"] < 0.0:
        raise bad(f"temperature must be a non-negative finite number, got {sp['temperature']}.")
    if not 0.0 < sp["top_p"] <= 1.0:
        raise bad(f"top_p must be in (0, 1], got {sp['top_p']}.")
    if not 0.0 <= sp["min_p"] <= 1.0:
        raise bad(f"min_p must be in [0, 1], got {sp['min_p']}.")
    if sp["top_k"] < 1 or sp["top_k"] == -1:
        raise bad(f"top_k must be -1 (disable) or at least 1, got {sp['top_k']}.")
    for k in ("frequency_penalty", "presence_penalty"):
        if not -2.0 <= sp[k] <= 2.0:
            raise bad(f"{k} must be in [-2, 2], got {sp[k]}.")
    if not 0.0 < sp["repetition_penalty"] <= 2.0:
        raise bad(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {sp['repetition_penalty']}.")
    if not sp["min_new_tokens"] >= 0:
        raise bad(f"min_new_tokens must be in [0, max_new_tokens], got {sp['min_new_tokens']}.")
    if sp["max_new_tokens"] is not None:
        if sp["max_new_tokens"] < 0:
            raise bad(f"max_new_tokens must be at least 0, got {sp['max_new_tokens']}.")
        if not sp["min_new_tokens"] <= sp["max_new_tokens"]:
            raise bad(f"min_new_tokens must be in [0, max_new_tokens({sp['max_new_tokens']})], got "
                      f"{sp['min_new_tokens']}.")
    for token_id in sp["logit_bias"] or {}:
        if not 0 <= int(token_id) < vocab_size:
            raise bad(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}.")
    if sum(sp[k] is not None for k in ("json_schema", "regex", "ebnf", "structural_tag")) > 1:
        raise bad("Only one of json_schema, regex, ebnf, or structural_tag can be set.")


# ---- the request as a whole ---------------------------------------------------------------------


def prompts(body: Mapping[str, Any]) -> tuple[list[list[int]], bool]:
    """The prompts of a /generate body and whether it was a single one
    (`GenerateReqInput._validate_inputs` / `_determine_batch_size`, managers/io_struct.py 0.5.21
    l. 440-500). The double takes token-id prompts only (the tokenizer is the client's business)."""
    ids = body.get("input_ids")
    if body.get("text") is None and ids is None and body.get("input_embeds") is None:
        raise value_error("Either text, input_ids or input_embeds should be provided.")
    if ids is None:
        raise NotImplementedError("FakeSGLangServer takes input_ids prompts only")
    if (not isinstance(ids, list)
        or not (all(_is_int(x) for x in ids) or all(isinstance(r, list) for r in ids))):
        raise validation_error("input_ids: must be list[int] or list[list[int]]")
    if len(ids) == 0:
        raise value_error("input_ids cannot be empty.")  # io_struct.py 0.5.21 l. 489
    if _is_int(ids[0]):
        return [list(ids)], True
    return [list(r) for r in ids], False


def check_context(prompt_len: int, max_new_tokens: int | None, context_len: int) -> None:
    """`TokenizerManager._validate_one_request` (tokenizer_manager.py 0.5.21 l. 1259-1331, 0.5.23
    l. 1307): the prompt must be shorter than the context, and prompt + max_new_tokens must fit in it
    (no `--allow-auto-truncate`, no speculative tokens reserved)."""
    if prompt_len >= context_len:
        raise value_error(f"The input ({prompt_len} tokens) is longer than the model's context length "
                          f"({context_len} tokens).")
    if max_new_tokens is not None and max_new_tokens + prompt_len > context_len:
        total = max_new_tokens + prompt_len
        raise value_error(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. You "
            f"requested a total of {total} tokens: {prompt_len} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit.")


# ---- finishing ----------------------------------------------------------------------------------

ADDITIONAL_STOP_TOKEN_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")
"""Turn-end markers SGLang adds to a tokenizer's stop ids when its vocabulary has them
(`attach_additional_stop_token_ids`, utils/hf_transformers/common.py 0.5.21 l. 756-766, 0.5.23 l. 771)."""


def eos_token_ids(config: Mapping[str, Any], generation_config: Mapping[str, Any] | None,
                  tokenizer: Any) -> set[int]:
    """Every id that ends a generation unless `ignore_eos`: `eos_token_id` of config.json and of
    generation_config.json (`ModelConfig._get_hf_eos_token_id`, configs/model_config.py 0.5.21
    l. 1999-2017, 0.5.23 l. 2190), the tokenizer's EOS and its additional stop ids (checked in
    `Req._check_token_based_finish`, managers/schedule_batch.py 0.5.21 l. 1788-1798)."""
    out: set[int] = set()
    for cfg in (config, generation_config or {}):
        e = cfg.get("eos_token_id")
        out |= {e} if _is_int(e) else set(e or ())
    if getattr(tokenizer, "eos_token_id", None) is not None:
        out.add(int(tokenizer.eos_token_id))
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    out |= {added[t] for t in ADDITIONAL_STOP_TOKEN_TEXTS if t in added}
    return out


def stopping_ids(sp: Mapping[str, Any], eos_ids: set[int]) -> set[int]:
    """The ids that end this request: none with `ignore_eos` — `Req._check_token_based_finish`
    returns before it looks at any, `stop_token_ids` included (schedule_batch.py 0.5.21 l. 1783-1785,
    0.5.23 l. 1856-1858) — else `stop_token_ids` and the EOS ids (l. 1791-1798)."""
    if sp["ignore_eos"]:
        return set()
    return set(sp["stop_token_ids"] or ()) | eos_ids


def finish_reason(output_ids: list[int], stops: set[int], max_new_tokens: int) -> dict[str, Any]:
    """`finish_reason` of a finished request, as `to_json` writes it: `FINISH_MATCHED_TOKEN`
    `{"type": "stop", "matched": id}` or `FINISH_LENGTH` `{"type": "length", "length": n}`
    (schedule_batch.py 0.5.21 l. 270-316). A stop token beats the length cap in the same step
    (`update_finish_state`, l. 1919-1955)."""
    if output_ids and output_ids[-1] in stops:
        return {"type": "stop", "matched": output_ids[-1]}
    return {"type": "length", "length": max_new_tokens}


def trim_stop(output_ids: list[int], reason: Mapping[str, Any], no_stop_trim: bool) -> list[int]:
    """The ids the text is decoded from: the matched stop token is cut unless `no_stop_trim`
    (`DetokenizerManager.trim_matched_stop`, managers/detokenizer_manager.py 0.5.21 l. 189-219).
    `output_ids` themselves always keep it (`Req.output_ids_through_stop`, schedule_batch.py l. 1438)."""
    if _is_int(reason.get("matched")) and not no_stop_trim and output_ids:
        return output_ids[:-1]
    return output_ids


CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


def context_length(config: Mapping[str, Any]) -> int:
    """The context length SGLang derives from config.json without `--context-length`
    (`get_context_length`, utils/hf_transformers/common.py 0.5.21 l. 653-679): the first of
    `CONTEXT_LENGTH_KEYS`, times a rope-scaling factor unless the scaling names its original length
    or is llama3's; 2048 when none is set."""
    rope = config.get("rope_scaling") or {}
    factor = rope.get("factor", 1) if rope else 1
    if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if config.get(key) is not None:
            return int(factor * config[key])
    return 2048


# ---- API keys ----------------------------------------------------------------------------------------

ADMIN_OPTIONAL_ROUTES = frozenset({"/flush_cache", "/update_weights_from_disk", "/init_weights_update_group",
                                   "/begin_weight_update", "/end_weight_update",
                                   "/update_weights_from_distributed", "/pause_generation",
                                   "/continue_generation"})
"""The routes the double serves that SGLang marks `@auth_level(AuthLevel.ADMIN_OPTIONAL)`
(entrypoints/http_server.py 0.5.21 l. 988, 1243, 1347, 1401, 1416, 1431, 1741, 1754; the same in 0.5.23,
the pause routes at l. 1832, 1845); the
others (/generate, /model_info, /server_info, /health) are NORMAL (no marker)."""


def check_auth(method: str, path: str, authorization: str | None, api_key: str | None,
               admin_api_key: str | None) -> None:
    """The API-key middleware, installed when the server has `--api-key` or `--admin-api-key`
    (http_server.py 0.5.21 l. 2643-2654): `decide_request_auth` (utils/auth.py 0.5.21 = 0.5.23 l. 74-151)
    and the refusal (l. 192-204): 401 `{"error": "Unauthorized"}`. OPTIONS, /health*, /ready* and
    /metrics* always pass (l. 98-106); the key must come as `Authorization: Bearer <key>` (the scheme
    case-insensitive, l. 108-117). An admin-optional route wants the admin key when there is one, else
    the api key (l. 133-143); a normal route wants the api key when there is one (l. 148-151)."""
    if (not (api_key or admin_api_key) or method == "OPTIONS"
        or path.startswith(("/health", "/ready", "/metrics"))):
        return

    def bearer(expected: str) -> bool:
        parts = (authorization or "").split(" ", 1)
        return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == expected

    want = (admin_api_key or api_key) if path in ADMIN_OPTIONAL_ROUTES else api_key
    if want and not bearer(want):
        raise HTTPAnswer(401, {"error": "Unauthorized"})
