"""The viewer against hostile data (issue 23): a lake whose every stored field (ids, names, observation, reply,
action, info, instruction, error, spec ids and names) holds a script payload, and ids holding `../`, quotes,
`%`, `.`/`..` and control characters. Served and exported, in a real browser, every payload shows as text and
runs nothing; the policy (CSP) refuses what escaping would have let through; an export writes only inside
its folder, whatever the ids and whatever links are planted in the folder."""

from __future__ import annotations

import html
import json
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.viewer_helpers import (
    ENV,
    EP,
    EP_ISSUE,
    EP_PERCENT,
    INFO,
    POLICY,
    RUN,
    SPEC,
    SPEC_NAME,
    TASK,
    TEXT,
    UNKNOWN,
    Tags,
    build_hostile_lake,
    csp_refusals,
    open_browser,
    payload,
    served,
)
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Episode, Run
from trajlake.store import Lake
from trajlake.view.markup import CSP, CSP_HEADER, SCRIPT, page
from trajlake.view.pages import Links
from trajlake.view.server import Viewer, export_site


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "lake"
    build_hostile_lake(path)
    with Lake.open(str(path), read_only=True) as lk:
        yield lk


@pytest.fixture(scope="module")
def viewer(lake):
    with served(lake) as v:
        yield v


@pytest.fixture(scope="module")
def browser():
    b = open_browser()
    yield b
    b.quit()


# ---- the HTML itself (no browser) --------------------------------------------------------------------
def q(value: str) -> str:
    """A value as a URL carries it (one component)."""
    return quote(value, safe="")


def served_pages(viewer) -> dict[str, tuple[int, str]]:
    paths = ["/", f"/run?id={q(RUN)}", f"/compare?a={q(EP)}&b={q(EP_ISSUE)}&spec_b=plain"]
    paths += [f"/episode?id={q(e)}&spec={q(s)}" for e in (EP, EP_ISSUE, EP_PERCENT, "..") for s in ("plain", SPEC)]
    return {p: viewer.render(p) for p in paths}


def assert_own_markup(text: str, where: str) -> None:
    """A page holds its own script and no element or handler from data."""
    parsed = Tags(text)
    assert parsed.scripts == [SCRIPT] and parsed.tags.count("script") == 1, where
    assert not {"img", "svg", "iframe", "object", "embed", "base"} & set(parsed.tags), where
    assert not [a for a in parsed.attrs if a.startswith("on")], where


def test_every_served_page_holds_only_its_own_script(viewer):
    """Whatever the data, a page has one <script> (its own), no element and no event-handler attribute
    from a payload."""
    for path, (status, text) in served_pages(viewer).items():
        assert status == 200, path
        assert_own_markup(text, path)


def test_every_exported_page_holds_only_its_own_script(lake, tmp_path):
    export_site(lake, tmp_path / "site")
    pages = list((tmp_path / "site").rglob("*.html"))
    assert len(pages) == 1 + 1 + 4  # index, the run, its episodes
    for p in pages:
        text = p.read_text()
        assert_own_markup(text, p.name)
        assert f'content="{html.escape(CSP)}"' in text  # the policy travels with the file


def test_unknown_inputs_are_404s_that_echo_nothing_raw(viewer):
    """A hostile path, spec, run, episode or compare parameter: a 404 whose page escapes what it names
    (and does not repeat the path at all)."""
    u = q(UNKNOWN)
    for path in (f"/{u}", f"/run/{u}", f"/run?id={u}", f"/episode?id={u}", f"/?spec={u}",
                 f"/run?id={q(RUN)}&spec={u}", f"/compare?a={u}&b={u}",
                 f"/compare?a={q(EP)}&b={q(EP)}&spec_b={u}",
                 "/?spec='><svg onload=alert(3)>"):
        status, text = viewer.render(path)
        assert status == 404, path
        assert_own_markup(text, path)
    assert "unknown-path" not in viewer.render(f"/{u}")[1]  # the path is not echoed


def test_served_pages_send_the_policy(viewer):
    for path in ("", f"run?id={q(RUN)}", q(UNKNOWN)):
        try:
            with urllib.request.urlopen(viewer.url + path) as r:
                headers = r.headers
        except urllib.error.HTTPError as e:  # the 404 carries it too
            headers = e.headers
        assert headers["Content-Security-Policy"].startswith(CSP) and "frame-ancestors 'none'" in \
            headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"


# ---- in a browser ----------------------------------------------------------------------------------------
def assert_inert(browser, title: str) -> None:
    """Nothing ran: no alert open, no marker set, the title the page gave itself, nothing refused by the
    CSP (the payloads are text: there was nothing to refuse)."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        text = browser.switch_to.alert.text
    except NoAlertPresentException:
        text = None
    assert text is None, f"an alert opened: {text!r}"
    assert browser.execute_script("return window.__xss === undefined")
    assert browser.title == title
    assert csp_refusals(browser) == []


def body_text(browser) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.TAG_NAME, "body").text


def check_episode_page(browser, eid: str, title: str) -> None:
    assert_inert(browser, title)
    text = body_text(browser)
    for shown in (eid, ENV, TASK, POLICY, RUN, TEXT["ep_status"], TEXT["instruction"], TEXT["error"],
                  TEXT["observation"], TEXT["reply"], TEXT["action"], json.dumps(INFO["note"])[1:-1],
                  json.dumps(payload("info-key"))[1:-1]):
        assert shown in text


def check_run_page(browser) -> None:
    from selenium.webdriver.common.by import By

    assert_inert(browser, f"run {RUN}")
    text = body_text(browser)
    for shown in (RUN, ENV, POLICY, TASK, TEXT["ep_status"]):
        assert shown in text
    ids = {r.get_attribute("data-id") for r in browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")}
    assert ids == {EP, EP_ISSUE, EP_PERCENT, ".."}
    for a in browser.find_elements(By.CSS_SELECTOR, "th a[data-sort='reward']"):  # sorting, by the script
        a.click()
    rewards = [r.get_attribute("data-reward") for r in browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")]
    assert rewards == sorted(rewards, key=float)


def test_served_payloads_show_as_text_and_run_nothing(browser, viewer):
    from selenium.webdriver.common.by import By

    browser.get(viewer.url)
    assert_inert(browser, "trajlake runs")
    text = body_text(browser)
    for shown in (RUN, TEXT["kind"], TEXT["status"], TEXT["parent"], ENV, POLICY):
        assert shown in text
    browser.find_element(By.CSS_SELECTOR, "#runs a").click()  # the run's link, with its id quoted
    check_run_page(browser)
    assert SPEC_NAME in body_text(browser)
    for eid in (EP, EP_ISSUE, EP_PERCENT, ".."):  # each episode's link leads to that episode
        browser.get(viewer.url + f"run?id={q(RUN)}&spec=plain")
        browser.find_element(By.CSS_SELECTOR, f"a[title={json.dumps(eid)}]").click()
        check_episode_page(browser, eid, f"episode {eid}")
        assert SPEC_NAME in body_text(browser)
        browser.find_element(By.PARTIAL_LINK_TEXT, "spec-name").click()  # the hostile spec's link
        assert_inert(browser, f"episode {eid}")
        assert browser.find_element(By.ID, "reward").get_attribute("data-spec") == SPEC
    browser.get(viewer.url + f"compare?a={q(EP)}&b={q(EP_ISSUE)}&spec_b=plain")
    assert_inert(browser, f"compare {EP} {EP_ISSUE}")
    assert EP in body_text(browser) and EP_ISSUE in body_text(browser)
    u = q(UNKNOWN)
    for path in (u, f"run?id={u}", f"episode?id={u}", f"?spec={u}", f"compare?a={u}&b={u}",
                 f"compare?a={q(EP)}&b={q(EP)}&spec_b={u}", "?spec='><svg onload=alert(3)>"):
        browser.get(viewer.url + path)
        assert_inert(browser, "Not found")
        text = body_text(browser)
        if path == u:  # an unknown path: not echoed
            assert "no such page" in text and "unknown-path" not in text
        else:  # what was not found is named, as text (the message quotes it with repr)
            assert repr(UNKNOWN) in text or repr("'><svg onload=alert(3)>") in text


def test_exported_payloads_show_as_text_and_run_nothing(browser, lake, tmp_path):
    from selenium.webdriver.common.by import By

    out = tmp_path / "site"
    assert export_site(lake, out) == 4
    browser.get((out / "index.html").as_uri())
    assert_inert(browser, "trajlake runs")
    assert RUN in body_text(browser)
    browser.find_element(By.CSS_SELECTOR, "#runs a").click()  # the link names the encoded file, quoted again
    check_run_page(browser)
    for eid in (EP, EP_ISSUE, EP_PERCENT, ".."):
        browser.get((out / "runs" / Links.page_file(RUN)).as_uri())
        browser.find_element(By.CSS_SELECTOR, f"a[title={json.dumps(eid)}]").click()
        check_episode_page(browser, eid, f"episode {eid}")
        browser.find_element(By.LINK_TEXT, "runs").click()
        assert_inert(browser, "trajlake runs")


def test_the_policy_refuses_what_escaping_would_have_let_through(browser, tmp_path):
    """The second line: markup that did reach a page raw (here on purpose) runs nothing under the page's CSP."""
    raw = tmp_path / "raw.html"
    raw.write_text(page("raw", "<a href='#' onclick=\"window.__xss=1\" id=x>x</a>" + payload("raw")))
    browser.get(raw.as_uri())
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, "x").click()
    assert browser.execute_script("return window.__xss === undefined") and browser.title == "raw"
    assert csp_refusals(browser)  # refused, and said so


# ---- the export's files (no browser) ------------------------------------------------------------------------
HOSTILE_IDS = ["../../outside/escaped", "..", ".", "/abs/olute", "a\\b", "x'\"><", "\x01\n\t", "é/ü", "%2e%2e%2f",
               "A" * 400, "~user", ".hidden", "a" * 199 + "/"]


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_an_export_with_hostile_ids_writes_only_inside_its_folder(tmp_path):
    """Every written file lies in the (resolved) output folder, one page per id, however the ids read."""
    with Lake.open(str(tmp_path / "lake")) as lk:
        lk.append({"runs": [Run(r, "collect") for r in HOSTILE_IDS],
                   "episodes": [Episode(e, run_id=r) for e, r in zip(HOSTILE_IDS, reversed(HOSTILE_IDS), strict=True)]},
                  stage="collect", run_id="hostile-ids")
    fs = tmp_path / "fs"
    real = fs / "deep" / "real"
    real.mkdir(parents=True)
    (fs / "link").symlink_to(real, target_is_directory=True)  # the folder named through a link
    with Lake.open(str(tmp_path / "lake"), read_only=True) as lk:
        assert export_site(lk, fs / "link") == len(HOSTILE_IDS)
    written = files_under(fs) - {fs / "link"}
    assert written and all(p.resolve().is_relative_to(real) for p in written)
    assert all(p.is_relative_to(real) for p in tmp_path.rglob("*.html"))
    names = {p.name for p in (real / "episodes").iterdir()}
    assert names == {Links.page_file(i) for i in HOSTILE_IDS} and len(names) == len(HOSTILE_IDS)
    assert len(list((real / "runs").iterdir())) == len(HOSTILE_IDS)


def test_links_planted_in_the_folder_are_refused(lake, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "site"
    out.mkdir()
    (out / "episodes").symlink_to(outside, target_is_directory=True)
    with pytest.raises(TrajlakeError, match="leads outside the output folder"):
        export_site(lake, out)
    (out / "episodes").unlink()
    victim = outside / "victim.txt"
    victim.write_text("kept")
    (out / "index.html").symlink_to(victim)
    with pytest.raises(TrajlakeError, match="cannot write viewer page .*index.html: it is a link"):
        export_site(lake, out)
    assert victim.read_text() == "kept" and files_under(outside) == {victim}


def test_bad_export_arguments_are_one_line(lake, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrajlakeError, match="is a file; pass a folder"):
        export_site(lake, tmp_path / "file")
    with pytest.raises(TrajlakeError, match="no reward spec 'nope'"):
        export_site(lake, tmp_path / "site", spec="nope")
    assert not (tmp_path / "site").exists()


def test_a_page_that_fails_is_a_500_with_one_console_line(tmp_path, capfd):
    """A fault under a page (here the lake closed under the viewer): the browser gets a 500 that names
    nothing, the console one line, and the viewer keeps serving."""
    build_hostile_lake(tmp_path / "lake")
    lk = Lake.open(str(tmp_path / "lake"), read_only=True)
    v = Viewer(lk, port=0)
    v.start()
    try:
        lk.close()
        for _ in range(2):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(v.url + f"run?id={q(RUN)}")
            assert e.value.code == 500
            body = e.value.read().decode()
            assert "the page failed" in body and "outside" not in body and "Error" not in body
    finally:
        v.close()
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("trajlake view: ") for line in err), err


def test_blank_and_path_forms_of_the_routes(viewer):
    assert viewer.render("/?spec=")[0] == 200  # blank: the default spec
    assert viewer.render(f"/run/{q(RUN)}")[0] == 200  # the path form, as the report links
    assert viewer.render(f"/episode?id={q(EP_PERCENT)}")[0] == 200
    assert viewer.render(f"/episode?id={q('a/b%2F')}")[0] == 404  # not the decoded name


def test_requests_for_another_host_are_refused(viewer):
    """DNS rebinding: a page of evil.example re-pointed at 127.0.0.1 sends `Host: evil.example`; refused, and
    the refusal carries the policy too (http.server's own error page)."""
    import http.client

    port = viewer.server.server_address[1]
    for host, status in (("evil.example", 421), (f"evil.example:{port}", 421), ("[bad", 421), ("", 421),
                         (f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200), (f"[::1]:{port}", 200)):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.putrequest("GET", "/", skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        body = r.read().decode()
        assert r.status == status, host
        assert r.getheader("Content-Security-Policy") == CSP_HEADER and "evil" not in body
        conn.close()
