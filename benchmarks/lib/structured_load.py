"""Structured outputs under load (`python -m benchmarks.load --structured KIND`), as vLLM's
structured-output benchmark runs them: every request carries one constraint, and the report says
how many completed replies are what it asked for, checked here independently of the server's
grammar (json.loads and a schema check, a regular expression, set membership).

Kinds: `json` (guided_json: a small object schema), `grammar` (guided_grammar: the SQL grammar of
vLLM's benchmark, in GBNF), `regex` (guided_regex), `choice` (guided_choice).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from benchmarks.lib.schema_check import conforms

# Every value bounded (lengths, enums, booleans; no free numbers), so that a model with dummy weights,
# which writes any digit next, still ends its objects.
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "role": {"enum": ["engineer", "manager", "analyst", None]},
    "skills": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    "remote": {"type": "boolean"},
    "work": {"type": "object", "properties": {"company": {"type": "string", "maxLength": 16},
                                             "level": {"enum": [1, 2, 3]}}, "required": ["company"]},
}, "required": ["name", "role", "work"]}
SQL_GRAMMAR = '''root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "'''
SQL_TEXT = r"SELECT col_[12]  from table_[12]  where col_[12] = [12] "
EMAIL = r"[a-z0-9]{1,12}@[a-z]{1,8}\.(com|org)"
CHOICES = ["Positive", "Negative", "Neutral"]


def _is_json_of_schema(text: str) -> bool:
    try:
        return conforms(json.loads(text), SCHEMA)
    except ValueError:
        return False


# kind -> (the request's constraint fields, whether a reply's text is what they ask for)
KINDS: dict[str, tuple[dict, Callable[[str], bool]]] = {
    "json": ({"guided_json": SCHEMA}, _is_json_of_schema),
    "grammar": ({"guided_grammar": SQL_GRAMMAR}, lambda text: re.fullmatch(SQL_TEXT, text) is not None),
    "regex": ({"guided_regex": EMAIL}, lambda text: re.fullmatch(EMAIL, text) is not None),
    "choice": ({"guided_choice": CHOICES}, lambda text: text in CHOICES),
}


def correctness(kind: str, texts: list[str]) -> dict:
    """How many of the completed replies' texts are what `kind` asked for, and the first few that
    are not."""
    check = KINDS[kind][1]
    wrong = [text for text in texts if not check(text)]
    return {"kind": kind, "checked": len(texts), "correct": len(texts) - len(wrong),
            "correct_rate": (len(texts) - len(wrong)) / len(texts) if texts else None,
            "wrong_examples": [text[:200] for text in wrong[:3]]}
