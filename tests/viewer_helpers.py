"""Helpers of the viewer tests (no tests here): hostile data (payloads in every field a page shows, ids with
path tricks) as a real lake, and the headless browser: Debian's chromium and chromedriver through selenium,
with the browser's console log kept, so a test can see what the Content-Security-Policy refused."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from trajlake.schemas.records import Episode, EpisodeReward, Policy, RewardSpecRow, Run, Task, Turn
from trajlake.store import Lake


def payload(field: str) -> str:
    """Text that runs script, opens an alert or renames the page wherever it is not escaped (as text, in a
    quoted attribute of either quote, in a URL); `&amp;` shows whether it was escaped twice, and `$\\frac{$`
    stops matplotlib's math parser (the report's plot titles) where a label is not escaped for it."""
    return (f"{field}\"'><script>window.__xss='{field}';document.title='pwned'</script>"
            f"<img src=x onerror=\"window.__xss='{field}'\"><svg onload=alert('{field}')></title>&amp;$\\frac{{$")


RUN = "../../outside/" + payload("run")
EP = "../" + payload("episode")
EP_ISSUE = "x'><script>alert(4)</script>"  # the issue's own
EP_PERCENT = "a%2Fb%252F"  # a page named by encoding must not be found by a decoded name
SPEC, SPEC_NAME = payload("spec-id"), payload("spec-name")
TASK, ENV, POLICY = payload("task"), payload("env"), payload("policy")
INFO = {"note": payload("info"), payload("info-key"): 1}
TEXT = {"observation": payload("observation") + " é", "reply": payload("reply"), "action": payload("action"),
        "instruction": payload("instruction"), "error": payload("error"), "kind": payload("kind"),
        "status": payload("status"), "parent": payload("parent"), "ep_status": payload("ep-status")}
#: a path no page has, and query values no page knows
UNKNOWN = payload("unknown-path")


def hostile_episode(eid: str, turn_text: dict, reward: float) -> tuple[Episode, Turn, EpisodeReward]:
    ep = Episode(eid, run_id=RUN, policy_id=POLICY, task_id=TASK, env=ENV, group_id=payload("group"),
                 sample_index=0, status=TEXT["ep_status"], success=reward > 0, env_reward=reward, num_turns=1,
                 num_agent_tokens=1, error=TEXT["error"])
    turn = Turn(eid, 0, observation=turn_text["observation"], action_text=turn_text["reply"],
                action=turn_text["action"], format_ok=True, step_reward=reward, done=True, info=INFO,
                prompt_token_ids=(1, 2), response_token_ids=(3,))
    return ep, turn, EpisodeReward(SPEC, eid, total=reward)


def build_hostile_lake(path: Path) -> None:
    """A lake at `path` whose every stored text field holds a payload: one run of four episodes (ids above,
    one group) scored under the hostile spec and a plain one."""
    now = datetime.now(timezone.utc)
    eps, turns, rewards = zip(*(hostile_episode(e, TEXT, r) for e, r in
                                ((EP, 1.0), (EP_ISSUE, 0.0), (EP_PERCENT, 0.5), ("..", 0.25))), strict=True)
    with Lake.open(str(path)) as lk:
        lk.append({"tasks": [Task(TASK, ENV, split="train", instruction=TEXT["instruction"])],
                   "runs": [Run(RUN, TEXT["kind"], config={"note": payload("config")}, status=TEXT["status"],
                                started_at=now, parent_run_id=TEXT["parent"])],
                   "policies": [Policy(POLICY, run_id=RUN)],
                   # the plain spec is older: the hostile one is the default, the plain one's pages link to it
                   "reward_specs": [RewardSpecRow("plain", "plain", {"allocation": {"strategy": "last_token"}},
                                                  now - timedelta(hours=1)),
                                    RewardSpecRow(SPEC, SPEC_NAME, {"allocation": {"strategy": "last_token"}}, now)],
                   "episodes": list(eps), "turns": list(turns), "episode_rewards": list(rewards)},
                  stage="collect", run_id="hostile-fixture")


class Tags(HTMLParser):
    """The elements and attributes a browser's parser would see in a page (attribute values unescaped), and
    the text of its scripts."""

    def __init__(self, text: str):
        super().__init__()
        self.elements, self.scripts, self._in_script = [], [], False
        self.feed(text)

    @property
    def tags(self) -> list[str]:
        return [tag for tag, _ in self.elements]

    @property
    def attrs(self) -> list[str]:
        return [name for _, attrs in self.elements for name, _ in attrs]

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, attrs))
        self._in_script = tag == "script"

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)
            self._in_script = False


# ---- the browser ------------------------------------------------------------------------------------------


def open_browser():
    """A headless chromium; skips the calling test, saying why, where none is installed (CI installs one)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no browser: install Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def csp_refusals(browser) -> list[str]:
    """The console messages since the last call in which the browser refused something under the page's
    Content-Security-Policy (reading the log empties it)."""
    return [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
