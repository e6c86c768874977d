#!/usr/bin/env bash
# The Java client's tests (the CI entry point, run by tests/suite/clients.rs): builds the library with its stubs
# generated from proto/ (build.sh), compiles the JUnit 4 tests and runs them with JUnit's console runner
# against real servers ($EXISTENCE_GATE_BIN, started and stopped by the tests themselves).
#
# Environment: EXISTENCE_GATE_BIN (the server binary, required). EXISTENCE_GATE_INTEROP_VENV is not used.
# Exit status: 0 when every test passed, 1 otherwise, 77 when the toolchain is missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/build
step_timeout=${JAVA_CLIENT_STEP_TIMEOUT:-300}
test_jars="/usr/share/java/junit4.jar /usr/share/java/hamcrest-core.jar /usr/share/java/netty-tcnative.jar"
# TLS: Debian's netty 4.1.48 has no ALPN in its JDK provider, so grpc-java's TLS needs netty's OpenSSL
# provider (netty-tcnative). Debian names its library libnetty-tcnative.so, but the library only loads
# under the name netty_tcnative (it checks its own file name), so the tests load a copy of it.
tcnative_so=/usr/lib/x86_64-linux-gnu/jni/libnetty-tcnative.so

for jar in $test_jars; do
    if [ ! -f "$jar" ]; then
        echo "SKIPPED: java client toolchain missing (install with .ci/install-interop): $jar not found (Debian packages junit4, libnetty-tcnative-java)"
        exit 77
    fi
done
if [ ! -f "$tcnative_so" ]; then
    echo "SKIPPED: java client toolchain missing (install with .ci/install-interop): $tcnative_so not found (Debian package libnetty-tcnative-jni)"
    exit 77
fi
if [ -z "${EXISTENCE_GATE_BIN:-}" ] || [ ! -x "$EXISTENCE_GATE_BIN" ]; then
    echo "FAIL: EXISTENCE_GATE_BIN must name the server binary (got '${EXISTENCE_GATE_BIN:-}')"
    exit 1
fi

# build.sh prints its own SKIPPED line and exits 77 when java, protoc or the grpc-java jars are missing.
# The conformance cases (ConformanceTest), shared by every client library.
export EXISTENCE_GATE_CONFORMANCE=$here/../conformance

timeout -k 10 "$step_timeout" "$here/build.sh"
status=$?
[ $status -ne 0 ] && exit $status

classpath="$build/existence-gate-client.jar:$(cat "$build/classpath")"
for jar in $test_jars; do classpath="$classpath:$jar"; done
rm -rf "$build/test-classes" "$build/jni"
mkdir -p "$build/test-classes" "$build/jni"
cp "$tcnative_so" "$build/jni/libnetty_tcnative.so"
find "$here/src/test/java" -name '*.java' >"$build/test-sources"
timeout -k 10 "$step_timeout" javac -Xlint:all -encoding UTF-8 --release 17 -d "$build/test-classes" \
    -cp "$classpath:/usr/share/java/error-prone-annotations.jar" @"$build/test-sources" || exit 1

# Test classes, by name (JUnitCore takes class names; each class starts its own servers).
classes=$(cd "$build/test-classes" && find . -name '*Test.class' | sed 's|^\./||; s|\.class$||; s|/|.|g' | sort)
# The tests stop their servers with SIGTERM, also from a shutdown hook when the run itself is stopped.
# shellcheck disable=SC2086
exec timeout -k 10 "$step_timeout" java -Djava.library.path="$build/jni" -cp "$build/test-classes:$classpath" org.junit.runner.JUnitCore $classes
