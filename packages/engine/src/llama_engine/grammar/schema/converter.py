"""JSON schema -> GBNF, rule for rule as llama.cpp's `common/json-schema-to-grammar.cpp` (same rule names,
same texts, same order), so a grammar built here equals llama.cpp's for the schemas both honour.

Where llama.cpp silently accepts more than the schema allows (it ignores the keyword), this raises
`SchemaError` naming the keyword, or builds a grammar for a subset of what the schema allows; the
grammar never accepts a value the schema rejects. See docs/structured-output.md for the list.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .numbers import number_range
from .pattern import MAX_PATTERN_REPEAT, pattern_rule
from .rules import (
    FORMAT_RULES,
    INT64_MAX,
    INT64_MIN,
    INT_MAX,
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    SPACE_RULE,
    SchemaError,
    constant,
    dump_json,
    format_literal,
    min_max_int,
    not_strings,
    repetition,
)

__all__ = ["MAX_GRAMMAR_CHARS", "MAX_SCHEMA_DEPTH", "SchemaConverter", "json_schema_to_grammar"]

MAX_SCHEMA_DEPTH = 128
MAX_GRAMMAR_CHARS = 1 << 20
MAX_COUNT = MAX_PATTERN_REPEAT  # minItems/maxItems/minLength/maxLength: larger expands too far
_INT_DIGITS = 15  # llama.cpp's integer rules allow 16 digits; a bound must fit under them

_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
# keywords whose constraint no grammar here expresses: refused wherever they appear
_UNSUPPORTED = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "patternProperties",
    "propertyNames",
    "unevaluatedItems",
    "contains",
    "minContains",
    "maxContains",
    "multipleOf",
    "$dynamicRef",
    "$recursiveRef",
)
# keywords that constrain a value (a $ref or anyOf beside them would drop them, as llama.cpp does)
_CONSTRAINTS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum", "enum", "const", "allOf", "anyOf", "oneOf",
        "minProperties", "maxProperties", "uniqueItems", "$ref",
    }
)  # fmt: skip
_NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_STRING_FORMATS = {
    "date": "date-string",
    "time": "time-string",
    "date-time": "date-time-string",
    "email": "email-string",
    "hostname": "hostname-string",
    "ipv4": "ipv4-string",
    "uri": "uri-string",
}
_JSON_TYPES = {"null", "boolean", "integer", "number", "string", "array", "object"}


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _type_ok(value: Any, types: set[str]) -> bool:
    t = _type_of(value)
    return t in types or (t == "integer" and "number" in types)


class SchemaConverter:
    """One conversion: the rules so far, by name (written sorted, as llama.cpp's std::map)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self._resolving: set[str] = set()
        self._depth = 0

    # -- rules ---------------------------------------------------------------------------------------

    def add_rule(self, name: str, rule: str) -> str:
        """Add `rule` as `name` (made a valid rule name); a name taken by another rule gets a number."""
        esc = _INVALID_RULE_CHARS.sub("-", name)
        if esc not in self.rules or self.rules[esc] == rule:
            self.rules[esc] = rule
            return esc
        i = 0
        while f"{esc}{i}" in self.rules and self.rules[f"{esc}{i}"] != rule:
            i += 1
        key = f"{esc}{i}"
        self.rules[key] = rule
        return key

    def add_primitive(self, name: str, builtin: str) -> str:
        """A built-in rule (`PRIMITIVE_RULES` / `FORMAT_RULES`) and the built-ins it uses."""
        text, deps = PRIMITIVE_RULES.get(builtin) or FORMAT_RULES[builtin]
        n = self.add_rule(name, text)
        for dep in deps:
            if dep not in self.rules:
                self.add_primitive(dep, dep)
        return n

    def _char(self) -> str:
        return self.add_primitive("char", "char")

    def format_grammar(self) -> str:
        """The grammar text, one `name ::= rule` line per rule, sorted by name."""
        out = "".join(f"{k} ::= {self.rules[k]}\n" for k in sorted(self.rules))
        if len(out) > MAX_GRAMMAR_CHARS:
            raise SchemaError(f"the schema's grammar is over {MAX_GRAMMAR_CHARS} characters")
        return out

    # -- helpers -------------------------------------------------------------------------------------

    @staticmethod
    def _count(s: dict[str, Any], key: str, default: int) -> int:
        if key not in s:
            return default
        v = s[key]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise SchemaError(f"{key} must be a non-negative integer")
        if v > MAX_COUNT:  # checked before any repetition is written, let alone expanded
            shown = v if v < 10**20 else f"of {len(str(v))} digits"
            raise SchemaError(f"{key} {shown} is over the supported {MAX_COUNT}")
        return v

    def _resolve(self, ref: str) -> Any:
        target = self.root
        for sel in ref[2:].split("/"):
            sel = sel.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list) and sel.isdigit() and int(sel) < len(target):
                target = target[int(sel)]
            else:
                raise SchemaError(f"cannot resolve $ref {ref}, {sel} not found")
        return target

    @staticmethod
    def _check_keywords(s: dict[str, Any]) -> None:
        for key in _UNSUPPORTED:
            if key in s:
                raise SchemaError(f"the JSON schema keyword {key!r} is not supported")
        if s.get("uniqueItems") is True and s.get("maxItems", 2) > 1:
            raise SchemaError("the JSON schema keyword 'uniqueItems' is not supported")

    @staticmethod
    def _only_beside(s: dict[str, Any], key: str, allowed: frozenset[str]) -> None:
        extra = sorted(k for k in s if k in _CONSTRAINTS and k != key and k not in allowed)
        if extra:
            raise SchemaError(f"{key} beside {', '.join(extra)} is not supported")

    # -- visiting ------------------------------------------------------------------------------------

    def visit(self, s: Any, name: str) -> str:
        """The rule name for schema `s`, its rules added under `name`."""
        self._depth += 1
        if self._depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        try:
            return self._visit(s, name)
        finally:
            self._depth -= 1

    def _visit(self, s: Any, name: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else (name or "root")
        if s is True:
            s = {}
        if not isinstance(s, dict):
            raise SchemaError(
                "a schema that accepts nothing (false)" if s is False else "schema must be an object"
            )
        self._check_keywords(s)
        if "$ref" in s:
            self._only_beside(s, "$ref", frozenset())
            return self.add_rule(rule_name, self._visit_ref(s["$ref"]))
        if "oneOf" in s or "anyOf" in s:
            return self._visit_union(s, name, rule_name)
        t = s.get("type")
        if isinstance(t, list):
            if not t:
                raise SchemaError("type must not be empty")
            return self.add_rule(rule_name, self._union(name, [{**s, "type": x} for x in t]))
        if "const" in s or "enum" in s:
            return self._visit_enum(s, rule_name)
        if t is not None and not isinstance(t, str):
            raise SchemaError("type must be a string or an array of strings")
        return self._visit_typed(s, t or "", name, rule_name)

    def _visit_typed(self, s: dict[str, Any], t: str, name: str, rule_name: str) -> str:
        has_props = "properties" in s or (
            "additionalProperties" in s and s["additionalProperties"] is not True
        )
        if t not in ("", "object") and has_props and "properties" in s:
            raise SchemaError(f"properties on a schema of type {t!r}")
        if not t:
            if has_props:
                t = "object"
            elif "allOf" in s:
                return self._visit_all_of(s, name, rule_name)
            elif "items" in s or "prefixItems" in s:
                t = "array"
            elif any(k in s for k in ("pattern", "minLength", "maxLength", "format")):
                t = "string"
            elif any(k in s for k in _NUMERIC):
                t = "number"  # numeric bounds alone: a number (a subset of "anything else, or such a number")
            else:
                return self.add_rule(rule_name, self.add_primitive("value", "value"))
        if "allOf" in s:
            if (t == "object" and not has_props) or t == "string":
                return self._visit_all_of(s, name, rule_name)
            raise SchemaError(f"allOf beside the other keywords of a {t} schema is not supported")
        if t == "object":
            return self._visit_object(s, name, rule_name)
        if t == "array":
            return self._visit_array(s, name, rule_name)
        if t == "string":
            return self._visit_string(s, rule_name)
        if t == "integer":
            return self._visit_integer(s, rule_name)
        if t == "number":
            if any(k in s for k in _NUMERIC):
                return self.add_rule(rule_name, number_range(s, self.add_primitive))
            return self._primitive(rule_name, "number")
        if t in ("boolean", "null"):
            return self._primitive(rule_name, t)
        raise SchemaError(f"unrecognized type {t}")

    def _primitive(self, rule_name: str, t: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else t, t)

    def _visit_ref(self, ref: Any) -> str:
        if not isinstance(ref, str):
            raise SchemaError("$ref must be a string")
        if not ref.startswith("#/"):
            raise SchemaError(f"unsupported $ref {ref}, only references into the same document are supported")
        ref_name = "ref" + _INVALID_RULE_CHARS.sub("-", ref[1:])
        if ref_name not in self.rules and ref not in self._resolving:
            target = self._resolve(ref)
            self._resolving.add(ref)
            try:
                ref_name = self.visit(target, ref_name)
            finally:
                self._resolving.discard(ref)
        return ref_name

    def _union(self, name: str, alts: list[Any]) -> str:
        sep = "alternative-" if not name else "-"
        return " | ".join(self.visit(alt, f"{name}{sep}{i}") for i, alt in enumerate(alts))

    def _visit_union(self, s: dict[str, Any], name: str, rule_name: str) -> str:
        key = "oneOf" if "oneOf" in s else "anyOf"
        if "oneOf" in s and "anyOf" in s:
            raise SchemaError("oneOf beside anyOf is not supported")
        self._only_beside(s, key, frozenset({"type"}))
        alts = s[key]
        if not isinstance(alts, list) or not alts:
            raise SchemaError(f"{key} must be a non-empty array of schemas")
        if "type" in s:
            allowed = {s["type"]} if isinstance(s["type"], str) else set(s["type"])
            for alt in alts:
                t = alt.get("type") if isinstance(alt, dict) else None
                if t is not None and not ({t} if isinstance(t, str) else set(t)) <= allowed | (
                    {"integer"} if "number" in allowed else set()
                ):
                    raise SchemaError(
                        f"{key} branch of type {t!r} beside type {s['type']!r} is not supported"
                    )
        return self.add_rule(rule_name, self._union(name, alts))

    def _visit_enum(self, s: dict[str, Any], rule_name: str) -> str:
        values = [s["const"]] if "const" in s else s["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError("enum must be a non-empty array")
        t = s.get("type")
        if t is not None:
            types = {t} if isinstance(t, str) else set(t)
            values = [v for v in values if _type_ok(v, types)]
            if not values:
                raise SchemaError("no enum or const value has the schema's type")
        if "const" in s:
            if "enum" in s and not any(s["const"] == v for v in s["enum"]):
                raise SchemaError("const is not one of the enum values")
            return self.add_rule(rule_name, constant(s["const"]))
        return self.add_rule(rule_name, "(" + " | ".join(constant(v) for v in values) + ")")

    # -- objects -------------------------------------------------------------------------------------

    def _visit_object(self, s: dict[str, Any], name: str, rule_name: str) -> str:
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("properties must be an object")
        required = (
            {r for r in s.get("required", []) if isinstance(r, str)}
            if isinstance(s.get("required"), list)
            else set()
        )
        missing = sorted(required - set(props))
        if missing:
            raise SchemaError(f"required property {missing[0]!r} is not in properties")
        if "additionalProperties" in s:
            extra = s["additionalProperties"]
            if extra is False:
                additional: Any = None
            elif extra is True or isinstance(extra, dict):
                additional = {} if extra is True else extra
            else:
                raise SchemaError("additionalProperties must be a boolean or a schema")
        else:
            additional = {} if "properties" not in s else None
        if s.get("unevaluatedProperties", False) is not False or (
            "unevaluatedProperties" in s and additional is not None
        ):
            raise SchemaError("the JSON schema keyword 'unevaluatedProperties' is not supported")
        self._check_counts(s, len(required), None if additional is not None else len(props))
        if not props and additional is not None and self._is_any(additional):
            return self.add_rule(rule_name, self.add_primitive("object", "object"))
        items = [(k, v, k in required) for k, v in props.items()]
        return self.add_rule(rule_name, self._object_rule(items, name, additional))

    @staticmethod
    def _check_counts(s: dict[str, Any], n_required: int, n_max: int | None) -> None:
        """min/maxProperties: honoured when every object the grammar allows meets them anyway."""
        lo = SchemaConverter._count(s, "minProperties", 0)
        hi = SchemaConverter._count(s, "maxProperties", INT_MAX)
        if lo > n_required:
            raise SchemaError("minProperties above the number of required properties is not supported")
        if hi != INT_MAX and (n_max is None or hi < n_max):
            if hi < n_required:
                raise SchemaError("maxProperties below the number of required properties")
            raise SchemaError(
                "maxProperties below the number of properties an object may have is not supported"
            )

    @staticmethod
    def _is_any(s: Any) -> bool:
        return s is True or (isinstance(s, dict) and not any(k in s for k in _CONSTRAINTS))

    def _object_rule(self, items: list[tuple[str, Any, bool]], name: str, additional: Any) -> str:
        sub = f"{name}-" if name else ""
        kv: dict[str, str] = {}
        required: list[str] = []
        optional: list[str] = []
        for prop, schema, is_required in items:
            value = self.visit(schema, sub + prop)
            kv[prop] = self.add_rule(
                f"{sub}{prop}-kv", f'{format_literal(dump_json(prop))} space ":" space {value}'
            )
            (required if is_required else optional).append(prop)
        if additional is not None:
            extra = f"{sub}additional"
            value = (
                self.add_primitive("value", "value")
                if self._is_any(additional)
                else self.visit(additional, extra + "-value")
            )
            names = [p for p, _, _ in items]
            key = (
                self.add_rule(extra + "-k", not_strings(names, self._char()))
                if names
                else self.add_primitive("string", "string")
            )
            kv["*"] = self.add_rule(extra + "-kv", f'{key} ":" space {value}')
            optional.append("*")
        if not required and not optional:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[p] for p in required)
        if optional:
            rule += " ("
            if required:
                rule += ' "," space ( '
            rule += " | ".join(self._optional_chain(optional, kv, sub))
            if required:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def _optional_chain(self, keys: list[str], kv: dict[str, str], sub: str) -> list[str]:
        """llama.cpp's optional-property chain, one alternative per first property: `k1-kv k1-rest`,
        where `k1-rest` may add k2 and goes on to `k2-rest`... (built from the end, without recursion)."""
        rest = ""  # the "-rest" rule of the key after the current one
        alts = []
        for i in range(len(keys) - 1, -1, -1):
            k = keys[i]
            comma = f'( "," space {kv[k]} )'
            alts.append(kv[k] + (f" {comma}*" if k == "*" else "") + (f" {rest}" if rest else ""))
            if i > 0:
                rest = self.add_rule(
                    f"{sub}{keys[i - 1]}-rest",
                    comma + ("*" if k == "*" else "?") + (f" {rest}" if rest else ""),
                )
        return alts[::-1]

    def _visit_all_of(self, s: dict[str, Any], name: str, rule_name: str) -> str:
        children = s["allOf"]
        if not isinstance(children, list) or not children:
            raise SchemaError("allOf must be a non-empty array of schemas")
        items: list[tuple[str, Any, bool]] = []
        enums: dict[str, int] = {}
        kinds: set[str] = set()

        def add(comp: Any, is_required: bool) -> None:
            while isinstance(comp, dict) and "$ref" in comp:
                comp = self._resolve(comp["$ref"]) if isinstance(comp["$ref"], str) else None
            if not isinstance(comp, dict):
                raise SchemaError("allOf components must be schemas")
            if "enum" in comp or "const" in comp:
                kinds.add("enum")
                for v in [comp["const"]] if "const" in comp else comp["enum"]:
                    enums[constant(v)] = enums.get(constant(v), 0) + 1
                return
            if "properties" not in comp or any(k in comp for k in ("allOf", "anyOf", "oneOf")):
                raise SchemaError(
                    "allOf is supported over object schemas with properties and over enums only"
                )
            kinds.add("object")
            if not is_required and comp.get("required"):
                raise SchemaError("required properties inside anyOf inside allOf are not supported")
            # as llama.cpp: the properties of a component every value matches are all required (a subset)
            for k, v in comp["properties"].items():
                if any(k == p for p, _, _ in items):
                    raise SchemaError(f"property {k!r} defined by several allOf components is not supported")
                items.append((k, v, is_required))

        for child in children:
            if isinstance(child, dict) and "anyOf" in child:
                for alt in child["anyOf"]:
                    add(alt, False)
            else:
                add(child, True)
        if kinds == {"enum"}:
            both = [v for v in sorted(enums) if enums[v] == len(children)]
            if not both:
                raise SchemaError("the allOf enums have no value in common")
            return self.add_rule(rule_name, "(" + " | ".join(both) + ")")
        if len(kinds) > 1:
            raise SchemaError("allOf mixing enums and objects is not supported")
        return self.add_rule(rule_name, self._object_rule(items, name, None))

    # -- arrays, strings, integers -------------------------------------------------------------------

    def _visit_array(self, s: dict[str, Any], name: str, rule_name: str) -> str:
        sub = f"{name}-" if name else ""
        key = "items" if "items" in s else "prefixItems" if "prefixItems" in s else ""
        tuple_items = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else None
        if tuple_items is None and key and isinstance(s[key], list):
            tuple_items = s[key]
        lo, hi = self._count(s, "minItems", 0), self._count(s, "maxItems", INT_MAX)
        if lo > hi:
            raise SchemaError("minItems is greater than maxItems")
        if tuple_items is not None:
            # exactly these items (JSON schema would also allow fewer or more: a subset)
            n = len(tuple_items)
            if not lo <= n <= hi:
                raise SchemaError(
                    "prefixItems with minItems/maxItems that exclude its length is not supported"
                )
            parts = [self.visit(it, f"{sub}tuple-{i}") for i, it in enumerate(tuple_items)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        item = s[key] if key else {}
        if item is False:
            hi = 0
        if self._is_any(item) and lo == 0 and hi == INT_MAX:
            return self._primitive(rule_name, "array")
        item_rule = self.visit({} if item is False else item, sub + "item")
        return self.add_rule(
            rule_name, '"[" space ' + repetition(item_rule, lo, hi, '"," space') + ' space "]"'
        )

    def _visit_string(self, s: dict[str, Any], rule_name: str) -> str:
        fmt = s.get("format")
        if fmt is not None and not isinstance(fmt, str):
            raise SchemaError("format must be a string")
        lo, hi = self._count(s, "minLength", 0), self._count(s, "maxLength", INT_MAX)
        has_len = "minLength" in s or "maxLength" in s
        if "pattern" in s:
            if not isinstance(s["pattern"], str):
                raise SchemaError("pattern must be a string")
            if has_len or fmt:
                raise SchemaError("pattern beside minLength, maxLength or format is not supported")
            return pattern_rule(s["pattern"], rule_name, self.add_rule, self._char)
        if fmt:
            if has_len:
                raise SchemaError("format beside minLength or maxLength is not supported")
            if fmt == "uuid" or re.fullmatch("uuid[1-5]", fmt):
                return self._primitive(rule_name, "uuid")
            if fmt not in _STRING_FORMATS:
                raise SchemaError(f"string format {fmt!r} is not supported")
            prim = _STRING_FORMATS[fmt]
            return self.add_rule(rule_name, self.add_primitive(prim, prim))
        if lo > hi:
            raise SchemaError("minLength is greater than maxLength")
        if lo > 0 or hi != INT_MAX:
            return self.add_rule(rule_name, '"\\"" ' + repetition(self._char(), lo, hi) + ' "\\""')
        return self._primitive(rule_name, "string")

    def _visit_integer(self, s: dict[str, Any], rule_name: str) -> str:
        lo, hi = _int_bounds(s)
        if lo == INT64_MIN and hi == INT64_MAX:
            return self._primitive(rule_name, "integer")
        if lo > hi:
            raise SchemaError("no integer lies between minimum and maximum")
        return self.add_rule(rule_name, f"({min_max_int(lo, hi)})")


def _bound(s: dict[str, Any], key: str, round_up: bool) -> int | None:
    v = s.get(key)
    if v is None or isinstance(v, bool):
        return None
    if not isinstance(v, int | float) or not math.isfinite(v):
        raise SchemaError(f"{key} must be a number")
    b = math.ceil(v) if round_up else math.floor(v)
    if abs(b) >= 10**_INT_DIGITS:
        raise SchemaError(f"{key} {v} has more than {_INT_DIGITS} digits")
    return int(b)


def _int_bounds(s: dict[str, Any]) -> tuple[int, int]:
    """Inclusive integer bounds (INT64_MIN/MAX: none), the tighter of minimum and exclusiveMinimum."""
    lows = [b for b in (_bound(s, "minimum", True),) if b is not None]
    highs = [b for b in (_bound(s, "maximum", False),) if b is not None]
    ex_lo, ex_hi = _bound(s, "exclusiveMinimum", False), _bound(s, "exclusiveMaximum", True)
    if ex_lo is not None:
        lows.append(ex_lo + 1)
    if ex_hi is not None:
        highs.append(ex_hi - 1)
    if s.get("exclusiveMinimum") is True and lows:  # draft 4's boolean form
        lows = [lows[0] + 1]
    if s.get("exclusiveMaximum") is True and highs:
        highs = [highs[0] - 1]
    return (max(lows) if lows else INT64_MIN), (min(highs) if highs else INT64_MAX)


def json_schema_to_grammar(schema: Any) -> str:
    """GBNF text accepting JSON values valid under `schema` (a JSON schema as decoded JSON).

    Raises `SchemaError` naming the feature when the schema uses something the grammar cannot honour."""
    conv = SchemaConverter(schema)
    conv.visit(schema, "")
    return conv.format_grammar()
