"""The OpenAPI the server publishes: one request schema per served model for every analysis (so that the schema says
what the server takes), each analysis' example from its registry entry, the corpus job's request, and the streamed
lines' schemas."""
from __future__ import annotations

import copy

from ..analyses.atlas import JobRequest
from ..analyses.generate import GenerateDone, GeneratedToken
from ..analyses.registry import ANALYSES
from .schemas import ModelInfo


def with_job_request(openapi: dict) -> dict:
    """The OpenAPI with JobRequest's schema (and those it refers to) among its components: POST /api/jobs reads its
    body itself (app/routers.py), and its requestBody refers to JobRequest by name."""
    schema = JobRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components["JobRequest"] = schema
    return openapi


def per_model(openapi: dict, models: list[ModelInfo], max_mask_tokens: int, max_new_tokens: int = 256) -> dict:
    """The OpenAPI with one schema per served model for every request body, so that the schema says what the server
    takes. The operations take `<Request>ByModel`, one of `<Request>.<model>`: each fixes `model` (the default
    model's may leave it out) and bounds every layer, head and token index by that model's own `layers`, `heads` and
    `max_tokens`, takes `text_pair` only for a model with `pair`, and at most ATTNSCOPE_MAX_MASK_TOKENS masked
    tokens (a generation: at most ATTNSCOPE_MAX_NEW_TOKENS new ones, and `chat` only where the model has a template). The generic `<Request>` stays, every field documented, its indices bounded by the largest served model.
    What depends on the text itself (a mask index past its last token, an answer too big for its wire form, the
    character limit) is checked per request and refused with a message naming it. With no models loaded the schema
    keeps its generic form."""
    _stream_schemas(openapi)
    _integer_bounds(openapi)
    if not models:
        return openapi
    schemas = openapi.get("components", {}).get("schemas", {})
    _bound_generic(schemas, models)
    requests = {a.request.__name__: a for a in ANALYSES.values()}
    for name, analysis in requests.items():
        generic = schemas.get(name)
        flag, words = analysis.needs or (None, "")
        served = [m for m in models if (flag is None or getattr(m, flag))       # and its record allows it (tiny-gpt:
                  and m.capabilities.features.get(analysis.name) is not False]  # no lens, it predicts no next token)
        if generic is None or not served:
            continue
        for m in served:
            schemas[f"{name}.{m.id}"] = _variant(generic, analysis, m, max_mask_tokens, max_new_tokens, schemas)
        schemas[f"{name}ByModel"] = {
            "title": f"{name} (one schema per served model)", "description": generic.get("description", "") +
            f" The fields of {name}, with the ranges of the model `model` names" + (
                f" (the models with {words})." if flag else "."),
            "oneOf": [{"$ref": f"#/components/schemas/{name}.{m.id}"} for m in served],
            "examples": [_example(analysis, served[0])]}
    for item in openapi.get("paths", {}).values():
        for op in item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            name = body.get("$ref", "").rsplit("/", 1)[-1]
            if name in requests and f"{name}ByModel" in schemas:
                body["$ref"] = f"#/components/schemas/{name}ByModel"
    return openapi


def _integer_bounds(node) -> None:
    """An integer's bounds written as integers: FastAPI's OpenAPI model writes every bound as a float (64.0). The API
    takes 45.0 for the integer 45, as JSON Schema does, but a schema's integer bounds read best as integers."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
                if isinstance(node.get(key), float) and node[key].is_integer():
                    node[key] = int(node[key])
        for value in node.values():
            _integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _integer_bounds(value)


def _bound_generic(schemas: dict, models: list[ModelInfo]) -> None:
    """The generic request schemas: every layer, head and token index bounded by the largest served model."""
    top = {"layers": max(m.layers for m in models) - 1, "heads": max(m.heads for m in models) - 1,
           "mask_tokens": max(m.max_tokens for m in models) - 1}
    top |= {"layer": top["layers"], "head": top["heads"]}
    note = {"layers": "layers", "heads": "heads", "layer": "layers", "head": "heads", "mask_tokens": "max_tokens"}
    for name in ("AttentionRequest", "StagesRequest"):
        props = schemas.get(name, {}).get("properties", {})
        for field, bound in top.items():
            if field in props:
                _narrow(props[field], bound)
                props[field]["description"] += (f". Here at most {bound}: the largest `{note[field]}` among the "
                                                 "served models, each of which checks its own")


def _variant(generic: dict, analysis, m: ModelInfo, max_mask_tokens: int, max_new_tokens: int, schemas: dict
             ) -> dict:
    variant = copy.deepcopy(generic)
    variant.pop("description", None)
    variant["title"] = f"{generic.get('title', '')} for {m.id}"
    props = variant["properties"]
    variant["examples"] = [_example(analysis, m)]
    for field in ("layers", "heads", "ablate", "mask_tokens", "queries", "keys", "query", "key", "position", "clean",
                  "corrupt", "target", "distractor", "head_lens", "senders", "receivers"):   # the generic examples need not fit this model (its tokens, its sizes)
        props.get(field, {}).pop("examples", None)
    default = props["model"].get("default")
    props["model"] = {"const": m.id, "type": "string", "description": f"{m.title}: {m.layers} layers x {m.heads} "
                      f"heads, up to {m.max_tokens} tokens"} | ({"default": m.id} if m.id == default else {})
    if m.id != default:
        variant["required"] = sorted(set(variant.get("required", [])) | {"model"})
    bounds = {"layers": m.layers - 1, "heads": m.heads - 1, "layer": m.layers - 1, "head": m.heads - 1,
              "mask_tokens": m.max_tokens - 1, "queries": m.max_tokens - 1, "keys": m.max_tokens - 1,
              "position": m.max_tokens - 1, "query": m.max_tokens - 1, "key": m.max_tokens - 1}
    for field, bound in bounds.items():
        if field in props:
            _narrow(props[field], bound)
    for field in ("layers", "heads"):        # an empty list is refused ("leave it out for all")
        for node in [props.get(field, {}), *props.get(field, {}).get("anyOf", [])]:
            if node.get("type") == "array":
                node["minItems"] = max(node.get("minItems", 1), 1)
    if "mask_tokens" in props:
        props["mask_tokens"]["maxItems"] = max_mask_tokens
    if "interventions" in props:             # inline, to bound its [layer, head] pairs by this model
        inline = copy.deepcopy(schemas["Interventions"])
        _bound_pairs(inline["properties"], m)
        props["interventions"] = {"anyOf": [inline, {"type": "null"}], "default": None,
                                  "description": props["interventions"].get("description", "")}
    _bound_pairs(props, m)
    if "kv_cache" in props:                  # inline, to give a budget per layer (and key/value head) this model's
        props["kv_cache"] = _bound_budgets(props["kv_cache"], m, schemas)
    if "max_new_tokens" in props:
        props["max_new_tokens"]["maximum"] = top = max(1, min(max_new_tokens, m.max_tokens - 1))
        props["max_new_tokens"]["default"] = min(props["max_new_tokens"].get("default", top), top)
    if "chat" in props and not m.chat:
        props["chat"] = {"type": "boolean", "const": False, "default": False,
                         "description": f"{m.id}'s files have no chat template: leave it out"}
    if "text_pair" in props and not m.pair:
        props["text_pair"] = {"type": "null", "description": f"{m.id} takes a single text: leave it out"}
    if "include" in props and not m.predictions:     # attribution reads next-token logits: an LM head's
        items = props["include"].get("items", {})
        if "enum" in items:
            items["enum"] = [part for part in items["enum"] if part != "attribution"]
    if m.kind != "encoder-decoder":          # the decoder's text and which attention: encoder-decoders only
        for field in ("decoder_text", "attention"):
            if field in props:
                props[field] = {"type": "null", "description": f"encoder-decoders only; {m.id} is "
                                f"{'an' if m.kind == 'encoder' else 'a'} {m.kind}: leave it out"}
    return variant


def _bound_pairs(props: dict, m: ModelInfo) -> None:
    """[layer, head] pairs (`ablate`'s, `senders`', `receivers'`, `head_lens`): each number bounded by its own axis."""
    pairs = [props["ablate"]["items"]] if "ablate" in props else []
    pairs += [node["items"] for field in ("senders", "receivers") for node in props.get(field, {}).get("anyOf", [])
              if node.get("type") == "array"]
    pairs += [node for node in props.get("head_lens", {}).get("anyOf", []) if node.get("type") == "array"]
    for pair in pairs:
        index = pair.pop("items")
        pair["prefixItems"] = [index | {"maximum": m.layers - 1}, index | {"maximum": m.heads - 1}]


def _bound_budgets(node, m: ModelInfo, schemas: dict):
    """kv_cache's policies inlined (their discriminator's mapping names the generic ones), each list of a budget as
    long as this model's layers, and each inner list as its key/value heads."""
    if isinstance(node, list):
        return [_bound_budgets(n, m, schemas) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _bound_budgets(copy.deepcopy(schemas[node["$ref"].rsplit("/", 1)[-1]]), m, schemas)
    node = {k: _bound_budgets(v, m, schemas) for k, v in node.items() if k != "discriminator"}
    for shape in node.get("properties", {}).get("budget", {}).get("anyOf", []):
        if shape.get("type") == "array":
            shape |= {"minItems": m.layers, "maxItems": m.layers}
            if shape["items"].get("type") == "array":
                shape["items"] |= {"minItems": m.kv_heads, "maxItems": m.kv_heads}
    return node


def _example(analysis, m: ModelInfo) -> dict:
    """A request that this model takes: the analysis' own example (analyses/registry.py), for this model."""
    return {"model": m.id, **analysis.example}


def _narrow(node: dict, bound: int) -> None:
    if "maximum" in node:
        node["maximum"] = bound
    for child in [node.get("items"), *node.get("anyOf", [])]:
        if isinstance(child, dict):
            _narrow(child, bound)


STREAMED = (GeneratedToken, GenerateDone)   # the lines of /api/generate's stream: no response_model names them


def _stream_schemas(openapi: dict) -> None:
    """The streamed lines' schemas among the components, where the stream's description points."""
    from pydantic.json_schema import models_json_schema

    _, defs = models_json_schema([(m, "serialization") for m in STREAMED],
                                 ref_template="#/components/schemas/{model}")
    openapi.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
