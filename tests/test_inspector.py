"""The inspector page at ``/inspect``: its routes and keys, and the page itself driven in a real browser (headless
Chromium from Debian's package, through Playwright's Python client) against a running proxy on the fake decoder.

The browser tests skip, saying why, where Chromium or Playwright is absent; `.ci/run` installs both, and CI counts
a skip as a failure."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from adapters.decoders import FakeBackend
from serving.app import create_app, serve_in_thread
from serving.inspector import STATIC
from serving.settings import ProxySettings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEY = "sk-inspector-test"


def app_for(tokenizer, **settings):
    return create_app(ProxySettings(served_model_name="fake", method="bm25", ratio=2.0, **settings),
                      backend=FakeBackend(tokenizer, model_name="fake", reply="Lisbon"))


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# -- routes and keys (no browser) --------------------------------------------------------------------------------
def test_page_and_assets_are_served_from_this_origin_only(smol_tokenizer):
    c = TestClient(app_for(smol_tokenizer))
    page = c.get("/inspect")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(r.startswith("/inspect/") or r.startswith("data:") for r in refs), refs  # no CDN
    js = c.get("/inspect/inspect.js").text
    assert "http://" not in js and "https://" not in js
    for name in ("inspect.js", "inspect.css"):
        assert c.get(f"/inspect/{name}").content == (STATIC / name).read_bytes()
    examples = c.get("/inspect/examples").json()["examples"]
    assert len(examples) >= 4 and all(ex["question"] and ex["documents"] for ex in examples)
    cfg = c.get("/inspect/config").json()
    assert cfg["method"] == "bm25" and "sentinel" in cfg["methods"] and cfg["model"] == "fake" and not cfg["auth"]


def test_same_keys_as_the_api(smol_tokenizer):
    c = TestClient(app_for(smol_tokenizer, api_keys=[KEY]), raise_server_exceptions=False)
    for path in ("/inspect", "/inspect/inspect.js", "/inspect/config", "/inspect/examples"):
        r = c.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic "), path  # a login prompt
        assert c.get(path, headers=basic("anyone", KEY)).status_code == 200
        assert c.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.get(path, headers=basic("anyone", "wrong")).status_code == 401
    assert c.post("/inspect/compress", json={"question": "q?", "documents": ["a. b."]}).status_code == 401
    assert c.get("/v1/models").headers["www-authenticate"] == "Bearer"  # the API's own challenge is unchanged
    assert c.get("/v1/models", headers=basic("", KEY)).status_code == 200  # what the browser sends after login
    for bad in ("Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode(), "Digest x"):
        assert c.get("/v1/models", headers={"Authorization": bad}).status_code == 401


def test_off_with_a_flag(smol_tokenizer):
    c = TestClient(app_for(smol_tokenizer, inspector=False), raise_server_exceptions=False)
    for path in ("/inspect", "/inspect/config", "/inspect/inspect.js"):
        assert c.get(path).status_code == 404
    assert c.post("/inspect/compress", json={}).status_code == 404
    assert ProxySettings.model_fields["inspector"].default is True


# -- the page in a browser ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture(scope="module")
def served(smol_tokenizer):
    with serve_in_thread(app_for(smol_tokenizer)) as base:
        yield base


def open_page(browser, base: str, **context):
    ctx = browser.new_context(viewport={"width": 1200, "height": 900}, **context)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(base + "/inspect")
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)
    return page, errors


def run_and_wait(page, timeout_ms: int = 60_000) -> None:
    page.wait_for_selector("#results[data-done='1'], #status.error", timeout=timeout_ms)
    assert page.get_attribute("#status", "class") != "error", page.inner_text("#status")


def highlighted(page) -> set[tuple[int, int]]:
    pairs = page.eval_on_selector_all(".s[data-kept='1']", "els => els.map(e => [e.dataset.p, e.dataset.s])")
    return {(int(p), int(s)) for p, s in pairs}


def api_kept(base: str, question: str, documents: list, compression: dict) -> tuple[set, dict]:
    block = httpx.post(base + "/inspect/compress", json={"question": question, "documents": documents,
                                                         "compression": compression}, timeout=60).json()["compression"]
    ex = block["explanation"][0]
    return {(p["index"], s["sentence"]) for p in ex["passages"] for s in p["sentences"] if s["kept"]}, block


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_page_highlights_what_the_api_explains(browser, served, tmp_path):
    page, errors = open_page(browser, served)
    examples = httpx.get(served + "/inspect/examples").json()["examples"]
    for i, method, ratio in [(0, "bm25", "5"), (3, "sentinel", "8"), (4, "none", "1")]:
        page.select_option("#example", str(i))
        page.select_option("#method", method)
        page.fill("#ratio", ratio)
        page.click("#run")
        page.wait_for_selector("#results[data-done='1']", timeout=60_000)
        want, block = api_kept(served, examples[i]["question"], examples[i]["documents"],
                               {"method": method, "ratio": float(ratio)})
        assert highlighted(page) == want, (method, i)
        assert page.inner_text("#answer-compressed") == "Lisbon" and page.inner_text("#answer-full") == "Lisbon"
        assert f"{block['tokens_before']} → {block['tokens_after']}" in page.inner_text("#summary")
        dropped = page.eval_on_selector_all(".s[data-kept='0']", "els => els.length")
        assert len(want) + dropped == sum(len(p["sentences"]) for p in block["explanation"][0]["passages"])
    shot = tmp_path / "inspector.png"
    page.screenshot(path=str(shot), full_page=True)
    w, h = png_size(shot)
    assert w == 1200 and h > 900 and shot.stat().st_size > 30_000  # the whole page, not a blank one
    assert not errors, errors


def test_the_page_works_by_keyboard(browser, served):
    page, errors = open_page(browser, served)
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "example"  # the first control
    page.keyboard.press("ArrowDown")  # picks the first bundled example
    assert page.input_value("#question")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "question"
    page.keyboard.press("Enter")  # submits the form
    run_and_wait(page)
    assert highlighted(page)
    for _ in range(12):  # on past the form's controls into the results: each passage takes focus
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.classList.contains('passage')"):
            break
    label = page.evaluate("() => document.activeElement.getAttribute('aria-label')")
    assert label and label.startswith("Passage 1:")
    assert not errors, errors


def test_a_thousand_sentence_context_renders_without_freezing(browser, served):
    """1,000 sentences in 20 passages: compressed, explained and drawn; the page stays responsive."""
    page, errors = open_page(browser, served)
    words = ["river", "castle", "engine", "garden", "violin", "harbor", "glacier", "lantern", "meadow", "comet"]
    passages = [f"# Passage {p}\n" + " ".join(
        f"The {words[s % 10]} number {p * 50 + s} stood near the {words[(s * 7 + p) % 10]} in year {1900 + s}."
        for s in range(50)) for p in range(20)]
    page.fill("#question", "Which castle stood near the glacier in year 1937?")
    page.fill("#passages", "\n\n".join(passages))
    page.uncheck("#answer")
    page.fill("#ratio", "10")
    t0 = time.perf_counter()
    page.click("#run")
    run_and_wait(page)
    total_s = time.perf_counter() - t0
    assert page.get_attribute("#results", "data-sentences") == "1000"
    render_ms = float(page.get_attribute("#results", "data-render-ms"))
    t1 = time.perf_counter()
    page.keyboard.press("Tab")  # the page answers input at once after drawing
    input_s = time.perf_counter() - t1
    print(json.dumps({"sentences": 1000, "render_ms": render_ms, "click_to_done_s": round(total_s, 3),
                      "input_after_s": round(input_s, 3)}))
    assert render_ms < 500 and input_s < 1.0 and total_s < 30
    assert len(highlighted(page)) >= 1
    assert not errors, errors


def test_a_key_protected_proxy_in_the_browser(browser, smol_tokenizer):
    """A Basic login (any user, the key as password) opens the page, and the page's API calls carry it."""
    with serve_in_thread(app_for(smol_tokenizer, api_keys=[KEY])) as base:
        page, errors = open_page(browser, base, http_credentials={"username": "me", "password": KEY})
        page.select_option("#example", "1")
        page.click("#run")
        run_and_wait(page)
        assert highlighted(page) and page.inner_text("#answer-compressed") == "Lisbon"
        assert not errors, errors
