# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# `make demo-ssh` is the multi-node demo (two loopback sshd nodes; needs openssh-server).
# `make demo-slurm` runs it through a throw-away local Slurm (needs slurmctld, slurmd, munge).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
export DS_BUILD_OPS := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install dev test lint typecheck docs pytest demo-warmup demo demo-moe demo-fsdp demo-ssh \
	demo-slurm screenshot clean

# Login-node install: the tuner alone (no torch, no GPU).
install:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e .

# Development install: test tools plus the CPU training stack (torch 2.13.0 CPU, DeepSpeed
# without building GPU ops), torch pinned so nothing pulls another build, and the pinned
# torchtitan release, the tests' oracle for what tune renders for it (tests/test_torchtitan_oracle.py
# is skipped without it, so a `make test` without it would not check torchtitan's parsing).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test,train,docs,titan]'
	touch $(STAMP)

dev: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The documentation site (docs/, Sphinx + MyST) into docs/_build/html, offline. Every warning is
# an error, a broken link between pages or to a heading included; the references are generated
# from the code as it builds.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -q -W --keep-going -n -b html docs docs/_build/html

# The suite starts `tune` and the stand-ins as subprocesses about a thousand times: with bytecode
# writing off in the environment (PYTHONDONTWRITEBYTECODE) each start compiles the package again
# (about 0.1 s), so the tests turn it back on for themselves; __pycache__ is ignored by git.
pytest: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -q --durations=25

test: lint typecheck docs pytest

# The demos' warm-up: one untimed 1-step run of the workload. DeepSpeed compiles its CPU comm op on
# first use (~45 s, cached in ~/.cache/torch_extensions), which must not land in a trial. A build
# killed there leaves a lock every later DeepSpeed start waits on forever: the check before the
# run stops with tune run's preflight line instead (tuner.cli.lockcheck, exit 2).
DEMO_WARMUP := results/.demo-warmup
demo-warmup: $(STAMP)
	$(PY) -m tuner.cli.lockcheck --name "make demo-warmup"
	mkdir -p $(DEMO_WARMUP)
	printf '%s\n' '{"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,' \
	  '"zero_optimization": {"stage": 0},' \
	  '"optimizer": {"type": "Adam", "params": {"lr": 0.0001, "torch_adam": true}}}' \
	  > $(DEMO_WARMUP)/ds_config.json
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/torchrun --nproc_per_node 2 \
	  --master_addr 127.0.0.1 --master_port 29499 workloads/gpt_deepspeed.py \
	  --deepspeed_config $(DEMO_WARMUP)/ds_config.json --num-layers 1 --hidden-size 64 \
	  --num-attention-heads 2 --seq-length 32 --vocab-size 128 --train-iters 1 \
	  > $(DEMO_WARMUP)/warmup.log 2>&1 || { tail -20 $(DEMO_WARMUP)/warmup.log; exit 1; }

# The demo: a short cluster profile (GEMM and gloo collective speeds, results/clusters/), the
# framework probe (the study's own launch at 1 and 4 layers on a few configs, one job), then a
# real DeepSpeed study on this machine's CPUs (studies/demo.yaml, 2 ranks), resumed from
# results/demo/study.db when run again, then its leaderboard, best ds_config and report, how
# far each trial was from what the models with the probe predicted (tools/probe_check.py), and
# where the results are and what to type next.
demo: demo-warmup
	$(VENV)/bin/tune profile --study demo --warmup 2 --repeats 5
	$(VENV)/bin/tune profile --study demo --probe
	$(VENV)/bin/tune run --study demo
	$(VENV)/bin/tune leaderboard --study demo --all
	$(VENV)/bin/tune best --study demo --emit ds-config
	$(VENV)/bin/tune report --study demo
	$(PY) tools/probe_check.py --study demo
	@echo "demo done: the report is results/demo/report.html (open it in a browser)."
	@echo "Next: source .venv/bin/activate, then tune leaderboard --study demo (or best,"
	@echo "report); for your own cluster, README.md's 'A study for your cluster'."

# The MoE demo (studies/demo-moe.yaml): the GPT's MLPs are DeepSpeed-MoE layers (4 experts,
# top-2); expert parallelism ep 1 and 2 x micro-batch 1 and 2 trained for real on the same 2 CPU
# ranks after the same cluster profile, then the leaderboard (ep column), best ds_config, report.
demo-moe: demo-warmup
	$(VENV)/bin/tune profile --study demo-moe --warmup 2 --repeats 5
	$(VENV)/bin/tune profile --study demo-moe --probe
	$(VENV)/bin/tune run --study demo-moe
	$(VENV)/bin/tune leaderboard --study demo-moe --all
	$(VENV)/bin/tune best --study demo-moe --emit ds-config
	$(VENV)/bin/tune report --study demo-moe
	$(PY) tools/probe_check.py --study demo-moe

# The FSDP2 demo (studies/demo-fsdp.yaml, docs/torchtitan.md): the small GPT on fully_shard (and
# parallelize_module at tp 2) on 2 CPU ranks over gloo, launched as torchtitan 0.3.0's trainer
# would be (workloads/gpt_fsdp2.py reads its options and prints its metric line); tp, micro-batch,
# checkpointing and resharding searched for real after the same cluster profile, then the
# leaderboard (measured and predicted step time and memory), the winner as torchtitan's command
# line, and the report.
demo-fsdp: $(STAMP)
	$(VENV)/bin/tune profile --study demo-fsdp --warmup 2 --repeats 5
	$(VENV)/bin/tune run --study demo-fsdp
	$(VENV)/bin/tune leaderboard --study demo-fsdp --all
	$(VENV)/bin/tune best --study demo-fsdp --emit torchtitan
	$(VENV)/bin/tune report --study demo-fsdp

# Retake the docs' full-page pictures of the report (docs/images/) with the test suite's browser:
# the demo's report (make demo first, when it has not run) and a generated 200-trial study's.
screenshot: $(STAMP)
	test -f results/demo/report.html || $(MAKE) demo
	$(PY) benchmarks/report_size.py --trials 200 --out results/report-large.html \
	  || test -f results/report-large.html  # over its time target on a busy machine: still drawn
	mkdir -p docs/images
	TUNER_SCREENSHOT="results/demo/report.html:docs/images/report-demo.png \
	  results/report-large.html:docs/images/report-large.png" $(VENV)/bin/pytest -q \
		tests/report/test_report_browser.py -k screenshots

# Multi-node over SSH (studies/demo-ssh.yaml): two sshd "nodes" on 127.0.0.2 and 127.0.0.3 with
# their own host keys and a fresh client key (tools/loopback_sshd.py, files in $(DEMO_SSH_DIR)),
# 2-node DeepSpeed trials through the SSH executor, the leaderboard; the nodes are always stopped
# (also when tune fails or on Ctrl-C), and the exit status is tune's.
DEMO_SSH_DIR := results/.demo-ssh
DEMO_SSH_ENV := TUNER_DEMO_ROOT="$(CURDIR)" TUNER_DEMO_SSH="$(abspath $(DEMO_SSH_DIR))"
demo-ssh: demo-warmup
	@trap 'rc=$$?; $(PY) tools/loopback_sshd.py stop --dir $(DEMO_SSH_DIR) || rc=1; exit $$rc' \
	  EXIT; trap 'exit 130' INT TERM; \
	$(PY) tools/loopback_sshd.py start --dir $(DEMO_SSH_DIR) --nodes 2 || exit 1; \
	$(DEMO_SSH_ENV) $(VENV)/bin/tune profile --study demo-ssh --probe || exit 1; \
	$(DEMO_SSH_ENV) $(VENV)/bin/tune run --study demo-ssh; rc=$$?; \
	$(DEMO_SSH_ENV) $(VENV)/bin/tune leaderboard --study demo-ssh --all; \
	$(DEMO_SSH_ENV) $(PY) tools/probe_check.py --study demo-ssh; \
	echo 'Next: $(DEMO_SSH_ENV) .venv/bin/tune best --study demo-ssh'; \
	echo '(every tune command on this study needs both variables; docs/guides/ssh.md)'; \
	exit $$rc

# Through Slurm (studies/demo-slurm.yaml): a throw-away local Slurm in $(DEMO_SLURM_DIR) (fresh
# each time: an old state directory recovers old jobs), one sbatch job per trial, the
# leaderboard; the cluster is always stopped and the exit status is tune's.
DEMO_SLURM_DIR := results/.demo-slurm
DEMO_SLURM_ENV := TUNER_DEMO_ROOT="$(CURDIR)" SLURM_CONF="$(abspath $(DEMO_SLURM_DIR))/slurm.conf"
demo-slurm: demo-warmup
	@trap 'rc=$$?; $(PY) tools/local_slurm.py stop --dir $(DEMO_SLURM_DIR) || rc=1; exit $$rc' \
	  EXIT; trap 'exit 130' INT TERM; \
	rm -rf $(DEMO_SLURM_DIR); \
	$(PY) tools/local_slurm.py start --dir $(DEMO_SLURM_DIR) --nodes 2 || exit 1; \
	$(DEMO_SLURM_ENV) $(VENV)/bin/tune run --study demo-slurm; rc=$$?; \
	$(DEMO_SLURM_ENV) $(VENV)/bin/tune leaderboard --study demo-slurm --all; \
	echo 'Next: TUNER_DEMO_ROOT="$(CURDIR)" .venv/bin/tune best --study demo-slurm --emit sbatch'; \
	echo '(every tune command on this study needs TUNER_DEMO_ROOT; docs/guides/slurm.md)'; \
	exit $$rc

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
