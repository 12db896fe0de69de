# The README's two commands, `make demo` and `make test`, and their helpers.
# Both install missing Debian packages first, then configure and build in build/.
BUILD    ?= build
PYTHON   ?= /usr/bin/python3
JOBS     ?= $(shell nproc)
WERROR   ?= OFF
CUDA     ?= AUTO
CMAKE_FLAGS ?=

.PHONY: all deps configure build install-python dumps test test-cpp test-python demo figures data bench clean format

# The dumps of the committed models are generated, not committed: the first 128 Fashion-MNIST test
# images through each model in data/models/, on the CPU in a few seconds (python/make_dumps.py);
# the first 64 for the 197-token vit14-* models. A model whose weights are not there has no dump.
MODELS := $(wildcard data/models/*.h5)
DUMPS  := $(patsubst data/models/%,data/dumps/%,$(MODELS))

all: build

deps:
	@scripts/install-deps.sh all

$(BUILD)/build.ninja:
	@scripts/install-deps.sh build
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DATTNSCOPE_WERROR=$(WERROR) -DATTNSCOPE_CUDA=$(CUDA) $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The Python module attnscope (and attnscope_dump beside it) into the user site-packages of
# /usr/bin/python3 (docs/python.md).
install-python: build
	cmake --install $(BUILD) --component python

dumps: $(DUMPS)

data/dumps/%.h5: data/models/%.h5 python/make_dumps.py
	$(PYTHON) python/make_dumps.py --models $< --out data/dumps --images 128

# Make picks the rule with the shorter stem: this one for the vit14-* models.
data/dumps/vit14-%.h5: data/models/vit14-%.h5 python/make_dumps.py
	$(PYTHON) python/make_dumps.py --models $< --out data/dumps --images 64

test: deps build dumps
	@$(MAKE) --no-print-directory test-cpp test-python

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-python:
	ATTNSCOPE=$(abspath $(BUILD))/apps/attnscope $(PYTHON) -m pytest -q python/tests

demo: deps build dumps
	@PYTHON=$(PYTHON) BUILD=$(BUILD) scripts/demo.sh

figures: deps build dumps
	@PYTHON=$(PYTHON) BUILD=$(BUILD) scripts/figures.sh

data: deps build
	@PYTHON=$(PYTHON) BUILD=$(BUILD) scripts/make-data.sh

bench: deps build
	@PYTHON=$(PYTHON) BUILD=$(BUILD) bench/run_comparison.sh

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
