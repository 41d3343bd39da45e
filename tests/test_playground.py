"""GET /playground in a real headless browser (Debian's chromium, driven by selenium) on a live gateway over
the real embedded Triton: the bundled sample is ranked through the page, the highlighted text is the
evidence the API returns, the page fetched nothing from elsewhere, and its screenshot is not blank.
The sample (a meeting written for keyrank) is held to what it is for on the real model (``Reranker.local``):
keyb2 and maxp rank the part holding the answer first with their evidence on it; firstp, reading only the
first 512 tokens, does not.
Without a key the page is open; with one it needs it, and so do its calls; off, it is a 404.
"""

from __future__ import annotations

import base64
import json
import re
import shutil

import httpx
import pytest
from live_gateway import live_gateway

from keyrank.api.playground import SAMPLE
from keyrank.config import Settings

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
NO_TRITON = "127.0.0.1:1"  # the page and its gate never call Triton
KEY = "playground-test-key"
MARK_RGB = (255, 213, 79)  # mark.evidence's background (--mark in the page's CSS)
RANK_TIMEOUT_S = 240  # four ~10k-character documents on a shared 2-core CPU Triton


def _basic(password: str, user: str = "me") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# --- the gate and the setting: real HTTP, no Triton needed ----------------------------------------------


def test_the_playground_is_off_with_the_setting_false(prepared_models):
    with live_gateway(Settings(model_dir=prepared_models, triton_url=NO_TRITON, playground=False)) as url:
        assert httpx.get(f"{url}/playground").status_code == 404
        assert httpx.get(f"{url}/playground/sample.json").status_code == 404
        assert httpx.get(f"{url}/playground/qmsum.json").status_code == 404
    with live_gateway(Settings(model_dir=prepared_models, triton_url=NO_TRITON)) as url:  # on by default
        page = httpx.get(f"{url}/playground")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_with_a_key_the_playground_needs_it(prepared_models):
    settings = Settings(model_dir=prepared_models, triton_url=NO_TRITON, api_key=KEY)
    with live_gateway(settings) as url:
        from keyrank.api.playground import qmsum_path

        for path in ("/playground", "/playground/sample.json", *(["/playground/qmsum.json"] if qmsum_path(settings).is_file() else [])):
            missing = httpx.get(url + path)
            assert missing.status_code == 401, path
            assert missing.json()["error"]["message"].startswith("missing API key")
            assert missing.headers["www-authenticate"].startswith("Basic ")  # a browser asks for it
            assert httpx.get(url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert httpx.get(url + path, headers=_basic("wrong")).json()["error"]["message"] == "invalid API key"
            assert httpx.get(url + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
            assert httpx.get(url + path, headers=_basic(KEY)).status_code == 200
        assert KEY not in httpx.get(f"{url}/playground", headers=_basic(KEY)).text  # the page never carries the key


def test_the_page_is_self_contained():
    """Nothing loaded from another origin: no src/href to a URL with a scheme, no @import, no font service."""
    from keyrank.api.playground import PAGE

    html = PAGE.read_text()
    for needle in ("src=\"http", "href=\"http", "src='http", "href='http", "@import", "url(http", "//cdn", "fonts.googleapis"):
        assert needle not in html, needle
    sample = json.loads(SAMPLE.read_text())
    assert sample["query"] and len(sample["documents"]) == 4 and sum(len(d["text"]) for d in sample["documents"]) > 25_000


# --- the sample shows what it is for: the answer deep in one part, found by keyb2 and maxp, not by firstp ---


def test_the_sample_is_written_for_keyrank():
    """A meeting written for the project (not evaluation data copied in), one "Speaker: words" line per turn."""
    sample = json.loads(SAMPLE.read_text())
    assert "written for keyrank" in sample["source"] and sample["license"].startswith("Apache-2.0")
    for document in sample["documents"]:
        lines = document["text"].split("\n")
        assert len(lines) > 40 and all(re.match(r"[A-Z][a-z]+: \S", line) for line in lines), document["id"]
    assert 4_000 <= sum(len(d["text"].split()) for d in sample["documents"]) <= 6_000


@pytest.fixture(scope="module")
def local_reranker(prepared_models):
    from keyrank.reranker import Reranker

    with Reranker.local(prepared_models, threads=1) as reranker:
        yield reranker


@pytest.mark.timeout(300)
def test_keyb2_and_maxp_find_the_samples_answer_and_firstp_does_not(local_reranker, prepared_models):
    from tokenizers import Tokenizer

    sample = json.loads(SAMPLE.read_text())
    texts = [d["text"] for d in sample["documents"]]
    relevant = sample["relevant_document"]
    start = texts[relevant].index(sample["answer"])
    end = start + len(sample["answer"])
    # Deep in its part: more than one model input's worth of tokens before it.
    tokenizer = Tokenizer.from_file(str(prepared_models / "gateway" / "tokenizer.json"))
    assert len(tokenizer.encode(texts[relevant][:start], add_special_tokens=False).ids) > 512

    def rank(strategy: str):
        ranking = local_reranker.rank(sample["query"], texts, strategy=strategy)
        return ranking.results, next(r for r in ranking.results if r.index == relevant)

    for strategy in ("keyb2", "maxp"):
        results, found = rank(strategy)
        assert results[0].index == relevant, (strategy, [(r.index, r.score) for r in results])
        assert any(e.start < end and e.end > start for e in found.evidence), (strategy, found.evidence)
    results, missed = rank("firstp")
    assert results[0].index != relevant, [(r.index, r.score) for r in results]
    assert max(e.end for e in missed.evidence) < start  # what firstp read of the part stops before the answer


# --- the QMSum meeting, read at runtime from the evaluation data where it is present -------------------


def _config(page: str) -> dict:
    return json.loads(re.search(r"const CONFIG = (.*);\n", page).group(1))


def test_the_qmsum_meeting_is_read_from_the_evaluation_data(prepared_models, tmp_path):
    from keyrank.api.playground import QMSUM_QUERY, qmsum_path

    settings = Settings(model_dir=prepared_models, triton_url=NO_TRITON)
    if not qmsum_path(settings).is_file():
        pytest.skip(f"no QMSum data at {qmsum_path(settings)} (KEYRANK_EVAL_DATA_DIR)")
    assert not any(p.name.startswith("ES2009c") for p in SAMPLE.parent.iterdir())  # never copied into the package
    with live_gateway(settings) as url:
        assert _config(httpx.get(f"{url}/playground").text)["qmsumUrl"] == "/playground/qmsum.json"
        meeting = httpx.get(f"{url}/playground/qmsum.json").json()
        assert meeting["query"] == QMSUM_QUERY and len(meeting["documents"]) == 4 and meeting["relevant_document"] == 1
        assert meeting["documents"][1]["id"] == "ES2009c part 2: The conceived touch screen within the limited budget"
        assert meeting["documents"][0]["text"].startswith("Marketing: {vocalsound} That went well , thank you .\n")

    with live_gateway(settings.with_overrides(eval_data_dir=tmp_path)) as url:  # no data there: no choice, and a 404 saying why
        assert _config(httpx.get(f"{url}/playground").text)["qmsumUrl"] is None
        missing = httpx.get(f"{url}/playground/qmsum.json")
        assert missing.status_code == 404 and "KEYRANK_EVAL_DATA_DIR" in missing.json()["error"]["message"]


# --- the page in a browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver, condition, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)


def _rank_sample(driver, url: str, key: str | None = None):
    """Open the page, type the key if given, load the sample, press Rank; the page's status line after."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    if key is not None:
        driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "load-sample").click()
    _wait(driver, lambda d: d.find_element(By.ID, "status").text.startswith("sample"))
    assert driver.find_element(By.ID, "status").text.startswith("sample loaded"), driver.find_element(By.ID, "status").text
    driver.find_element(By.ID, "rank").click()
    _wait(driver, lambda d: d.find_element(By.ID, "status").text.startswith(("ranked", "HTTP", "request failed")),
          RANK_TIMEOUT_S)
    return driver.find_element(By.ID, "status")


@pytest.mark.triton
@pytest.mark.timeout(600)
def test_the_page_ranks_the_sample_and_highlights_the_evidence(browser, prepared_models, embedded_triton, tmp_path):
    from PIL import Image
    from selenium.webdriver.common.by import By

    sample = json.loads(SAMPLE.read_text())
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with live_gateway(settings) as url:
        status = _rank_sample(browser, f"{url}/playground")
        default = f"{settings.default_strategy} / {settings.default_selector}"
        assert status.text.startswith(f"ranked 4 documents with {default}"), status.text

        # What the API answers for the same request (the page asked for the evidence; here its text too).
        api = httpx.post(f"{url}/rerank", timeout=RANK_TIMEOUT_S, json={
            "query": sample["query"], "documents": sample["documents"],  # the page's request: the defaults
            "return_evidence": True, "return_documents": True}).json()
        top = api["results"][0]
        assert top["id"] == sample["documents"][sample["relevant_document"]]["id"]  # what the sample is for
        evidence = [e["text"] for e in sorted(top["evidence"], key=lambda e: e["start"])]
        assert evidence and all(evidence)

        # The ranking as the API gave it, the top document shown, its evidence highlighted, and nothing else.
        rows = browser.find_elements(By.CSS_SELECTOR, "#results li")
        assert [r.find_element(By.CLASS_NAME, "doc-id").text for r in rows] == [r["id"] for r in api["results"]]
        assert [float(r.find_element(By.CLASS_NAME, "score").text) for r in rows] == pytest.approx(
            [r["relevance_score"] for r in api["results"]], abs=1e-3)
        assert browser.find_element(By.ID, "document-title").text.startswith(f"#1 {top['id']}")
        marks = browser.execute_script(
            "return Array.from(document.querySelectorAll('#document mark.evidence'), m => m.textContent)")
        assert marks == evidence
        shown = browser.execute_script("return document.getElementById('document').textContent")
        assert shown == next(d["text"] for d in sample["documents"] if d["id"] == top["id"])

        # Coverage, when the results carry it; the timings bar has one segment per stage the API timed.
        if "read_tokens" in top:
            assert f"read {top['read_tokens']:,} of {top['document_tokens']:,} tokens" in rows[0].text
        stages = [s for s, ms in api["timings_ms"].items() if s != "total" and ms is not None]
        segments = browser.execute_script(
            "return Array.from(document.querySelectorAll('#timing-bar span'), s => [s.dataset.stage, s.getBoundingClientRect().width])")
        assert [s for s, _ in segments] == stages and sum(w for _, w in segments) > 100

        # The first evidence span was scrolled into view: inside the document pane and the window.
        visible = browser.execute_script("""
            const m = document.querySelector('#document mark.evidence').getBoundingClientRect();
            const pane = document.getElementById('document').getBoundingClientRect();
            return m.height > 0 && m.top >= pane.top - 1 && m.top <= pane.bottom && m.top >= 0 && m.top < window.innerHeight;""")
        assert visible

        # Works offline: every resource the page loaded came from the gateway itself.
        origins = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
        assert set(origins) <= {url}, origins

        shot = tmp_path / "playground.png"
        assert browser.save_screenshot(str(shot))
    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 100, f"{shot}: {len(colours or [])} colours: blank?"
    highlighted = sum(n for n, rgb in colours if max(abs(a - b) for a, b in zip(rgb, MARK_RGB)) <= 6)
    assert highlighted > 200, f"{shot}: the evidence highlight is not on screen ({highlighted} pixels)"


def test_the_page_loads_the_qmsum_meeting_where_the_data_is(browser, prepared_models, tmp_path):
    from selenium.webdriver.common.by import By

    from keyrank.api.playground import QMSUM_QUERY, qmsum_path

    settings = Settings(model_dir=prepared_models, triton_url=NO_TRITON)
    if not qmsum_path(settings).is_file():
        pytest.skip(f"no QMSum data at {qmsum_path(settings)} (KEYRANK_EVAL_DATA_DIR)")
    with live_gateway(settings) as url:
        browser.get(f"{url}/playground")
        browser.find_element(By.ID, "load-qmsum").click()
        _wait(browser, lambda d: d.find_element(By.ID, "status").text.startswith("sample loaded: 4 documents"))
        assert browser.find_element(By.ID, "query").get_attribute("value") == QMSUM_QUERY
        assert "QMSum" in browser.find_element(By.ID, "sample-about").text
    with live_gateway(settings.with_overrides(eval_data_dir=tmp_path)) as url:  # no data there
        browser.get(f"{url}/playground")
        assert not browser.find_element(By.ID, "load-qmsum").is_displayed()
        assert browser.find_element(By.ID, "load-sample").is_displayed()


@pytest.mark.triton
@pytest.mark.timeout(600)
def test_with_a_key_the_page_sends_it(browser, prepared_models, embedded_triton):
    """The browser gets the page with the key (as Basic's password); the page's calls send the key typed in."""
    from selenium.webdriver.common.by import By

    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url, api_key=KEY)
    with live_gateway(settings) as url:
        page = url.replace("http://", f"http://me:{KEY}@") + "/playground"
        browser.get(page)
        assert browser.find_element(By.ID, "key-row").is_displayed()
        # The browser resends the Basic credentials (the sample loads), but /rerank takes only the Bearer key:
        # without the key in the field the page's ranking is refused, and the page says so.
        refused = _rank_sample(browser, page)
        assert refused.text.startswith("HTTP 401: "), refused.text
        assert refused.get_attribute("class") == "error"
        status = _rank_sample(browser, page, key=KEY)
        assert status.text.startswith("ranked 4 documents"), status.text
        assert browser.find_elements(By.CSS_SELECTOR, "#document mark.evidence")
