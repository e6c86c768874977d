// The client's side of coalescing: 64 concurrent callers, each with one mayExist in flight, against a gate
// of its own (a separate process, from EXISTENCE_GATE_BIN); prints this process's CPU per lookup beside the
// lookups per second, as `cargo bench --bench load -- callers` does for the Rust client and
// clients/go/bench_test.go for Go. Run from clients/node: `EXISTENCE_GATE_BIN=... node bench/coalesced.js`.
'use strict';
const { startServer, usersClient } = require('../test/server.js');

const CALLERS = 64;
const LOOKUPS = Number(process.env.BENCH_LOOKUPS || 200000);

async function run(client, keys, lookups) {
  let next = 0;
  let failed = 0;
  const caller = async () => {
    while (next < lookups) {
      const key = keys[next++ % keys.length];
      try {
        await client.mayExist(key);
      } catch {
        failed++;
      }
    }
  };
  await Promise.all(Array.from({ length: CALLERS }, caller));
  if (failed > 0) throw new Error(`${failed} lookups failed`);
}

async function main() {
  const server = await startServer();
  const client = usersClient([server.address]);
  try {
    const keys = Array.from({ length: 4096 }, (_, i) => `bench-${i}`);
    await run(client, keys, 10000); // connections and batches warm
    const before = client.stats();
    const cpu = process.cpuUsage();
    const started = process.hrtime.bigint();
    await run(client, keys, LOOKUPS);
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    const used = process.cpuUsage(cpu);
    const after = client.stats();
    const perLookupUs = (used.user + used.system) / LOOKUPS;
    const keysPerCall = (after.batched_keys - before.batched_keys) / (after.gate_calls - before.gate_calls);
    console.log(`node ${process.version}, ${CALLERS} callers, ${LOOKUPS} coalesced lookups: ` +
      `${perLookupUs.toFixed(2)} µs of client CPU per lookup, ${keysPerCall.toFixed(1)} keys per call, ` +
      `${Math.round(LOOKUPS / seconds)} lookups/s`);
  } finally {
    client.close();
    await server.stop();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
