"""Grammar: what a structured output must be, compiled from its spec into automaton nodes.

A spec is a small JSON object, carried as a canonical string in SamplingParams.structured_output
from the API to the executor, which compiles it again (cached by the string):

  {"type": "json_object"}                          any JSON object (OpenAI's JSON mode)
  {"type": "json_schema", "schema": {...}}         a value that the JSON schema accepts
  {"type": "choice", "choices": ["yes", "no"]}      exactly one of the strings, as plain text
  {"type": "regex", "pattern": "[0-9]{3}-..."}      plain text the pattern matches whole
  {"type": "grammar", "grammar": "root ::= ..."}    plain text a GBNF grammar derives from `root`
                                                    (or a lark one from `start`; core/structured/ebnf.py)
  {"type": "tool_calls", "tools": [{"name": ..., "parameters": {...}}], "max_calls": N}
        1..N Qwen3 tool-call blocks, `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`,
        each naming one of the tools and giving arguments its parameters accept

and, in any of them, "reasoning": true lets the output begin with a `<think>...</think>\n\n` block
of free text (a Qwen3 chat with thinking on), the structure applying after it.

The schema subset (what `compile_spec` accepts; anything else is refused with the keyword and its
place named, never silently dropped): `type` (one or a list), `properties` (generated in the
schema's order; keys outside them are not generated), `required`, `additionalProperties` (used
when there are no properties; absent, any keys, none with the spec's "closed_objects"), `items`,
`minItems`, `maxItems`, `minLength`, `maxLength`, `pattern` (core/structured/regex.py's subset; a
string with a pattern holds no escapes), `enum`, `const`,
`anyOf`, `oneOf` (generated as anyOf: a value may match two alternatives), a one-element
`allOf`, local `$ref`s into `$defs` or `definitions` (recursive ones too), bounds (`minimum`,
`maximum`, `exclusiveMinimum`, `exclusiveMaximum`, any on integers, whole ones on numbers:
core/structured/numeric_ranges.py)
and the string formats date, time, date-time, uuid, ipv4 and email (core/structured/string_formats.py;
on a string without length bounds). Annotations (`title`, `description`, `default`, `examples`,
...) are ignored, and so are other formats, which are not enforced.
"""

from __future__ import annotations

import json
from functools import lru_cache

from core.structured.automaton import (
    CALLS,
    LITERAL,
    N_ANY_OF,
    N_ARRAY,
    N_LITERAL,
    N_NUMBER,
    N_OBJECT,
    N_STRING,
    TEXT,
    VALUE,
    Automaton,
    Node,
    State,
)
from core.structured.ebnf import Rules
from core.structured.ebnf_parser import EbnfError
from core.structured.numeric_ranges import (
    BOUND_WORDS,
    integer_bounds,
    integer_range_pattern,
    number_bounds,
    number_range_pattern,
)
from core.structured.pattern_frames import PATTERN, PATTERN_WHOLE
from core.structured.regex import Regex, RegexError
from core.structured.rule_frames import RULE
from core.structured.string_formats import FORMAT_PATTERNS

# Keywords that say nothing about which values are valid, or that are not enforced (`format`, but for
# the formats of core/structured/string_formats.py).
_IGNORED = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                      "deprecated", "readOnly", "writeOnly", "format", "$defs", "definitions", "strict",
                      "nullable"})
_KNOWN = frozenset({"type", "properties", "required", "additionalProperties", "items", "minItems",
                    "maxItems", "minLength", "maxLength", "pattern", "enum", "const", "anyOf", "oneOf",
                    "allOf", "$ref"}) | _IGNORED | frozenset(BOUND_WORDS)
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
MAX_SPEC_BYTES = 1 << 20  # a spec travels in every step plan of its request
MAX_NODES = 20_000
MAX_ENUM = 1000  # values of one enum (each byte of the output is checked against those still in play)
THINK_OPEN, THINK_CLOSE = b"<think>", b"</think>\n\n"  # as Qwen3 writes its reasoning


class GrammarError(ValueError):
    """A spec this server cannot enforce; the message names the keyword and where it is."""


def _dumps(value: object) -> bytes:
    """The one way a literal value is written: JSON as Qwen writes it (", " and ": ")."""
    return json.dumps(value, ensure_ascii=False).encode()


class Grammar:
    """A compiled spec: the nodes, the automaton over them and the state an output starts in."""

    def __init__(self, key: str, nodes: list[Node], initial: State, regexes: list[Regex],
                 compact: bool = False, rules: Rules | None = None) -> None:
        self.key = key  # the spec string it was compiled from: what caches of its masks are keyed by
        self.nodes = nodes
        self.automaton = Automaton(nodes, regexes, compact, rules)
        self.initial = initial


@lru_cache(maxsize=256)
def compile_spec(spec: str) -> Grammar:
    """The grammar of a spec string; GrammarError names what is wrong with it."""
    if len(spec.encode()) > MAX_SPEC_BYTES:
        raise GrammarError(f"the schema is {len(spec.encode())} bytes; at most {MAX_SPEC_BYTES} are served")
    try:
        return _compile(spec)
    except RecursionError:
        raise GrammarError("the spec (a schema or a grammar) is nested too deeply to compile") from None


def _compile(spec: str) -> Grammar:
    try:
        parsed = json.loads(spec)
    except ValueError as e:
        raise GrammarError(f"the structured-output spec is not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise GrammarError("the structured-output spec must be a JSON object")
    closed = parsed.get("closed_objects", False)
    if not isinstance(closed, bool):
        raise GrammarError("closed_objects must be a boolean")
    builder = _Builder(parsed.get("schema") if isinstance(parsed.get("schema"), dict) else {}, closed)
    kind = parsed.get("type")
    rules = None
    if kind == "json_object":
        stack = ((VALUE, builder.object_of_any(), 0),)
    elif kind == "json_schema":
        schema = parsed.get("schema")
        if not isinstance(schema, dict):
            raise GrammarError("json_schema.schema must be a JSON object (a JSON schema)")
        stack = ((VALUE, builder.node(schema, "schema"), 0),)
    elif kind == "choice":
        choices = parsed.get("choices")
        if (not isinstance(choices, list) or not choices
                or not all(isinstance(c, str) and c for c in choices)):
            raise GrammarError("choice needs a non-empty list of non-empty strings")
        if len(choices) > MAX_ENUM:
            raise GrammarError(f"choice has {len(choices)} strings; at most {MAX_ENUM} are served")
        stack = ((LITERAL, tuple(dict.fromkeys(c.encode() for c in choices)), 0),)
    elif kind == "regex":
        regex = builder.regex(parsed.get("pattern"), "pattern", json=False)
        stack = ((PATTERN, regex, builder.regexes[regex].initial, b"", PATTERN_WHOLE),)
    elif kind == "grammar":
        rules = _rules(parsed.get("grammar"))
        stack = ((RULE, rules.start, b""),)
    elif kind == "tool_calls":
        stack = ((CALLS, builder.tool_calls(parsed.get("tools")), 0, _max_calls(parsed)),)
    else:
        raise GrammarError(f"unknown structured-output type {kind!r}")
    starts = {stack}
    if parsed.get("reasoning"):
        starts.add(stack + ((TEXT, THINK_CLOSE, 0), (LITERAL, (THINK_OPEN,), 0)))
    compact = parsed.get("compact", False)
    if not isinstance(compact, bool):
        raise GrammarError("compact must be a boolean")
    grammar = Grammar(spec, builder.nodes, frozenset(starts), builder.regexes, compact, rules)
    written = parsed.get("written", "")
    if not isinstance(written, str):
        raise GrammarError("written must be a string (the reply's text so far)")
    if written:
        grammar.initial = grammar.automaton.advance_bytes(grammar.initial, written.encode())
        if not grammar.initial:
            raise GrammarError(f"the reply so far ({_excerpt(written)}) is not the beginning of an output "
                               "this structured output allows")
    return grammar


def _excerpt(text: str, most: int = 40) -> str:
    return repr(text if len(text) <= most else text[: most // 2] + "..." + text[-most // 2:])


def _rules(text: object) -> Rules:
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("grammar needs the grammar's text (GBNF: `root ::= ...`)")
    try:
        return Rules(text)
    except EbnfError as e:
        raise GrammarError(f"grammar: {e}") from None


def _max_calls(parsed: dict) -> int:
    most = parsed.get("max_calls", 1)
    if not isinstance(most, int) or isinstance(most, bool) or most < 1:
        raise GrammarError(f"max_calls must be an integer >= 1, got {most!r}")
    return most


class _Builder:
    """Turns schemas into nodes; `path` (a JSON-pointer-like place) goes into every error."""

    def __init__(self, root: dict, closed_objects: bool = False) -> None:
        self.root = root
        # an object schema without additionalProperties takes no keys beyond its properties (vLLM's
        # disable_additional_properties); JSON mode's objects stay open
        self.closed_objects = closed_objects
        self.nodes: list[Node] = []
        self.regexes: list[Regex] = []
        self._refs: dict[str, int] = {}
        self._any = -1

    def add(self, node: Node) -> int:
        if len(self.nodes) >= MAX_NODES:
            raise GrammarError(f"the schema compiles to more than {MAX_NODES} nodes; simplify it")
        self.nodes.append(node)
        return len(self.nodes) - 1

    def regex(self, pattern: object, path: str, json: bool) -> int:
        """The index of `pattern` compiled (in a JSON string, or the whole output)."""
        if not isinstance(pattern, str) or not pattern:
            raise GrammarError(f"{path} must be a non-empty string (a regular expression)")
        try:
            self.regexes.append(Regex(pattern, json=json, whole=not json))
        except RegexError as e:
            raise GrammarError(f"{path}: {e}") from None
        return len(self.regexes) - 1

    def any_value(self) -> int:
        """The node of any JSON value (made once; objects and arrays in it hold any values)."""
        if self._any < 0:
            self._any = self.add(Node(N_ANY_OF))
            children = (self.object_of_any(), self.add(Node(N_ARRAY, extra=self._any)),
                        self.add(Node(N_STRING)), self.add(Node(N_NUMBER)),
                        self.add(Node(N_LITERAL, keys=(b"true", b"false", b"null"))))
            self.nodes[self._any] = Node(N_ANY_OF, children=children)
        return self._any

    def object_of_any(self) -> int:
        return self.add(Node(N_OBJECT, extra=self.any_value()))

    def tool_calls(self, tools: object) -> int:
        if not isinstance(tools, list) or not tools:
            raise GrammarError("tool_calls needs a non-empty list of tools")
        calls = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise GrammarError(f"tools[{i}] must be an object with a string name")
            parameters = tool.get("parameters") or {"type": "object"}
            if not isinstance(parameters, dict):
                raise GrammarError(f"tools[{i}].parameters must be a JSON schema (an object)")
            self.root, self._refs = parameters, {}
            arguments = self.node(parameters, f"tools[{i}].parameters")
            name = self.add(Node(N_LITERAL, keys=(_dumps(tool["name"]),)))
            calls.append(self.add(Node(N_OBJECT, keys=(b'"name"', b'"arguments"'), children=(name, arguments),
                                       required=(True, True))))
        return calls[0] if len(calls) == 1 else self.add(Node(N_ANY_OF, children=tuple(calls)))

    def node(self, schema: object, path: str) -> int:
        if schema is True:
            return self.any_value()
        if not isinstance(schema, dict):
            raise GrammarError(f"{path} must be a JSON schema (an object), got {schema!r}")
        unknown = sorted(set(schema) - _KNOWN)
        if unknown:
            raise GrammarError(f"{path}: the keyword {unknown[0]!r} is not supported in structured outputs")
        if "$ref" in schema:
            return self._ref(schema["$ref"], path)
        if "const" in schema:
            return self.add(Node(N_LITERAL, keys=(_dumps(schema["const"]),)))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise GrammarError(f"{path}.enum must be a non-empty list")
            if len(values) > MAX_ENUM:
                raise GrammarError(f"{path}.enum has {len(values)} values; at most {MAX_ENUM} are served")
            return self.add(Node(N_LITERAL, keys=tuple(dict.fromkeys(_dumps(v) for v in values))))
        for word in ("anyOf", "oneOf"):
            if word in schema:
                options = schema[word]
                if not isinstance(options, list) or not options:
                    raise GrammarError(f"{path}.{word} must be a non-empty list of schemas")
                return self.add(Node(N_ANY_OF, children=tuple(
                    self.node(option, f"{path}.{word}[{i}]") for i, option in enumerate(options))))
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise GrammarError(f"{path}.allOf is supported with exactly one schema")
            return self.node(parts[0], f"{path}.allOf[0]")
        kind = schema.get("type")
        if kind is None:
            return self._untyped(schema, path)
        if isinstance(kind, list):
            if not kind:
                raise GrammarError(f"{path}.type must not be an empty list")
            return self.add(Node(N_ANY_OF, children=tuple(self._typed(schema, k, path) for k in kind)))
        return self._typed(schema, kind, path)

    def _untyped(self, schema: dict, path: str) -> int:
        """A schema without `type`: its keywords say which type it means, or any value."""
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            return self._typed(schema, "object", path)
        if "items" in schema or "minItems" in schema or "maxItems" in schema:
            return self._typed(schema, "array", path)
        if "minLength" in schema or "maxLength" in schema or "pattern" in schema:
            return self._typed(schema, "string", path)
        if any(word in schema for word in BOUND_WORDS):
            return self._typed(schema, "number", path)  # bounds without a type: a number's
        return self.any_value()

    def _typed(self, schema: dict, kind: object, path: str) -> int:
        if kind not in _TYPES:
            raise GrammarError(f"{path}.type {kind!r} is not a JSON schema type (one of {', '.join(_TYPES)})")
        if kind == "object":
            return self._object(schema, path)
        if kind == "array":
            low, high = _bounds(schema, "minItems", "maxItems", path)
            items = self.node(schema["items"], f"{path}.items") if "items" in schema else self.any_value()
            return self.add(Node(N_ARRAY, extra=items, low=low, high=high))
        if kind == "string":
            low, high = _bounds(schema, "minLength", "maxLength", path)
            if "pattern" in schema:
                if low or high >= 0:
                    raise GrammarError(f"{path}: a pattern with minLength or maxLength is not supported "
                                       "(bound the length in the pattern instead)")
                return self.add(Node(N_STRING, regex=self.regex(schema["pattern"], f"{path}.pattern", True)))
            known_format = schema.get("format") if isinstance(schema.get("format"), str) else None
            if known_format in FORMAT_PATTERNS and not low and high < 0:  # with lengths: an annotation
                return self.add(Node(N_STRING, regex=self.regex(FORMAT_PATTERNS[known_format],
                                                                f"{path}.format", True)))
            return self.add(Node(N_STRING, low=low, high=high))
        if kind in ("number", "integer"):
            if not any(word in schema for word in BOUND_WORDS):
                return self.add(Node(N_NUMBER, integer=kind == "integer"))
            try:  # RegexError is a ValueError too (a pattern of too many states)
                pattern = (integer_range_pattern(*integer_bounds(schema)) if kind == "integer"
                           else number_range_pattern(*number_bounds(schema)))
                self.regexes.append(Regex(pattern, json=False, whole=True))
            except ValueError as e:
                raise GrammarError(f"{path}: {e}") from None
            return self.add(Node(N_NUMBER, integer=kind == "integer", regex=len(self.regexes) - 1))
        return self.add(Node(N_LITERAL, keys=(b"true", b"false") if kind == "boolean" else (b"null",)))

    def _object(self, schema: dict, path: str) -> int:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise GrammarError(f"{path}: properties must be an object and required a list")
        missing = [name for name in required if name not in properties]
        if missing and properties:
            raise GrammarError(f"{path}.required names {missing[0]!r}, which is not among its properties")
        if not properties:
            if required:
                raise GrammarError(f"{path}.required names properties, but the object has none")
            extra = schema.get("additionalProperties", not self.closed_objects)
            value = -1 if extra is False else self.node(extra, f"{path}.additionalProperties")
            return self.add(Node(N_OBJECT, extra=value))
        index = self.add(Node(N_OBJECT))  # reserved first: a property may refer back to it
        names = list(properties)
        children = tuple(self.node(properties[name], f"{path}.properties.{name}") for name in names)
        self.nodes[index] = Node(N_OBJECT, keys=tuple(_dumps(name) for name in names), children=children,
                                 required=tuple(name in required for name in names))
        return index

    def _ref(self, ref: object, path: str) -> int:
        if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")):
            raise GrammarError(f"{path}.$ref {ref!r} is not supported: only local '#/$defs/...' references")
        if ref in self._refs:
            return self._refs[ref]
        section, name = ref[2:].split("/", 1)
        target = self.root.get(section, {}).get(name) if isinstance(self.root.get(section), dict) else None
        if target is None:
            raise GrammarError(f"{path}.$ref {ref!r} names no schema in the root's {section}")
        index = self._refs[ref] = self.add(Node(N_ANY_OF))  # a placeholder that recursion points at
        self.nodes[index] = Node(N_ANY_OF, children=(self.node(target, ref[2:]),))
        return index


def _bounds(schema: dict, low_word: str, high_word: str, path: str) -> tuple[int, int]:
    low, high = schema.get(low_word, 0), schema.get(high_word)
    for word, value in ((low_word, low), (high_word, high)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise GrammarError(f"{path}.{word} must be a non-negative integer, got {value!r}")
    high = -1 if high is None else high
    if high >= 0 and low > high:
        raise GrammarError(f"{path}: {low_word} {low} is above {high_word} {high}")
    return low, high
