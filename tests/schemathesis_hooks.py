"""Hooks for the property-based run of the API's document (tests/test_openapi_document.py), loaded by
``schemathesis run`` from its config file.

Each list's ``cursor`` has a format of its own in the document (``runs-cursor``, …): only the server
can make one (it signs them with its store's secret), so a cursor drawn at random is rightly refused.
Here the test takes the server's part and makes valid cursors of each list, with the secret of the
store named by ``FLOWKERNEL_TEST_STORE``, so that what the document calls valid the server accepts.
The coverage phase draws boundary strings from a parameter's pattern and not from its format: a
list's refusal (400 ``invalid-cursor``) of such a string, which no server made, is what the document
says and is not counted; a refusal of a cursor the server did make still is.
"""

from __future__ import annotations

import os
import string
from typing import Any

import schemathesis
from flowkernel.server.pagination import SECRET_NAME, Cursors
from flowkernel.server.problems import ApiProblem
from flowkernel.store.open import open_store
from hypothesis import strategies as st

_store = open_store(os.environ["FLOWKERNEL_TEST_STORE"])
try:
    _cursors = Cursors(_store.secret(SECRET_NAME))
finally:
    _store.close()

for _kind in ("runs", "events", "agent-runs", "messages", "tool-calls"):
    schemathesis.openapi.format(f"{_kind}-cursor", st.integers(1, 2**40).map(
        lambda key, kind=_kind: str(_cursors.encode(kind, key))))
schemathesis.openapi.format("flows-cursor", st.text(string.ascii_letters + "-_", min_size=1, max_size=30).map(
    lambda name: str(_cursors.encode("flows", name))))


def _made_by_the_server(cursor: str) -> bool:
    for kind in ("runs", "events", "agent-runs", "messages", "tool-calls"):
        try:
            _cursors.decode(kind, cursor)
            return True
        except ApiProblem:
            pass
    try:
        _cursors.decode_name("flows", cursor)
        return True
    except ApiProblem:
        return False


@schemathesis.hook
def filter_failure(context: schemathesis.HookContext, failure: Any, case: schemathesis.Case,
                   response: schemathesis.Response) -> bool:
    cursor = (case.query or {}).get("cursor")
    refused_unmade = (type(failure).__name__ == "RejectedPositiveData" and response.status_code == 400
                      and b"/invalid-cursor" in response.content and isinstance(cursor, str)
                      and not _made_by_the_server(cursor))
    return not refused_unmade
