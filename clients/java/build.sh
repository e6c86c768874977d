#!/usr/bin/env bash
# Builds the Java client: generates the grpc-java stubs from proto/ (protoc + Debian's grpc-java plugin),
# compiles them and the library against Debian's jars (/usr/share/java) and packages
#   clients/java/build/existence-gate-client.jar   (library + stubs)
#   clients/java/build/classpath                   (the runtime jars it needs, ':'-separated)
# No Maven or network needed. Exits 77 with a SKIPPED line when the toolchain is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$here/build
step_timeout=${BUILD_STEP_TIMEOUT:-300}

# The runtime jars (the same set as tests/interop/run.sh's java_jars).
runtime_jars="grpc-api grpc-core grpc-context grpc-stub grpc-protobuf grpc-protobuf-lite grpc-netty protobuf guava
    perfmark-api geronimo-annotation-1.3-spec netty-buffer netty-codec netty-codec-http netty-codec-http2
    netty-codec-socks netty-common netty-handler netty-handler-proxy netty-resolver netty-transport
    netty-transport-native-unix-common"

missing() {
    local tool jar
    for tool in java javac jar protoc timeout; do
        command -v "$tool" >/dev/null || { echo "$tool not found"; return; }
    done
    [ -x /usr/bin/grpc_java_plugin ] || { echo "/usr/bin/grpc_java_plugin not found"; return; }
    for jar in $runtime_jars; do
        [ -f "/usr/share/java/$jar.jar" ] || { echo "/usr/share/java/$jar.jar not found"; return; }
    done
}

what=$(missing)
if [ -n "$what" ]; then
    echo "SKIPPED: java client toolchain missing (install with .ci/install-interop): $what"
    exit 77
fi

classpath=$(for jar in $runtime_jars; do printf '/usr/share/java/%s.jar:' "$jar"; done)
classpath=${classpath%:}
# Annotations grpc-java's classes refer to: needed by javac's lint only, never at run time.
# Without them javac warns about grpc-java's class files, so warnings only fail the build when they are there.
compile_only= werror=
if [ -f /usr/share/java/error-prone-annotations.jar ]; then
    compile_only=:/usr/share/java/error-prone-annotations.jar werror=-Werror
fi
rm -rf "$build/gen" "$build/classes" "$build/stub-classes"
mkdir -p "$build/gen" "$build/classes" "$build/stub-classes"

timeout -k 10 "$step_timeout" protoc -I "$root/proto" \
    --plugin=protoc-gen-grpc-java=/usr/bin/grpc_java_plugin \
    --java_out="$build/gen" --grpc-java_out="$build/gen" \
    "$root/proto/existence/v1/existence.proto"

# Generated code is compiled on its own, without lint (its warnings are protoc's, not ours).
find "$build/gen" -name '*.java' >"$build/gen-sources"
timeout -k 10 "$step_timeout" javac -nowarn -encoding UTF-8 --release 17 -d "$build/stub-classes" \
    -cp "$classpath" @"$build/gen-sources"

find "$here/src/main/java" -name '*.java' >"$build/sources"
timeout -k 10 "$step_timeout" javac -Xlint:all $werror -encoding UTF-8 --release 17 -d "$build/classes" \
    -cp "$build/stub-classes:$classpath$compile_only" @"$build/sources"

cp -r "$build/stub-classes/." "$build/classes/"
timeout -k 10 "$step_timeout" jar --create --file "$build/existence-gate-client.jar" -C "$build/classes" .
printf '%s\n' "$classpath" >"$build/classpath"
echo "built $build/existence-gate-client.jar"
