"""The HTTP API (DESIGN §10): routes, problems, auth, limits, pagination, response models, the event feed and stream, the web UI's assets; a thin face over run/'s Kernel that never starts an event loop of its own.

One module per job: ``app`` builds the application, ``problems`` turns errors into RFC 9457
responses, ``auth`` checks the bearer token, ``limits`` caps request bodies, ``headers`` adds the
headers every answer carries, ``pagination`` makes signed keyset cursors, ``views`` holds the request
and response models, ``document`` makes the OpenAPI document exact and ``docs_page`` serves it and
its offline docs page (``apidocs/``), ``runs``, ``execute`` (what leaves a run to the workers),
``agents`` and ``flows`` are the routes, ``feed`` and ``stream`` serve events as they are committed.
"""

from __future__ import annotations

from flowkernel.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
