"""String formats in JSON schemas (date, time, date-time, uuid, ipv4, email): the grammar takes what
Python's own parsers read and refuses the rest (outputs drawn through the masks over the real Qwen
vocabulary: tests/test_structured_masks.py)."""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from test_structured_grammar import verdict

from benchmarks.lib.schema_check import conforms
from core.structured.specs import json_schema_spec

MOMENT = datetime.datetime(2026, 12, 6, 14, 5, 9, 123456)
CASES = {
    "date": (["2026-12-06", "2024-02-29", "2023-01-31", "1999-11-30"],
             ["2026-13-01", "2026-04-31", "2026-02-30", "26-12-06", "2026-1-6", "2026-12-06T00:00:00"]),
    "time": ([MOMENT.time().isoformat(), "23:59:59", "00:00:00Z", "12:30:00+05:30", "08:00:00.5"],
             ["24:00:00", "12:60:00", "12:30", "12:30:00+5:30"]),
    "date-time": ([MOMENT.isoformat(), MOMENT.replace(tzinfo=datetime.UTC).isoformat(),
                   "2026-12-06T14:05:09Z"],
                  ["2026-12-06 14:05:09", "2026-12-06", "2026-12-06T25:00:00"]),
    "uuid": ([str(uuid.UUID(int=0)), str(uuid.uuid5(uuid.NAMESPACE_DNS, "cadence")).upper()],
             ["0000", "{12345678-1234-1234-1234-123456789012}", "12345678123412341234123456789012"]),
    "ipv4": (["192.168.0.1", "0.0.0.0", "255.255.255.255"], ["256.0.0.1", "1.2.3", "01.2.3.4", "1.2.3.4.5"]),
    "email": (["ann@example.com", "a.b+c_d@mail.example.co.uk"], ["ann", "ann@example", "@example.com"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_format_takes_what_pythons_parsers_read_and_refuses_the_rest(name):
    valid, invalid = CASES[name]
    schema = {"type": "string", "format": name}
    for text in valid:
        assert schema_verdict(schema, json.dumps(text)) == "complete", text
        assert conforms(text, schema), text
    for text in invalid:
        assert schema_verdict(schema, json.dumps(text)) == "rejected", text
        assert not conforms(text, schema), text


def test_formats_inside_objects_and_what_stays_an_annotation():
    event = {"type": "object", "properties": {"on": {"type": "string", "format": "date"},
                                              "id": {"type": "string", "format": "uuid"}}}
    assert schema_verdict(event, f'{{"on": "2026-12-06", "id": "{uuid.UUID(int=7)}"}}') == "complete"
    assert schema_verdict(event, '{"on": "tomorrow"}') == "rejected"
    assert schema_verdict({"type": "string", "format": "uri"}, '"not a uri"') == "complete"  # not enforced
    seven_digits = '"12:30:00.1234567"'  # beyond microseconds
    assert schema_verdict({"type": "string", "format": "time"}, seven_digits) == "rejected"
    bounded = {"type": "string", "format": "date", "maxLength": 4}  # lengths given: the format is not
    assert schema_verdict(bounded, '"abcd"') == "complete"


def schema_verdict(schema: dict, text: str) -> str:
    return verdict(json_schema_spec(schema), text)

