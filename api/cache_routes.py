"""The prefix cache's flush over HTTP: SGLang's GET/POST /flush_cache and vLLM's POST
/reset_prefix_cache, one operation answered by the scheduler (procs/cache_flush.py).

What clients use them for: a cold cache between benchmark runs (SGLang's bench_serving
`--flush-cache` posts /flush_cache first), and after changing what cached KV would mean.

* 200 `{"flushed": true, "freed_pages": N}` when every live replica's cache is now empty.
* 400 (as SGLang answers) while a request runs or waits on any replica, naming each busy replica;
  nothing is flushed then, and the requests carry on.
* 503 when the engine does not answer within the info timeout, or its scheduler has not reported
  for 5 s (the tokenizer answers that at once).
With an API key they need it, like the /v1/ routes: a flush costs every later request its hits.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.client_errors import ClientError
from api.errors import INVALID_REQUEST, SERVER_ERROR, error_object
from api.json_response import JSONResponse

FLUSH_PATHS = ("/flush_cache", "/reset_prefix_cache")


def cache_routes(server: Any) -> list[Route]:
    """The routes, answered through `server` (an api.server.ApiServer)."""

    async def flush(request: Request) -> Response:
        try:
            answer = await server.client.flush_cache(server.config.info_timeout_s)
        except ClientError as e:
            why = f"the engine did not answer the flush: {e}"
            return JSONResponse(error_object(why, SERVER_ERROR), 503)
        if not answer.flushed:
            why = answer.error or "the prefix cache was not flushed"
            kind = SERVER_ERROR if answer.status >= 500 else INVALID_REQUEST
            return JSONResponse(error_object(why, kind), answer.status)
        return JSONResponse({"flushed": True, "freed_pages": answer.freed_pages})

    return [Route("/flush_cache", flush, methods=["GET", "POST"]),
            Route("/reset_prefix_cache", flush, methods=["POST"])]

