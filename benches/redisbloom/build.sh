#!/usr/bin/env bash
# Builds RedisBloom 2.6.9 as a Redis module (redisbloom.so) for the RESP benchmarks' baseline
# (`cargo bench --bench load -- resp`), without its own build system (which fetches toolchains).
#
# RedisBloom is in no package registry these machines reach, so its source comes from a checkout:
#   SRC   a checkout of RedisBloom at tag v2.6.9, with its submodules deps/RedisModulesSDK (commit 7ba899d)
#         and deps/t-digest-c (commit 9dcd73d) checked out, as `git clone --recursive --branch v2.6.9` gives;
#   OUT   where to write redisbloom.so (default benches/redisbloom/redisbloom.so, ignored by git).
# The files and flags are those of RedisBloom's Makefile (its _SOURCES, CC_DEFS and CC_INCLUDES), at -O2 as
# a release build; cuckoo.c is included by cf.c. Load it with Debian's redis-server:
#   redis-server --port 6399 --loadmodule "$OUT" --save "" --appendonly no
set -euo pipefail
src=${1:?usage: build.sh SRC [OUT]}
out=${2:-$(cd "$(dirname "$0")" && pwd)/redisbloom.so}
cd "$src"
for need in src/rebloom.c deps/RedisModulesSDK/redismodule.h deps/t-digest-c/src/tdigest.c; do
    [ -f "$need" ] || { echo "$src/$need is missing: check out v2.6.9 with its submodules" >&2; exit 1; }
done
gcc -O2 -fPIC -shared -std=gnu99 -w \
    -D_GNU_SOURCE -DREDIS_MODULE_TARGET -DREDISMODULE_SDK_RLEC \
    -I. -Isrc -Ideps/RedisModulesSDK -Ideps -Ideps/murmur2 -Ideps/t-digest-c/src \
    deps/bloom/bloom.c deps/murmur2/MurmurHash2.c deps/rmutil/util.c \
    src/rebloom.c src/sb.c src/cf.c src/rm_topk.c src/rm_tdigest.c src/topk.c src/rm_cms.c src/cms.c \
    deps/t-digest-c/src/tdigest.c \
    -lm -o "$out"
echo "built $out"
