#!/usr/bin/env bash
# The ThreadSanitizer tier: builds the CLI, the thread-pool and HTTP-server tests with
# -fsanitize=thread (DSV4_TSAN) into build-tsan/ and runs the tests where our threads meet:
# the thread pool, HttpServer's start and stop, the scheduler's pausing of a job nobody reads
# (SchedulerPause: its thread against a consumer), the prefix cache's file writer thread
# (SnapshotWriter, PrefixCacheDisk), and `dsv4 serve` driven by the official clients
# (Server.*: the scheduler thread, the HTTP threads, the signal watcher, mpirun ranks; not
# Server.speculative, the longest, whose drafts run on the same scheduler thread). Any report
# fails the test (halt_on_error). Reports from inside uninstrumented system libraries are
# suppressed in tests/tsan.supp, each with the reason.
# The forward pass and the per-token sampling are built without TSan instrumentation (dsv4_hot in
# CMakeLists.txt): instrumented they made the server tests 5-8x slower, and the compute tests are
# left out here (a run of 144 of them fully instrumented, session 28, reported nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/fetch-tokenizer.sh build/deps/tokenizer
scripts/fetch-node-clients.sh build/deps/clients
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Release -DDSV4_TSAN=ON -DDSV4_CUDA=OFF -DDSV4_CUDA_EMU=OFF >/dev/null
cmake --build build-tsan -j"$(nproc)" --target dsv4 test_threads test_http_server test_server_scheduler test_prefix_cache
export DSV4_TOKENIZER_DIR="$PWD/build/deps/tokenizer" DSV4_TOKENIZER="$PWD/build/deps/tokenizer/tokenizer.json"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
scripts/seed-ctest-costs.sh tests/ctest-costs-tsan.txt build-tsan
cd build-tsan && ctest --output-on-failure -j"$(nproc)" --timeout 900 -R '^ThreadPool\.|^HttpServer\.|^Scheduler|^SnapshotWriter\.|^PrefixCacheDisk\.|^Server\.' \
  -E '^Server\.speculative$'
