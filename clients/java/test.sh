#!/usr/bin/env bash
# The Java client's tests (the CI entry point, run by tests/suite/clients.rs), with Maven offline against
# Debian's Maven repository (/usr/share/maven-repo; maven-settings-debian.xml), in a local repository of
# its own (a temporary directory):
#   1. `mvn install` of pom.xml with the profile debian: the stubs generated from proto/ by protoc and
#      Debian's grpc-java plugin, the library compiled with -Xlint:all -Werror, the JUnit 4 tests run by
#      surefire against real servers ($EXISTENCE_GATE_BIN, started and stopped by the tests themselves),
#      the jar and its pom installed;
#   2. installed as a user installs it: a project of its own (src/it/consumer) depends on
#      io.existencegate:existence-gate-client by its coordinates, is built offline from that local
#      repository, and its program calls a gate through the library and the stubs of its jar, on the
#      runtime classpath Maven resolves from the installed pom.
#
# Environment: EXISTENCE_GATE_BIN (the server binary, required); JAVA_CLIENT_STEP_TIMEOUT (seconds per
# step, default 300). EXISTENCE_GATE_INTEROP_VENV is not used.
# Exit status: 0 when everything passed, 1 otherwise, 77 when the toolchain is missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
step_timeout=${JAVA_CLIENT_STEP_TIMEOUT:-300}
repo=/usr/share/maven-repo
# TLS: Debian's netty 4.1.48 has no ALPN in its JDK provider, so grpc-java's TLS needs netty's OpenSSL
# provider (netty-tcnative); the profile debian of pom.xml gives the tests its jar and a copy of its library.
tcnative_so=/usr/lib/x86_64-linux-gnu/jni/libnetty-tcnative.so
# What the build resolves from Debian's repository, by the package that installs it there (the rest comes
# with these packages): the plugins pom.xml names, the libraries, the tests' JUnit and netty-tcnative.
needed="org/apache/maven/plugins/maven-resources-plugin/3.3.0:libmaven-resources-plugin-java
    org/apache/maven/plugins/maven-compiler-plugin/3.10.1:libmaven-compiler-plugin-java
    org/apache/maven/plugins/maven-surefire-plugin/2.22.3:libsurefire-java
    org/apache/maven/plugins/maven-jar-plugin/3.3.0:libmaven-jar-plugin-java
    org/apache/maven/plugins/maven-install-plugin/3.1.0:libmaven-install-plugin-java
    org/apache/maven/plugins/maven-antrun-plugin/3.1.0:libmaven-antrun-plugin-java
    org/codehaus/mojo/build-helper-maven-plugin/3.3.0:libbuild-helper-maven-plugin-java
    org/codehaus/mojo/exec-maven-plugin/3.1.0:libexec-maven-plugin-java
    io/grpc/grpc-netty/1.41.3:libgrpc-java
    com/google/protobuf/protobuf-java/3.21.12:libprotobuf-java
    com/google/api/grpc/proto-google-common-protos/debian:libgoogle-common-protos-java
    com/google/code/gson/gson/debian:libgoogle-gson-java
    org/codehaus/mojo/animal-sniffer-annotations/debian:libanimal-sniffer-java
    org/apache/geronimo/specs/geronimo-annotation_1.3_spec/1.3:libgeronimo-annotation-1.3-spec-java
    com/google/errorprone/error_prone_annotations/2.18.0:liberror-prone-java
    junit/junit/4.13.2:junit4
    io/netty/netty-tcnative/2.0.28.Final:libnetty-tcnative-java"

missing() {
    local tool entry
    for tool in java javac mvn protoc timeout; do
        command -v "$tool" >/dev/null || { echo "$tool not found (Debian packages default-jdk-headless, maven, protobuf-compiler)"; return; }
    done
    [ -x /usr/bin/grpc_java_plugin ] || { echo "/usr/bin/grpc_java_plugin not found (Debian package protobuf-compiler-grpc-java-plugin)"; return; }
    [ -f "$tcnative_so" ] || { echo "$tcnative_so not found (Debian package libnetty-tcnative-jni)"; return; }
    for entry in $needed; do
        [ -d "$repo/${entry%%:*}" ] || { echo "$repo/${entry%%:*} not found (Debian package ${entry##*:})"; return; }
    done
}
what=$(missing)
if [ -n "$what" ]; then
    echo "SKIPPED: java client toolchain missing (install with .ci/install-interop): $what"
    exit 77
fi
if [ -z "${EXISTENCE_GATE_BIN:-}" ] || [ ! -x "$EXISTENCE_GATE_BIN" ]; then
    echo "FAIL: EXISTENCE_GATE_BIN must name the server binary (got '${EXISTENCE_GATE_BIN:-}')"
    exit 1
fi
EXISTENCE_GATE_BIN=$(cd "$(dirname "$EXISTENCE_GATE_BIN")" && pwd)/$(basename "$EXISTENCE_GATE_BIN")
export EXISTENCE_GATE_BIN
# The conformance cases (ConformanceTest), shared by every client library (pom.xml names the same directory).
export EXISTENCE_GATE_CONFORMANCE=$here/../conformance

work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-java-client.XXXXXX")
gate_pid=
cleanup() {
    if [ -n "$gate_pid" ] && kill -0 "$gate_pid" 2>/dev/null; then
        kill -TERM "$gate_pid" 2>/dev/null
        wait "$gate_pid" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

step() { printf '\n=== %s\n' "$*"; }
# Offline (-o): aether.offline.protocols=file lets the file: repository of the settings through, and
# nothing else. -B -ntp: plain logs.
mvn_offline() {
    timeout -k 10 "$step_timeout" mvn -o -B -ntp -s "$here/maven-settings-debian.xml" -Daether.offline.protocols=file \
        -Dmaven.repo.local="$work/m2" "$@"
    local status=$?
    [ $status -eq 124 ] && echo "TIMEOUT after ${step_timeout}s: mvn $*"
    return $status
}

# The tests stop their servers with SIGTERM, also from a shutdown hook when the run itself is stopped.
step "mvn -o -Pdebian install: stubs from proto/, compile (-Xlint:all -Werror), JUnit tests, jar, install"
# target/ is removed by hand: maven-clean-plugin does not resolve from Debian's repository (Maven adds
# plexus-utils 1.1 to its dependencies, a version Debian does not ship).
rm -rf "$here/target"
(cd "$here" && mvn_offline -Pdebian install) || { echo "FAIL: mvn install of the client"; exit 1; }

step "a project of its own depends on io.existencegate:existence-gate-client: mvn -o verify, a call to a gate"
cp -r "$here/src/it/consumer" "$work/consumer"
# A gate (the conformance one: namespace users).
source "$EXISTENCE_GATE_CONFORMANCE/start-gate.sh"
start_conformance_gate "$work/gate.log" || exit 1
(cd "$work/consumer" && mvn_offline verify -Dgate.addr="$addr") ||
    { echo "FAIL: a project depending on the installed client"; exit 1; }
echo "ok   the client installs with mvn install; a project depending on it builds offline and calls a gate"
