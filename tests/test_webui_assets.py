"""The web UI's assets and how the server ships them (no browser needed): served at ``/`` from the
package, with a Content-Security-Policy that lets the page reach only this server; every module it
imports is shipped; nothing in them names another host; the run's flow document for the graph."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import anyio
from flowkernel.server.webui import ASSETS, CONTENT_SECURITY_POLICY

from tests.server_support import serving

ROOT = Path(__file__).resolve().parent.parent
# An XML namespace is a name, not an address the browser fetches.
NAMESPACES = {"http://www.w3.org/2000/svg"}


VENDOR = ASSETS / "vendor"


def test_the_assets_live_inside_the_package() -> None:
    assert ASSETS == ROOT / "kernel" / "server" / "static"
    assert {"index.html", "app.js", "style.css", "favicon.svg"} <= {p.name for p in ASSETS.iterdir()}


def test_every_module_and_file_the_page_loads_is_shipped_and_every_shipped_file_is_used() -> None:
    index = (ASSETS / "index.html").read_text(encoding="utf-8")
    loaded = set(re.findall(r'(?:src|href)="([^"#:]+)"', index))
    assert {"app.js", "style.css", "favicon.svg"} <= loaded
    pending = [name for name in loaded if name.endswith(".js")]
    while pending:
        module = pending.pop()
        assert (ASSETS / module).is_file(), f"index.html or a module imports {module}, which is not shipped"
        for target in re.findall(r'^import .*? from "\./([^"]+)";$', (ASSETS / module).read_text(encoding="utf-8"),
                                 flags=re.M | re.S):
            if target not in loaded:
                loaded.add(target)
                pending.append(target)
    shipped = {str(p.relative_to(ASSETS)) for p in ASSETS.rglob("*") if p.is_file()}
    assert loaded <= shipped
    licenses = {str(p.relative_to(ASSETS)) for p in VENDOR.iterdir() if not p.name.endswith(".js")}
    assert shipped - loaded - {"index.html"} - licenses == set(), "shipped but never loaded"


def test_vendored_modules_are_the_registrys_files_unchanged_with_their_licenses() -> None:
    """Each third-party module is the file its README names, digest and all, and its license ships with it."""
    readme = (VENDOR / "README.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"^\| `([^`]+\.js)` \|.*\| ([0-9a-f]{64}) \|$", readme, flags=re.M))
    assert set(listed) == {p.name for p in VENDOR.glob("*.js")} == {"marked.esm.js", "purify.es.js"}
    for name, digest in listed.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    assert "Permission is hereby granted, free of charge" in (VENDOR / "marked.LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in (VENDOR / "dompurify.LICENSE").read_text(encoding="utf-8")
    assert "Mozilla Public License" in (VENDOR / "dompurify.LICENSE-MPL").read_text(encoding="utf-8")


def test_no_asset_names_another_host() -> None:
    # The vendored modules are checked by digest above (their comments name their projects' homes).
    for path in ASSETS.iterdir():
        if path.is_dir():
            continue
        text = path.read_text(encoding="utf-8")
        urls = set(re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s\"')]*", text)) - NAMESPACES
        assert not urls, f"{path.name} names {sorted(urls)}"
        assert "@import" not in text and "@font-face" not in text, path.name


def test_the_ui_is_served_at_the_root_with_a_policy_that_keeps_it_on_this_server(tmp_path: Path) -> None:
    with serving(str(tmp_path / "runs.db")) as live, live.client() as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="app.js"></script>' in page.text
        assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "connect-src 'self'" in CONTENT_SECURITY_POLICY and "default-src 'none'" in CONTENT_SECURITY_POLICY
        script = http.get("/app.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        for module in ("vendor/marked.esm.js", "vendor/purify.es.js", "markdown.js"):
            got = http.get(f"/{module}")
            assert got.status_code == 200 and "javascript" in got.headers["content-type"], module
            assert got.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert http.get("/style.css").headers["content-type"].startswith("text/css")
        # The API's routes are matched before the UI's mount; what neither has is a 404 problem.
        assert http.get("/api/v1/runs").json() == {"items": [], "nextCursor": None}
        missing = http.get("/nothing-here.js")
        assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
        assert http.get("/api/v1/nothing-here").headers["content-type"] == "application/problem+json"
        unknown_command = http.post("/api/v1/runs/run_x/rewind", json={})
        assert unknown_command.status_code == 404, unknown_command.text
        assert unknown_command.json()["detail"] == "no such endpoint: POST /api/v1/runs/run_x/rewind"


def test_a_runs_flow_document_is_served_for_its_graph(tmp_path: Path) -> None:
    with serving(str(tmp_path / "runs.db")) as live, live.client() as http:
        flow = live.kernel.load_flow(ROOT / "flows" / "hello.json")
        snap = anyio.run(live.kernel.run, flow, {"name": "Ada"})
        got = http.get(f"/api/v1/runs/{snap.runId}/flow")
        assert got.status_code == 200, got.text
        assert got.json() == flow.document
        assert got.content.decode() == flow.canonical  # the stored bytes its flowHash is computed from
        unknown = http.get("/api/v1/runs/run_nope/flow")
        assert unknown.status_code == 404 and "run_nope" in unknown.json()["detail"]
        assert "/api/v1/runs/{runId}/flow" in http.get("/api/v1/openapi.json").json()["paths"]
