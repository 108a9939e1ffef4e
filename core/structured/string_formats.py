"""JSON schema `format`s of strings that are enforced: each as a pattern of the regex subset
(core/structured/regex.py), anchored, over the string's content.

As pydantic writes them for `datetime.date`, `datetime.time`, `datetime.datetime`, `uuid.UUID`,
`IPv4Address` and `EmailStr`. Dates take the days each month can have (29 February in every year);
times and date-times take seconds' fractions and an offset (`Z` or +hh:mm) where given; an email is
local@domain with a dot in the domain (the common shape, not all of RFC 5321). Other formats
(`uri`, `hostname`, ...) stay annotations, as before. Used by core/structured/grammar.py.
"""

from __future__ import annotations

_DAY_OF_MONTH = ("((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
                 "|02-(0[1-9]|1[0-9]|2[0-9]))")
_DATE = r"[0-9]{4}-" + _DAY_OF_MONTH
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX = "[0-9a-fA-F]"

FORMAT_PATTERNS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "uuid": f"^{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}$",
    "ipv4": rf"^({_OCTET}\.){{3}}{_OCTET}$",
    "email": r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,8}$",
}
