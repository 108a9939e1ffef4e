"""GBNF grammars (vLLM's guided_grammar): the parser and rules of core/structured/ebnf*.py and the
automaton's RULE frames (core/structured/rule_frames.py), byte by byte. The token masks over the
real vocabulary are tests/test_structured_masks.py's (its grammar and sql cases)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.structured.grammar import GrammarError, compile_spec
from core.structured.rule_frames import MAX_RULE_DEPTH
from core.structured.specs import grammar_spec, regex_spec

SQL = '''root ::= select_statement

select_statement ::= "SELECT " column " from " table " where " condition

column ::= "col_1 " | "col_2 "

table ::= "table_1 " | "table_2 "

condition ::= column "= " number

number ::= "1 " | "2 "
'''
BALANCED = 'root ::= ("(" root ")")*'
LISTS = '''root ::= "[" (item ("," item)*)? "]"   # a list of numbers, strings and lists
item ::= [0-9]+
       | "\\"" [^"\\\\]* "\\""
       | root'''
# JSON written as a GBNF grammar: what it derives is what json.loads parses (an independent check).
JSON_GRAMMAR = r'''# JSON, written as a grammar
root ::= value
value ::= obj | arr | str | num | "true" | "false" | "null"
obj ::= "{" sp (member ("," sp member)*)? sp "}"
member ::= str sp ":" sp value
arr ::= "[" sp (value sp ("," sp value sp)*)? "]"
str ::= "\"" (plain | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
plain ::= [^"\\\x00-\x1F]
num ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
sp ::= | " " | "\n" [ \t]{0,8}
'''


def matches(grammar: str, text: str | bytes) -> bool:
    """Whether the whole text is what the grammar derives."""
    compiled = compile_spec(grammar_spec(grammar))
    data = text.encode() if isinstance(text, str) else text
    state = compiled.automaton.advance_bytes(compiled.initial, data)
    return bool(state) and compiled.automaton.can_end(state)


def begins(grammar: str, text: str | bytes) -> bool:
    """Whether the text may begin an output of the grammar."""
    compiled = compile_spec(grammar_spec(grammar))
    data = text.encode() if isinstance(text, str) else text
    return bool(compiled.automaton.advance_bytes(compiled.initial, data))


@pytest.mark.parametrize("text, expected", [
    ("SELECT col_1  from table_2  where col_2 = 1 ", True),
    ("SELECT col_2  from table_1  where col_1 = 2 ", True),
    ("SELECT col_3  from table_1  where col_1 = 2 ", False),
    ("SELECT col_1  from table_1  where col_1 = 1", False),  # the last space is the grammar's
    ("SELECT col_1 ", False),  # a beginning, not an output
    ("select col_1  from table_1  where col_1 = 1 ", False),
])
def test_vllms_benchmark_sql_grammar(text, expected):
    assert matches(SQL, text) is expected
    assert begins(SQL, "SELECT col_1 ") and not begins(SQL, "SELECT col_3")


@pytest.mark.parametrize("text, expected", [
    ("", True), ("()", True), ("(())()", True), ("(" * 20 + ")" * 20, True),
    ("(()", False), (")(", False), ("())", False),
])
def test_recursion_nests_calls(text, expected):
    assert matches(BALANCED, text) is expected


def test_nesting_deeper_than_the_frame_limit_is_not_generated():
    deep = MAX_RULE_DEPTH // 2
    assert matches(BALANCED, "(" * deep + ")" * deep)
    assert not begins(BALANCED, "(" * (MAX_RULE_DEPTH + 1))


def test_a_right_recursive_rule_is_a_tail_call_and_its_stack_does_not_grow():
    grammar = 'root ::= "a" root | "b"'
    assert matches(grammar, "a" * 500 + "b")
    compiled = compile_spec(grammar_spec(grammar))
    state = compiled.automaton.advance_bytes(compiled.initial, b"a" * 500)
    assert max(len(stack) for stack in state) <= 2


@pytest.mark.parametrize("text, expected", [
    ('[]', True), ('[1,22,"a b",[3,[]]]', True), ('["héllo ünïcode ✓"]', True), ('[[[[]]]]', True),
    ('[1,]', False), ('[', False), ('["a"b"]', False), ('[1 ]', False),
])
def test_alternatives_may_span_lines_and_comments_are_skipped(text, expected):
    assert matches(LISTS, text) is expected


def test_classes_take_whole_utf8_characters():
    grammar = 'root ::= [а-я]+ "!" [^a-z]'
    assert matches(grammar, "привет!Ж") and matches(grammar, "да!✓")
    assert not matches(grammar, "hi!x") and not matches(grammar, "да!x")
    split = "я".encode()
    assert begins(grammar, split[:1])  # a character begun that the class may still take
    assert not begins(grammar, "ж".encode()[:1] + b"\x41")  # a lead byte then no continuation
    assert not begins(grammar, "€".encode()[:1])  # U+20AC: no 3-byte character is in [а-я]


def test_rules_that_may_match_nothing_are_skipped_and_repeated_without_looping():
    grammar = '''root ::= a b "x" (a)* "!"
a ::= "p"?
b ::= ("q")*'''
    for text in ("x!", "px!", "qqx!", "pqxppp!"):
        assert matches(grammar, text), text
    assert not matches(grammar, "ppx!") and not matches(grammar, "x")


@pytest.mark.parametrize("text", [
    '{"a": [1, 2.5e3, "x\\u00e9y", {"b": null}], "c": true}', "[]", '"h\u00e9llo \\n"', "-0.5", "0",
    '{"a" 1}', "[1,]", "01", '"\x01"', '{"a":1,}', "[1 2]", "tru", '"\\q"', "1.", ".5", "--1",
])
def test_a_json_grammar_derives_what_json_parses(text):
    try:
        json.loads(text)
        valid = True
    except ValueError:
        valid = False
    assert matches(JSON_GRAMMAR, text) is valid, text


def test_repetition_counts_and_escapes():
    grammar = r'root ::= [0-9]{2,3} "\x41\u00e9\n\t" "-"{2} [\]\-]?'
    assert matches(grammar, "12Aé\n\t--") and matches(grammar, "123Aé\n\t--]")
    assert not matches(grammar, "1Aé\n\t--") and not matches(grammar, "1234Aé\n\t--")


def test_every_state_a_walk_reaches_has_a_way_on():
    """No dead ends: from any state the grammar allows, some byte goes on or the output may end."""
    rng = np.random.default_rng(0)
    for grammar in (SQL, BALANCED, LISTS):
        compiled = compile_spec(grammar_spec(grammar))
        automaton = compiled.automaton
        for _ in range(20):
            state = compiled.initial
            for _ in range(60):
                ways = [b for b in range(256) if automaton.advance(state, b)]
                assert ways or automaton.can_end(state), (grammar, state)
                if not ways:
                    break
                state = automaton.advance(state, int(rng.choice(ways)))


@pytest.mark.parametrize("grammar, words", [
    ('expr ::= expr "+" "1" | "1"\nroot ::= expr', "rule 'expr' is left-recursive (expr -> expr"),
    ('root ::= b? root "x" | "y"\nb ::= "z"', "rule 'root' is left-recursive"),
    ('root ::= a "x"\na ::= b\nb ::= a "y" | "z"', "left-recursive"),
    ('root ::= a', "rule 'root' uses rule 'a', which is never defined"),
    ('root ::= "x" root', "rule 'root' can derive no finite text"),
    ('a ::= "x"', "no 'root' rule"),
    ('root ::= "x"\nroot ::= "y"', "rule 'root' is defined twice (the second at line 2, column 1)"),
    ('root ::= "a" (', "a group '(' without its ')' (grammar line 1, column 15)"),
    ('root ::= [b-a]', "a class range 'b'-'a' that runs backwards"),
    ('root ::= "\\q"', "unknown escape '\\q'"),
    ('root ::= "x" {3,1}', "maximum is below its minimum"),
    ('root ::= "x" {2000}', "over 1000"),
    ('root ::= "abc', "a string without its closing '\"'"),
    ('root = "x"', "expected '::=' after the rule name 'root'"),
    ('root ::= "x" @', "unexpected '@'"),
    ('   # nothing\n', "the grammar is empty"),
    ('  ', "grammar needs the grammar's text"),
])
def test_what_cannot_be_enforced_is_refused_naming_the_rule_or_the_place(grammar, words):
    with pytest.raises(GrammarError, match="grammar") as error:
        compile_spec(grammar_spec(grammar))
    assert words in str(error.value), str(error.value)


def test_a_grammar_may_follow_a_reasoning_block():
    compiled = compile_spec(grammar_spec(SQL, reasoning=True))
    text = b"<think>\nwhich column?\n</think>\n\nSELECT col_1  from table_1  where col_1 = 1 "
    state = compiled.automaton.advance_bytes(compiled.initial, text)
    assert state and compiled.automaton.can_end(state)


def test_a_rule_that_never_ends_is_refused_even_behind_an_alternative_and_calls_return_in_place():
    grammar = '''root ::= "a" | dead never
dead ::= "d"
never ::= "n" never'''
    with pytest.raises(GrammarError, match="rule 'never' can derive no finite text"):
        compile_spec(grammar_spec(grammar))
    grammar = '''root ::= "a" | ("x" | dead "!") "z"
dead ::= "d"'''
    assert matches(grammar, "d!z") and matches(grammar, "xz")
    assert not begins(grammar, "dz") and not begins(grammar, "d!!")


def test_a_character_begun_in_utf8s_surrogate_range_is_no_way_on():
    """\\xED\\xA0-\\xBF would begin a surrogate, which UTF-8 never encodes: a negated class must not take
    it (it could never be finished: a dead end), for grammars and guided_regex alike."""
    for spec in (grammar_spec("root ::= [^a]+"), regex_spec("[^a]+")):
        compiled = compile_spec(spec)
        advance = compiled.automaton.advance_bytes
        assert advance(compiled.initial, b"\xed") and advance(compiled.initial, b"\xed\x9f\xbf")  # U+D7FF
        assert not advance(compiled.initial, b"\xed\xa0") and not advance(compiled.initial, b"\xed\xbf")
        assert advance(compiled.initial, "\ue000".encode())


@pytest.mark.parametrize("grammar", [BALANCED, 'root ::= "(" root "y" | "x"',
                                     'root ::= "(" a "y" | "x"\na ::= root b\nb ::= "z" | "(" root ")"'])
def test_the_frame_limit_stops_nesting_without_stranding_an_output(grammar):
    """Open as deep as the grammar lets, then take the first other way on each time: the output
    must come to an end (no state on the way is a dead end), nested about as deep as the limit lets
    (the third grammar stacks two frames an open)."""
    compiled = compile_spec(grammar_spec(grammar))
    automaton, state, opened, refused = compiled.automaton, compiled.initial, 0, False
    for _ in range(2000):
        if refused and automaton.can_end(state):
            break
        ways = [b for b in range(256) if automaton.advance(state, b)]
        assert ways or automaton.can_end(state), f"a dead end after {opened} opened"
        if not ways:
            break
        if not refused and ord("(") in ways:
            byte, opened = ord("("), opened + 1
        else:
            refused = True
            byte = min([b for b in ways if b != ord("(")] or ways)
        state = automaton.advance(state, byte)
    else:
        raise AssertionError("no end within 2000 bytes")
    assert refused and MAX_RULE_DEPTH // 3 <= opened <= MAX_RULE_DEPTH  # a frame or two an open


LARK_SQL = '''start: select_statement
select_statement: "SELECT " column " from " table " where " condition
column: "col_1 " | "col_2 "
table: "table_1 " | "table_2 "
condition: column "= " number
number: "1 " | "2 "
'''
LARK_ARITHMETIC = r'''// a lark grammar: `start`, terminals, /regex/, ranges and counts
?start: sum
sum: product ("+" product)*
product: atom ("*" atom)*
?atom: NUMBER
     | "(" sum ")"
     | "-" atom
     | NAME
NUMBER: /[0-9]+(\.[0-9]+)?/
NAME: "a".."z" ~ 1..3
'''


@pytest.mark.parametrize("grammar, text, expected", [
    (LARK_SQL, "SELECT col_2  from table_1  where col_1 = 2 ", True),
    (LARK_SQL, "SELECT col_3 ", False),
    (LARK_ARITHMETIC, "1+2*3", True), (LARK_ARITHMETIC, "(1+x)*-3.5", True), (LARK_ARITHMETIC, "abc*2", True),
    (LARK_ARITHMETIC, "abcd", False), (LARK_ARITHMETIC, "1+", False), (LARK_ARITHMETIC, "1.+2", False),
    ('start: "select"i " " [NAME]\nNAME: "a".."z"+', "SeLeCt ", True),
    ('start: "select"i " " [NAME]\nNAME: "a".."z"+', "SELECT abc", True),
    ('start: "select"i " " [NAME]\nNAME: "a".."z"+', "selec ", False),
])
def test_lark_grammars_as_vllm_takes_them(grammar, text, expected):
    assert matches(grammar, text) is expected


@pytest.mark.parametrize("grammar, words", [
    ('start: a\na: "x"\n%import common.WS\n%ignore WS', "the directive '%import' is not supported"),
    ('start: /a/i', "regular expression flags 'i' are not supported"),
    ('start: "x" ~ 3..1', "runs backwards"),
    ('start: "a".."bc"', 'must join two single characters'),
    ('start: /a(/', "without its ')'"),
    ('?start: sum\nsum: sum "+" "1" | "1"', "rule 'sum' is left-recursive"),
    ('begin: "x"', "no 'start' rule"),
])
def test_what_a_lark_grammar_cannot_have_is_refused(grammar, words):
    with pytest.raises(GrammarError, match="grammar") as error:
        compile_spec(grammar_spec(grammar))
    assert words in str(error.value), str(error.value)
