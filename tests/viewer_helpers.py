"""Helpers of the viewer tests (no tests here): hostile data (payloads in every field a page shows, ids with
path tricks) as a real lake, and the headless browser: Debian's chromium and chromedriver through selenium,
with the browser's console log kept, so a test can see what the Content-Security-Policy refused."""

from __future__ import annotations

import contextlib
import shutil
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from trajlake.schemas.records import Episode, EpisodeReward, Policy, RewardSpecRow, Run, Task, TrainStep, Turn
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


# ---- train runs ---------------------------------------------------------------------------------------------
def train_lake_uri(tmp_path_factory) -> str:
    """A lake with real train runs, built once per session (about 15 s): 4 scripted-expert doors episodes
    (`expert`), an SFT on them (`sft`: 2 steps, a row and a checkpoint each) and a GRPO run from its last
    checkpoint (`grpo`: 2 iterations, collect runs `grpo/it-N` and held-out evals `grpo/eval-N` of 2 test tasks
    before the first and after each)."""
    from tests.helpers import expert_lake, small_cfg, tiny_model_dir, varied_spec
    from trajlake.train.loop import train

    path = tmp_path_factory.getbasetemp() / "train-lake"
    done = path / ".built"
    if not done.is_file():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        tiny = tiny_model_dir(tmp_path_factory)
        ckpt = str(path / "ckpt")
        with expert_lake(path / "lake", tiny) as lake:
            train(small_cfg(tiny, algo="sft", run_id="sft", sft_steps=2, minibatch_size=4, log_every=1,
                            checkpoint_every=1, sft_filter="run_id = 'expert'", checkpoint_dir=ckpt), lake)
            train(small_cfg("run:sft", run_id="grpo", tasks=2, samples=2, iterations=2, eval_every=1, eval_tasks=2,
                            minibatch_size=4, micro_batch=2, reward_spec=varied_spec(path), checkpoint_dir=ckpt), lake)
        done.touch()
    return str(path / "lake")


#: the hostile train lake's ids: a train run, its start and its checkpoint, two eval runs, its iteration's run
TRAIN_RUN = "../" + payload("train-run")
START, CHECKPOINT = payload("start-policy"), payload("checkpoint-policy")
EVAL_A, EVAL_B, ITERATION = payload("eval-a"), payload("eval-b"), TRAIN_RUN + "/it-1"
METRIC, CONFIG_KEY, CONFIG_VALUE = payload("metric"), payload("config-key"), payload("config-value")
TRAIN_TASKS = [payload("task-1"), payload("task-2")]
SPLIT = payload("split")


def build_hostile_train_lake(path: Path) -> None:
    """A lake at `path` holding a train run whose every id and text is a payload: its config (a key and values),
    a metric name, its policies, its iteration's collect run, and two eval runs (its start's and its
    checkpoint's) on the same two tasks of a payload split and env, with different results."""
    now = datetime.now(timezone.utc)
    eps = [Episode(f"it-{k}", run_id=ITERATION, policy_id=START, task_id=TRAIN_TASKS[k], env=ENV, status="ok",
                   success=k == 0, num_turns=1) for k in range(2)]
    for run, policy, wins in ((EVAL_A, START, (True, False)), (EVAL_B, CHECKPOINT, (False, True))):
        eps += [Episode(f"{run}-{k}", run_id=run, policy_id=policy, task_id=TRAIN_TASKS[k], env=ENV, status="ok",
                        success=won, num_turns=1) for k, won in enumerate(wins)]
    turns = [Turn(e.episode_id, 0, observation=payload("observation"), action_text="x") for e in eps]
    steps = [TrainStep(TRAIN_RUN, s, CHECKPOINT if s == 2 else None, 1,
                       {METRIC: s * 1.0, "reward_mean": 0.1 * s, "loss": 1.0 / s, "note": payload("metric-value")},
                       SPEC, ("it-0", "it-1", "gone")) for s in (1, 2)]
    with Lake.open(str(path)) as lk:
        lk.append({"tasks": [Task(t, ENV, split=SPLIT, instruction=payload("instruction")) for t in TRAIN_TASKS],
                   "runs": [Run(TRAIN_RUN, "train", config={CONFIG_KEY: CONFIG_VALUE, "lr": CONFIG_VALUE,
                                                            "model": payload("model"), "algo": "grpo"},
                                status=TEXT["status"], started_at=now, code_version=payload("code")),
                            Run(ITERATION, "collect", status="finished", started_at=now, parent_run_id=TRAIN_RUN),
                            Run(EVAL_A, "eval", status="finished", started_at=now),
                            Run(EVAL_B, "eval", status="finished", started_at=now + timedelta(seconds=1))],
                   "policies": [Policy(START), Policy(CHECKPOINT, run_id=TRAIN_RUN, step=2, parent_policy_id=START,
                                                      checkpoint_uri=payload("checkpoint-uri"))],
                   "reward_specs": [RewardSpecRow(SPEC, SPEC_NAME, {"allocation": {"strategy": "last_token"}}, now)],
                   "episodes": eps, "turns": turns, "train_steps": steps},
                  stage="train", run_id="hostile-train-fixture")


@contextlib.contextmanager
def served(lake):
    """The viewer serving `lake` on a free port for the block (a module fixture's body in each viewer test)."""
    from trajlake.view.server import Viewer

    v = Viewer(lake, port=0)
    v.start()
    try:
        yield v
    finally:
        v.close()
