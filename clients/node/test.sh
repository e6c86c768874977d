#!/usr/bin/env bash
# Builds and tests the Node client library against real servers ($EXISTENCE_GATE_BIN), with Node's own test
# runner. CI runs `npm ci` here first (.ci/install-interop); without node_modules the run is SKIPPED (exit 77).
#
# "Building" a Node package made with @grpc/proto-loader is: copy proto/ into the package (the `prepare`
# script, as npm pack does) and load it, which generates the stubs at load time.
#
# Then it checks that the package installs the way npm packages do: `npm pack`, installed into a fresh project
# beside the project's own @grpc/grpc-js (a peer dependency): one copy of grpc-js in the tree, credentials made
# with it accepted, real calls answered, and the TypeScript declarations usable (tsc --strict); once with
# the tarball and the grpc-js the tests use, once with the directory (--install-links) and the oldest grpc-js
# the peer range accepts. npm installs with --prefer-offline (from npm's cache, filled by .ci/install-interop).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
step_timeout=${CLIENT_STEP_TIMEOUT:-300}

skip() {
    echo "SKIPPED: node client toolchain missing (install with .ci/install-interop): $1"
    exit 77
}
command -v node >/dev/null || skip "node not found"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$major" -ge 18 ] || skip "node $(node --version) is older than 18"
[ -d "$here/node_modules/@grpc/grpc-js" ] && [ -d "$here/node_modules/@grpc/proto-loader" ] ||
    skip "clients/node/node_modules is missing (npm ci in clients/node)"
[ -f "$here/node_modules/typescript/bin/tsc" ] && [ -d "$here/node_modules/@types/node" ] ||
    skip "clients/node/node_modules lacks its devDependencies typescript and @types/node (npm ci in clients/node)"
command -v npm >/dev/null || skip "npm not found"

bin=${EXISTENCE_GATE_BIN:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "FAIL: EXISTENCE_GATE_BIN must name the server binary (got '${bin}')" >&2
    exit 1
fi
export EXISTENCE_GATE_BIN=$bin

bounded() {
    timeout -k 10 "$step_timeout" "$@"
    local status=$?
    [ $status -eq 124 ] && echo "TIMEOUT after ${step_timeout}s: $*"
    return $status
}

cd "$here" || exit 1
# The proto the package ships (git-ignored copy of $root/proto), refreshed on every run.
bounded node scripts/copy-proto.js || exit 1
cmp -s "$root/proto/existence/v1/existence.proto" proto/existence/v1/existence.proto || {
    echo "FAIL: proto/ was not copied into the package" >&2
    exit 1
}
# Load the package: @grpc/proto-loader generates the stubs; a broken proto or package fails here.
bounded node -e '
  const c = require("./");
  const pkg = c.loadExistencePackage();
  for (const m of ["MayExist", "BatchMayExist", "Add", "RecordAbsent", "SubscribeInvalidations"]) {
    if (typeof pkg.ExistenceGate.service[m] !== "object") throw new Error("no stub for " + m);
  }
  console.log("stubs loaded from proto/: ExistenceGate with " + Object.keys(pkg.ExistenceGate.service).length + " methods");
' || exit 1

# Test files run in parallel (each starts its own server); the tests inside a file run in order.
bounded node --test --test-concurrency=4 test/*.test.js
status=$?
[ $status -eq 0 ] || echo "FAIL: node --test exited $status" >&2

# -- packaging: npm pack, installed into fresh projects beside the application's own @grpc/grpc-js -----------

failed_packaging=0
packaging_fail() {
    echo "FAIL: packaging: $1" >&2
    failed_packaging=1
}
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-client-node.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
npm_quiet=(--no-audit --no-fund --loglevel=error)

# try_installed NAME DESCRIPTION NPM-INSTALL-ARGUMENTS...: a fresh project (its own package.json, nothing of this
# repository on its module path) runs `npm install ARGUMENTS` (offline when npm's cache has everything, as after
# the npm ci of .ci/install-interop); then its tree must hold exactly one @grpc/grpc-js, app.js (the
# application: credentials from its grpc-js, real calls) must pass, and tsc --strict must accept typed_use.ts
# and report exactly the two errors of typed_misuse.ts against the installed declarations.
try_installed() {
    local name=$1 description=$2 started copies
    local app=$work/$name
    shift 2
    echo "== packaging: $description"
    started=$(date +%s)
    mkdir -p "$app"
    printf '{ "name": "fresh-%s", "version": "1.0.0", "private": true }\n' "$name" >"$app/package.json"
    if ! (cd "$app" && bounded npm install --prefer-offline "${npm_quiet[@]}" "$@" >"$work/install-$name.log" 2>&1); then
        cat "$work/install-$name.log" >&2
        packaging_fail "npm install $* failed in a fresh project"
        return
    fi
    copies=$(cd "$app" && find node_modules -path '*/@grpc/grpc-js/package.json' | sort)
    if [ "$(echo "$copies" | grep -c .)" -ne 1 ]; then
        (cd "$app" && npm ls --all @grpc/grpc-js) >&2
        packaging_fail "the fresh project holds $(echo "$copies" | grep -c .) copies of @grpc/grpc-js, not one: $(echo "$copies" | paste -sd' ')"
        return
    fi
    echo "   installed in $(($(date +%s) - started)) s: $(cd "$app" && node -p '["existence-gate-client", "@grpc/grpc-js"]
        .map((name) => `${name}@${require(`${name}/package.json`).version}`).join(" and ")')"
    cp test/installed/app.js test/installed/typed_use.ts test/installed/typed_misuse.ts "$app/"
    (cd "$app" && bounded node app.js "$here/test/server.js") || { packaging_fail "the installed package does not work ($name)"; return; }
    # The project's sources against the installed declarations (and the installed @grpc/grpc-js's); the
    # compiler and Node's types come from this package's devDependencies.
    (cd "$app" && bounded node "$here/node_modules/typescript/bin/tsc" --noEmit --strict --module node16 \
        --moduleResolution node16 --target es2022 --types node --typeRoots "$here/node_modules/@types" \
        typed_use.ts typed_misuse.ts) >"$work/tsc-$name.log" 2>&1
    if [ "$(grep -c 'error TS' "$work/tsc-$name.log")" -ne 2 ] ||
        ! grep -q '^typed_misuse.ts(5,.*error TS2561' "$work/tsc-$name.log" ||
        ! grep -q '^typed_misuse.ts(8,.*error TS2322' "$work/tsc-$name.log"; then
        cat "$work/tsc-$name.log" >&2
        packaging_fail "tsc: expected exactly the two errors of typed_misuse.ts against the installed index.d.ts ($name)"
        return
    fi
    echo "   typed: tsc --strict checks a program against the installed index.d.ts; $(($(date +%s) - started)) s in all"
}

echo "== packaging: npm pack"
started=$(date +%s)
tarball=
if bounded npm pack --json --pack-destination "$work" "${npm_quiet[@]}" >"$work/pack.json" 2>"$work/pack.log"; then
    tarball=$work/$(node -p 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))[0].filename' "$work/pack.json")
fi
if [ ! -f "$tarball" ]; then
    cat "$work/pack.log" >&2
    packaging_fail "npm pack failed"
# What the tarball holds, and what its package.json asks of the project that installs it.
elif ! bounded node -e '
  const fs = require("fs");
  const { execFileSync } = require("child_process");
  const [tarball, packJson] = process.argv.slice(1);
  const files = JSON.parse(fs.readFileSync(packJson, "utf8"))[0].files.map((f) => f.path);
  const problems = [];
  for (const f of ["package.json", "index.js", "index.d.ts", "README.md", "proto/existence/v1/existence.proto",
                   "lib/gate_client.js", "lib/gated_reader.js", "lib/proto.js"]) {
    if (!files.includes(f)) problems.push(`${f} is missing`);
  }
  for (const f of files) {
    if (/^(test|scripts|node_modules)\//.test(f)) problems.push(`${f} is shipped`);
  }
  const manifest = JSON.parse(execFileSync("tar", ["-xzOf", tarball, "package/package.json"], { encoding: "utf8" }));
  const peer = (manifest.peerDependencies || {})["@grpc/grpc-js"];
  if (!peer) problems.push("@grpc/grpc-js is not a peer dependency");
  else if (/^[=v\s]*\d+\.\d+\.\d+$/.test(peer)) problems.push(`the peer dependency on @grpc/grpc-js is exact (${peer}), not a range`);
  for (const field of ["dependencies", "optionalDependencies", "bundleDependencies", "bundledDependencies"]) {
    const deps = manifest[field] || {};
    if (Array.isArray(deps) ? deps.includes("@grpc/grpc-js") : "@grpc/grpc-js" in deps) {
      problems.push(`@grpc/grpc-js is in ${field}: the package would bring its own copy`);
    }
  }
  for (const script of ["preinstall", "install", "postinstall"]) {
    if ((manifest.scripts || {})[script]) problems.push(`an install script would run in the user project: ${script}`);
  }
  if (problems.length) {
    console.error("the package is not right:\n  " + problems.join("\n  "));
    process.exit(1);
  }
  console.log(`   ${require("path").basename(tarball)}: ${files.length} files, proto and index.d.ts included, ` +
    `@grpc/grpc-js a peer dependency (${peer})`);
' "$tarball" "$work/pack.json"; then
    packaging_fail "npm pack made a package that is not right (above)"
else
    echo "   packed in $(($(date +%s) - started)) s"
    # The application's grpc-js: the version the tests ran with; then the oldest the peer range accepts.
    current=$(node -p 'require("@grpc/grpc-js/package.json").version')
    floor=$(node -p 'require("./package.json").peerDependencies["@grpc/grpc-js"].match(/\d+\.\d+\.\d+/)[0]')
    try_installed tarball "the tarball in a fresh project with @grpc/grpc-js@$current" \
        "$tarball" "@grpc/grpc-js@$current"
    try_installed floor "the directory (npm install --install-links) in a fresh project with the oldest @grpc/grpc-js it accepts ($floor)" \
        --install-links "$here" "@grpc/grpc-js@$floor"
fi

if [ $failed_packaging -ne 0 ]; then
    [ $status -ne 0 ] || status=1
else
    echo "packaging: OK (npm pack installs beside the application's @grpc/grpc-js: one copy, typed)"
fi
exit $status
