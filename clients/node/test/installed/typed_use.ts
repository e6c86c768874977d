// A TypeScript program using existence-gate-client as a service would, with credentials from its own
// @grpc/grpc-js. clients/node/test.sh type-checks it (tsc --strict) in a fresh project that installed the
// packed client: it passes only when the package's index.d.ts is shipped and its grpc-js types resolve.
import { credentials } from '@grpc/grpc-js';
import { Found, GateClient, GatedReader, MISSING, status, type MayExistAnswer, type SourceResult } from 'existence-gate-client';

const client = new GateClient(['gate-a:50051', 'gate-b:50051'], {
  namespace: 'users',
  credentials: credentials.createInsecure(),
  coalesceWindowMs: 0.2,
});

async function lookup(key: string): Promise<boolean> {
  const answer: MayExistAnswer = await client.mayExist(key, { deadlineMs: 100 });
  return answer.mayExist;
}

async function load(key: string | Buffer | Uint8Array): Promise<SourceResult<{ name: string }>> {
  return String(key) === 'user:1' ? Found({ name: 'one' }) : MISSING;
}

const reader = new GatedReader(client, load);
async function name(key: string): Promise<string | undefined> {
  const row = await reader.get(key);
  return row?.name;
}

const seq: Promise<number> = client.add(['user:1']);
const unavailable: number = status.UNAVAILABLE;
export { lookup, name, seq, unavailable };
