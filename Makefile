# dtimer: the two commands are `make run` and `make test`; `make test-all`
# also starts real database servers (Debian's apt) and runs every suite.
SHELL := /bin/bash
GO ?= go
BIN := bin/dtimer-server
PG := scripts/testdb/postgres.sh
TESTDB := scripts/testdb/all.sh

.PHONY: build run migrate test test-all test-cluster bench vet testdb-start testdb-stop clean

build: ## build bin/dtimer-server
	$(GO) build -o $(BIN) ./server/cmd/dtimer-server

run: build ## a single node on the embedded SQLite default, serving on :8080
	DTIMER_LOG_FORMAT=$${DTIMER_LOG_FORMAT:-console} ./$(BIN)

migrate: build ## create or upgrade the configured store's schema
	./$(BIN) migrate

test: ## unit, SQLite and end-to-end tests, and the benchmark's smoke run; needs nothing but Go
	cd server && $(GO) test -count=1 ./...
	cd benchmark && $(GO) test -count=1 ./...

vet: ## go vet, and gofmt must have nothing to say
	cd server && $(GO) vet ./...
	cd benchmark && $(GO) vet ./...
	@out=$$(gofmt -l server benchmark); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

testdb-start: ## start every test database server (installs what is missing; TESTDBS="postgres mysql" picks some)
	$(TESTDB) start

testdb-stop:
	$(TESTDB) stop

test-all: vet testdb-start ## every suite on every driver against real servers, with the race detector
	cd server && env DTIMER_TEST_REQUIRE_ALL_DRIVERS=1 $$(../$(TESTDB) env) \
		$(GO) test -race -count=1 -timeout 30m ./...
	cd benchmark && env $$(../$(TESTDB) env) $(GO) test -race -count=1 -timeout 20m ./...

test-cluster: ## the cluster chaos test alone: 3-4 nodes on one PostgreSQL, kill -9, SIGTERM, join
	$(PG) start
	cd server && DTIMER_TEST_POSTGRES_URL=$$(../$(PG) url) \
		$(GO) test -count=1 -v -run 'TestClusterChaos' ./e2e/

bench: testdb-start ## the full benchmark on every test database, River and the ceilings; writes benchmark/RESULTS.md (BENCH_FLAGS adds flags)
	env $$($(TESTDB) env) $(GO) run ./benchmark --markdown benchmark/RESULTS.md $(BENCH_FLAGS)

clean:
	rm -rf bin data .testdb
